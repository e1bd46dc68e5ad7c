"""Operators kiln adds to PyTorch (the `kiln::` namespace of `torch.ops`), called by compiled
graphs as extern kernels: `kiln::mm` and `kiln::conv` over weights packed once (prepacked.py);
`kiln::attention`, kiln's own attention kernel, defined in C++ by kiln's runtime
(kiln_attention.py, native_ops.py: its fake function); `kiln::philox_dropout`
(dropout.py), which the lowering turns into loops.

Not a stage: passes insert calls to these operators, the autotuner times their implementations,
and the runtime calls them, so they live beside the stages and import none of them.
"""
