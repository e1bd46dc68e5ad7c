"""Operators kiln adds to PyTorch (the `kiln::` namespace of `torch.ops`), called by compiled
graphs as extern kernels. `kiln::mm` (and its row-norm forms) and `kiln::conv` over weights
packed once, and `kiln::attention`, are defined in C++ by kiln's runtime
(kiln/native/src/kiln_runtime.cpp); here are their fake functions and direct calls
(native_ops.py) and the autotuner's and the passes' view of them (prepacked.py,
kiln_attention.py, kiln_depthwise.py, kiln_conv_gemm.py); the kernels themselves and their unit
are native's (kiln/native/kernels_unit.py). `kiln::philox_dropout` (dropout.py) is Python's, and the lowering turns it into loops.

Not a stage: passes insert calls to these operators, the autotuner times their implementations,
and the runtime calls them, so they live beside the stages and import none of them.
"""
