"""Pointwise (1x1) convolutions through kiln's own GEMM (kiln_gemm.py): on channels-last data a
1x1 convolution of stride 1 is a matrix product, input [N*H*W, C] @ weight [C, K] = output
[N*H*W, K], read and written where they lie. `kiln::conv`'s "kiln" implementation for these
convolutions: the autotuner times it against oneDNN's and ATen's for each one and keeps the
fastest (kiln/autotune/gemm.py). Where it wins is where the GEMM's panels suit the shape: the
small images of a network's last stages (7x7 and 14x14: many channels, few pixels; 0.85-0.96x
oneDNN's time at MobileNetV1's and ResNet-50's there, 2-core AMD EPYC), not its first ones
(112x112 with 32 channels: 3x).

    unary(conv1x1(x) + bias + other)  ==  kiln_gemm.mm(x as [N*H*W, C], pack(w), K, bias, unary,
                                                       residual=other as [N*H*W, K], residual_first=True)
"""

from __future__ import annotations

import torch

from kiln.externs import kiln_gemm


def applies(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation, groups: int,
            transposed: bool = False) -> bool:
    """Whether this convolution is a matrix product: 2-d, a 1x1 kernel, stride 1, no padding, one
    group, float32 or bfloat16 (dilation means nothing for a 1x1 kernel)."""
    return (not transposed and x.dim() == 4 and weight.dim() == 4 and tuple(weight.shape[2:]) == (1, 1)
            and groups == 1 and tuple(stride) == (1, 1) and tuple(padding) == (0, 0)
            and x.dtype == weight.dtype and x.dtype in kiln_gemm.DTYPES)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [K, C, 1, 1] as the GEMM's packed B [C, K]."""
    k, c = weight.shape[:2]
    return kiln_gemm.pack(weight.reshape(k, c).t())


def conv(x: torch.Tensor, packed_weight: torch.Tensor, out_channels: int, bias: torch.Tensor | None,
         unary: str = "none", scalars=(), algorithm: str | None = None, other: torch.Tensor | None = None) -> torch.Tensor:
    """unary(conv1x1(x) + bias + other), channels-last, as kiln::conv computes it."""
    n, c, h, w = x.shape
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.empty((n, out_channels, h, w), dtype=x.dtype, memory_format=torch.channels_last)
    residual = None
    if other is not None:
        residual = other.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1).reshape(n * h * w, out_channels)
    kiln_gemm.mm(x.permute(0, 2, 3, 1).reshape(n * h * w, c), packed_weight, out_channels, bias, unary, scalars,
                 residual=residual, algorithm=algorithm, residual_first=True,
                 out=y.permute(0, 2, 3, 1).view(n * h * w, out_channels))
    return y
