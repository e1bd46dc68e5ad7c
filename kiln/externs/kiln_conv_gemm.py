"""Convolutions that are a matrix product, through kiln's own GEMM (kiln_gemm.py): those whose
windows do not overlap and need no padding. On channels-last data a 1x1 convolution of stride 1
is input [N*H*W, C] @ weight [C, K] = output [N*H*W, K], read and written where they lie; one
whose stride is its kernel size (a vision transformer's or ConvNeXt's patch embedding, ConvNeXt's
2x2 downsampling) or a 1x1 one of any stride (ResNet's downsampling shortcut) reads each input
pixel at most once, so its windows copied out as rows, [N*OH*OW, KH*KW*C], are at most the input's
size: the same product after that copy. `kiln::conv`'s "kiln" implementation for these
convolutions: the autotuner times it against oneDNN's and ATen's for each one and keeps the
fastest (kiln/autotune/gemm.py).

    unary(conv(x) + bias + other)  ==  kiln_gemm.mm(windows(x) [N*OH*OW, KH*KW*C], pack(w), K, bias, unary,
                                                    residual=other as [N*OH*OW, K], residual_first=True)
"""

from __future__ import annotations

import torch

from kiln.externs import kiln_gemm


def applies(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation, groups: int,
            transposed: bool = False) -> bool:
    """Whether this convolution is a matrix product over windows that do not overlap: 2-d, one
    group, no padding, a 1x1 kernel (any stride) or a stride equal to the kernel's size (dilation
    1), float32 or bfloat16."""
    if transposed or x.dim() != 4 or weight.dim() != 4 or groups != 1 or tuple(padding) != (0, 0):
        return False
    if x.dtype != weight.dtype or x.dtype not in kiln_gemm.DTYPES:
        return False
    kernel = tuple(weight.shape[2:])
    return kernel == (1, 1) or (tuple(stride) == kernel and tuple(dilation) == (1, 1))


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [K, C, KH, KW] as the GEMM's packed B [KH*KW*C, K], rows in the windows' order."""
    k, c, kh, kw = weight.shape
    return kiln_gemm.pack(weight.permute(2, 3, 1, 0).reshape(kh * kw * c, k))


def windows(x: torch.Tensor, kernel: tuple[int, int], stride) -> torch.Tensor:
    """Channels-last x's windows as rows [N*OH*OW, KH*KW*C]: a view for a 1x1 kernel of stride 1,
    else a copy (each input pixel in it at most once)."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw) = kernel, stride
    oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
    pixels = x.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1)
    rows = pixels.as_strided((n, oh, ow, kh, kw, c), (h * w * c, sh * w * c, sw * c, w * c, c, 1))
    return rows.reshape(n * oh * ow, kh * kw * c)


def conv(x: torch.Tensor, packed_weight: torch.Tensor, out_channels: int, bias: torch.Tensor | None,
         unary: str = "none", scalars=(), algorithm: str | None = None, other: torch.Tensor | None = None,
         kernel: tuple[int, int] = (1, 1), stride=(1, 1)) -> torch.Tensor:
    """unary(conv(x) + bias + other), channels-last, as kiln::conv computes it."""
    n, h, w = x.shape[0], x.shape[2], x.shape[3]
    oh, ow = (h - kernel[0]) // stride[0] + 1, (w - kernel[1]) // stride[1] + 1
    y = torch.empty((n, out_channels, oh, ow), dtype=x.dtype, memory_format=torch.channels_last)
    residual = None
    if other is not None:
        residual = other.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1).reshape(n * oh * ow, out_channels)
    kiln_gemm.mm(windows(x, kernel, stride), packed_weight, out_channels, bias, unary, scalars,
                 residual=residual, algorithm=algorithm, residual_first=True,
                 out=y.permute(0, 2, 3, 1).view(n * oh * ow, out_channels))
    return y
