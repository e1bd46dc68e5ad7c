"""Convolutions that are a matrix product, through kiln's own GEMM (kiln_gemm.h): those whose
windows do not overlap and need no padding. On channels-last data a 1x1 convolution of stride 1
is input [N*H*W, C] @ weight [C, K] = output [N*H*W, K], read and written where they lie; one
whose stride is its kernel size (a vision transformer's or ConvNeXt's patch embedding, ConvNeXt's
2x2 downsampling) or a 1x1 one of any stride (ResNet's downsampling shortcut) reads each input
pixel at most once, so its windows copied out as rows, [N*OH*OW, KH*KW*C], are at most the input's
size: the same product after that copy. `kiln::conv`'s "kiln" implementation for these
convolutions: the autotuner times it against oneDNN's and ATen's for each one and keeps the
fastest (kiln/autotune/gemm.py).

    unary(conv(x) + bias + other)  ==  GEMM(windows(x) [N*OH*OW, KH*KW*C], w as [KH*KW*C, K]) with bias,
                                       other as [N*OH*OW, K] and unary in its epilogue

(kiln/native/src/kiln_runtime.cpp `conv_gemm`); this module is the autotuner's view of what it takes.
"""

from __future__ import annotations

import torch

from kiln.native import kernels_unit


def applies(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation, groups: int,
            transposed: bool = False) -> bool:
    """Whether this convolution is a matrix product over windows that do not overlap: 2-d, one
    group, no padding, a 1x1 kernel (any stride) or a stride equal to the kernel's size (dilation
    1), float32 or bfloat16."""
    if transposed or x.dim() != 4 or weight.dim() != 4 or groups != 1 or tuple(padding) != (0, 0):
        return False
    if x.dtype != weight.dtype or x.dtype not in kernels_unit.DTYPES:
        return False
    kernel = tuple(weight.shape[2:])
    return kernel == (1, 1) or (tuple(stride) == kernel and tuple(dilation) == (1, 1))
