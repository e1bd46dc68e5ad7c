"""kiln's own depthwise convolution (kiln/native/include/kiln_depthwise.h), float32, channels-last,
called through ctypes from the Python wrapper (the C++ wrapper calls the same function in kiln's
runtime). `kiln::conv`'s "kiln" implementation: the autotuner times it against oneDNN's and ATen's
convolutions for each depthwise convolution and keeps the fastest (kiln/autotune/gemm.py).
"""

from __future__ import annotations

import ctypes

import torch

from kiln.externs import kiln_gemm


_NO_POST_OP = kiln_gemm.Epilogue()  # all zero: no bias, no residual, the identity


def applies(x: torch.Tensor, weight: torch.Tensor, groups: int, transposed: bool = False) -> bool:
    """Whether kiln's kernel runs this convolution: 2-d, float32, every channel its own group with
    one filter (weight [C, 1, KH, KW], groups = C)."""
    return (not transposed and x.dim() == 4 and weight.dim() == 4 and x.dtype == weight.dtype == torch.float32
            and weight.shape[1] == 1 and groups == x.shape[1] == weight.shape[0])


def pack(weight: torch.Tensor, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """weight [C, 1, KH, KW] as [KH * KW, C]: each tap's channels one vector load. `lib`: kiln's
    kernels built for another ISA (tests), else this machine's."""
    c, _, kh, kw = weight.shape
    w = weight.contiguous()
    out = torch.empty(kh * kw * c, dtype=torch.float32)
    (lib or kiln_gemm.library()).kiln_depthwise_pack_f32(w.data_ptr(), c, kh * kw, out.data_ptr())
    return out


def _output_size(size: int, kernel: int, stride: int, before: int, after: int, dilation: int) -> int:
    return (size + before + after - dilation * (kernel - 1) - 1) // stride + 1


def conv(x: torch.Tensor, packed_weight: torch.Tensor, kernel: tuple[int, int], bias: torch.Tensor | None,
         stride, padding, dilation, unary: str = "none", scalars=(), algorithm: str | None = None,
         other: torch.Tensor | None = None, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """unary(depthwise_conv(x) + bias + other), channels-last, as kiln::conv computes it."""
    n, c, h, w = x.shape
    if x.dtype != torch.float32 or packed_weight.numel() != c * kernel[0] * kernel[1]:
        raise RuntimeError(f"kiln::conv: kiln's kernel runs float32 depthwise convolutions only (input {tuple(x.shape)} "
                           f"{x.dtype}, {packed_weight.numel()} packed weights for a {kernel} kernel)")
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    # [ph, pw], or [top, left, bottom, right]: the kernel reads inside the image only, so padding
    # after it is only in the output's size.
    top, left, bottom, right = padding if len(padding) == 4 else (*padding, *padding)
    oh, ow = _output_size(h, kh, sh, top, bottom, dh), _output_size(w, kw, sw, left, right, dw)
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.empty((n, c, oh, ow), memory_format=torch.channels_last)
    if other is not None:
        other = other.contiguous(memory_format=torch.channels_last)
    if bias is not None:
        bias = bias.contiguous()
    epilogue = kiln_gemm.epilogue(None, unary, scalars, algorithm, None, torch.float32) or _NO_POST_OP
    shape = (ctypes.c_int64 * 14)(n, h, w, c, kh, kw, oh, ow, sh, sw, top, left, dh, dw)
    (lib or kiln_gemm.library()).kiln_depthwise_f32(shape, x.data_ptr(), packed_weight.data_ptr(),
                                           bias.data_ptr() if bias is not None else None,
                                           other.data_ptr() if other is not None else None, y.data_ptr(),
                                           ctypes.byref(epilogue))
    return y
