"""kiln's own depthwise convolution (kiln/native/include/kiln_depthwise.h), float32, channels-last:
`kiln::conv`'s "kiln" implementation for depthwise convolutions (kiln/native/src/kiln_runtime.cpp
`conv_depthwise`). The autotuner times it against oneDNN's and ATen's convolutions for each
depthwise convolution and keeps the fastest (kiln/autotune/gemm.py); this module is its view of
what the kernel takes.
"""

from __future__ import annotations

import torch


def applies(x: torch.Tensor, weight: torch.Tensor, groups: int, transposed: bool = False) -> bool:
    """Whether kiln's kernel runs this convolution: 2-d, float32, every channel its own group with
    one filter (weight [C, 1, KH, KW], groups = C)."""
    return (not transposed and x.dim() == 4 and weight.dim() == 4 and x.dtype == weight.dtype == torch.float32
            and weight.shape[1] == 1 and groups == x.shape[1] == weight.shape[0])
