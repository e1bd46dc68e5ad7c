"""`kiln::mm` and `kiln::conv`, kiln's extern ops over frozen weights, as the autotuner and the
passes see them. The operators themselves (their schemas, every implementation, the packed forms
of weights) are C++ in kiln's runtime (kiln/native/src/kiln_runtime.cpp, docs/native.md).

A frozen weight reaches these ops as an ordinary strided tensor (a constant the frozen graph
computed once, kiln/runtime/frozen.py). The library layout an implementation wants (oneDNN's
blocked weights, MKL's packed GEMM weights, kiln's GEMM's panels, a contiguous transpose) is made
on the first call and kept by the runtime per weight and version: a weight changed in place is
packed again, a new weight object starts with no pack, and a freed weight's packs go.

`impl` names the implementation the autotuner chose for these shapes (kiln/autotune/gemm.py).
"""

from __future__ import annotations

import torch

from kiln import config
from kiln.externs import kiln_conv_gemm, kiln_depthwise
from kiln.native import libkiln

# kiln::mm's implementations, in order of preference when timings tie (kiln/autotune/choose.py):
# ATen's own call first, then its GEMM over a row-major [K, N] or a [N, K] copy of the weight,
# kiln's own GEMM (kiln/native/include/kiln_gemm.h, any post-op applied in its store), MKL's packed
# GEMM, oneDNN's (post-op inside).
MM_IMPLS = ("aten", "aten_kn", "aten_nk", "kiln", "mkl", "onednn")

# kiln's GEMM in bfloat16 fast math: a float32 product over bfloat16 panels of the weight and a
# bfloat16 copy of A, its sums, epilogue and output float32 (docs/gemm.md). Not among MM_IMPLS: its
# results are less precise, so it is never timed against the others; the setting backend.fp32_gemm
# asks for it, and then every float32 product gemm_prepack takes runs it.
BF16_MATH_IMPL = "kiln_bf16"
# The implementations that are kiln's own GEMM, whose products gemm_layer_norm fuses a norm into.
KILN_GEMM_IMPLS = ("kiln", BF16_MATH_IMPL)

# The values of backend.fp32_gemm (and kiln.compile's option fp32_gemm): how float32 products with
# a frozen weight multiply.
FP32_GEMM_MODES = ("fp32", "bf16")


def fp32_gemm() -> str:
    """The setting `backend.fp32_gemm`, checked: "fp32", or "bf16" for bfloat16 fast math.

        with kiln.config.patch({"backend.fp32_gemm": "bf16"}):
            fp32_gemm()  # "bf16"
    """
    value = config.backend.fp32_gemm
    if value not in FP32_GEMM_MODES:
        raise ValueError(f"setting backend.fp32_gemm (KILN_FP32_GEMM) must be one of {', '.join(FP32_GEMM_MODES)}; "
                         f"got {value!r}")
    return value

# kiln::conv's, in order of preference when timings tie, after "kiln" (TIES_TO in
# kiln/autotune/gemm.py): oneDNN with a blocked weight, ATen on channels-last data, ATen on the
# input as it arrives, kiln's own kernels (`kiln_conv_applies`).
CONV_IMPLS = ("onednn", "aten_channels_last", "aten", "kiln")

# The implementation the memory plan picks rather than the autotuner: oneDNN's convolution written
# over the added tensor, where that dies at the convolution with the result's layout
# (kiln/schedule/memory.py).
IN_PLACE_CONV_IMPL = "onednn_into_other"


def drop_packs(weight: torch.Tensor) -> None:
    """Drop `weight`'s packed forms (the autotuner's trial weights, once a question is answered)."""
    libkiln.drop_packs(weight)


def packed_bytes(weight: torch.Tensor) -> int:
    """Memory held by `weight`'s packed forms."""
    return libkiln.packed_bytes(weight)


def kiln_conv_applies(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation, groups: int) -> bool:
    """Whether kiln's own kernels run this convolution: a depthwise one (kiln_depthwise.py) or one
    whose windows do not overlap (kiln_conv_gemm.py, kiln's GEMM). The autotuner offers "kiln" for
    these only."""
    return (kiln_depthwise.applies(x, weight, groups)
            or kiln_conv_gemm.applies(x, weight, stride, padding, dilation, groups))
