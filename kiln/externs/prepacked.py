"""kiln's extern ops over frozen weights: `kiln::mm` and `kiln::conv`.

A frozen weight reaches these ops as an ordinary strided tensor (a constant the frozen graph
computed once, kiln/runtime/frozen.py), so every layer of the backend sees plain tensors. The
library layout an implementation wants (oneDNN's blocked weights, MKL's packed GEMM weights, a
contiguous transpose) is made on the first call and kept on the weight tensor object itself,
tagged with the weight's version counter: a weight changed in place is packed again, and a new
weight object starts with no pack.

`impl` names the implementation the autotuner chose for these shapes (kiln/autotune/gemm.py);
each is a function in `MM_IMPLS` / `CONV_IMPLS`, the same ones the autotuner times.
"""

from __future__ import annotations

from typing import Callable

import torch

from kiln.externs import kiln_attention, kiln_conv_gemm, kiln_depthwise, kiln_gemm

aten, mkldnn, mkl = torch.ops.aten, torch.ops.mkldnn, torch.ops.mkl

_lib = torch.library.Library("kiln", "DEF")
_lib.define("mm(Tensor a, Tensor b, Tensor? bias, str unary, Scalar?[] scalars, str? algorithm, str impl) -> Tensor")
_lib.define("mm_layer_norm(Tensor a, Tensor b, Tensor? bias, Tensor? residual, Tensor? weight, Tensor? norm_bias, "
            "float eps, bool rms=False) -> Tensor")
_lib.define("mm_add_layer_norm(Tensor a, Tensor b, Tensor? bias, Tensor? residual, Tensor? weight, Tensor? norm_bias, "
            "float eps, bool rms=False) -> (Tensor, Tensor)")
_lib.define("mm_softmax(Tensor a, Tensor b, Tensor? bias, Tensor? residual, bool log=False) -> Tensor")
_lib.define(
    "conv(Tensor x, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] dilation, int groups, "
    "str unary, Scalar?[] scalars, str? algorithm, Tensor? other, str impl) -> Tensor"
)

_PACKS = "_kiln_packs"


def packed(weight: torch.Tensor, kind: str, make: Callable[[], torch.Tensor]) -> torch.Tensor:
    """`make()`'s packed form of `weight`, made once per weight object and version."""
    packs = weight.__dict__.setdefault(_PACKS, {})
    entry = packs.get(kind)
    if entry is None or entry[0] != weight._version:
        with torch.no_grad():
            entry = packs[kind] = (weight._version, make())
    return entry[1]


def drop_packs(weight: torch.Tensor) -> None:
    """Drop `weight`'s packed forms: those made here and those kiln's runtime made."""
    from kiln.native import runtime

    weight.__dict__.pop(_PACKS, None)
    runtime.drop_packs(weight)


# Pack kinds that are views of the weight itself, no memory of their own.
_VIEWS_OF_WEIGHT = frozenset({"t"})


def packed_bytes(weight: torch.Tensor) -> int:
    """Memory held by `weight`'s packed forms (its views kept beside them hold none): those made
    here (the Python wrapper's calls) and those kiln's runtime made (the C++ wrapper's)."""
    from kiln.native import runtime

    here = sum(p.numel() * p.element_size() for kind, (_, p) in weight.__dict__.get(_PACKS, {}).items()
               if kind not in _VIEWS_OF_WEIGHT)
    return here + runtime.packed_bytes(weight)


# The post-ops oneDNN applies in its GEMMs and convolutions, and the ATen function that means the same.
UNARY: dict[str, Callable[..., torch.Tensor]] = {
    "none": lambda y: y,
    "relu": torch.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "swish": torch.nn.functional.silu,
    "hardswish": torch.nn.functional.hardswish,
    "gelu": lambda y, approximate="none": torch.nn.functional.gelu(y, approximate=approximate or "none"),
    "leaky_relu": lambda y, slope: torch.nn.functional.leaky_relu(y, slope),
    "hardtanh": lambda y, low, high: torch.clamp(y, low, high),
}


def unary_aten(y: torch.Tensor, unary: str, scalars: list, algorithm: str | None) -> torch.Tensor:
    if unary == "gelu":
        return UNARY["gelu"](y, algorithm)
    return UNARY[unary](y, *scalars)


# ---- kiln::mm(a [M, K], b [K, N], bias [N] | None, post-op) ------------------------------------
# oneDNN and kiln's own GEMM apply the post-op inside the GEMM; the others run it after, as ATen
# (the graph pass gives them "none" and leaves the op to kiln's kernels; the autotuner times them
# with it).

def _mm_aten(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, unary: str, scalars: list,
             algorithm: str | None) -> torch.Tensor:
    return unary_aten(aten.addmm(bias, a, b) if bias is not None else aten.mm(a, b), unary, scalars, algorithm)


def _mm_dense(order: str) -> Callable:
    # b copied once into row-major [K, N] ("kn") or [N, K] read transposed ("nk"): BLAS's speed
    # depends on which, by shape.
    def run(a, b, bias, unary, scalars, algorithm):
        make = (lambda: b.contiguous()) if order == "kn" else (lambda: b.t().contiguous().t())
        return _mm_aten(a, packed(b, order, make), bias, unary, scalars, algorithm)

    return run


def _mm_mkl(a, b, bias, unary, scalars, algorithm):
    # MKL's packed weight: torch allocates about 1-1.3x the weight plus ~7.5 MB, of which 1-1.7x
    # the weight becomes resident (measured with torch 2.13; docs/freezing.md).
    mkl_weight = packed(b, f"mkl{a.shape[0]}", lambda: mkl._mkl_reorder_linear_weight(b.t(), a.shape[0]))
    # b.t() kept with the packs: a view made per call is two ATen calls (t, transpose) per GEMM.
    # Of a detached alias, so the view's base is not `b` itself (no cycle through b's __dict__).
    weight = packed(b, "t", lambda: b.detach().t())
    return unary_aten(mkl._mkl_linear(a.contiguous(), mkl_weight, weight, bias, a.shape[0]), unary, scalars, algorithm)


def _mm_onednn(a, b, bias, unary, scalars, algorithm):
    weight = packed(b, f"onednn{a.shape[0]}", lambda: mkldnn._reorder_linear_weight(b.t(), a.shape[0]))
    return mkldnn._linear_pointwise(a.contiguous(), weight, bias, unary, scalars, algorithm or "")


def _kiln_panels(b: torch.Tensor) -> torch.Tensor:
    """kiln's GEMM's panels of the frozen weight `b`, packed once per weight and version."""
    return packed(b, "kiln", lambda: kiln_gemm.pack(b))


def _mm_kiln(a, b, bias, unary, scalars, algorithm):
    # kiln's own GEMM (kiln_gemm.py): any post-op applied in the store, so it is its own fused
    # candidate as well.
    return kiln_gemm.mm(a, _kiln_panels(b), b.shape[1], bias, unary, scalars, algorithm=algorithm)


# In order of preference when timings tie (kiln/autotune/choose.py): ATen's own call first.
MM_IMPLS: dict[str, Callable] = {
    "aten": _mm_aten,
    "aten_kn": _mm_dense("kn"),
    "aten_nk": _mm_dense("nk"),
    "kiln": _mm_kiln,
    "mkl": _mm_mkl,
    "onednn": _mm_onednn,
}


def _mm(a, b, bias, unary, scalars, algorithm, impl):
    return MM_IMPLS[impl](a, b, bias, unary, scalars, algorithm)


def _mm_fake(a, b, bias, unary, scalars, algorithm, impl):
    return a.new_empty((a.shape[0], b.shape[1]))


# ---- kiln::mm_layer_norm: layer_norm(a @ b + bias + residual) in kiln's GEMM ---------------------
# (`rms`: an RMS norm, T5's and Llama's, instead: row / sqrt(mean(row^2) + eps) * weight.)

def _as_float32(t: torch.Tensor | None) -> torch.Tensor | None:
    """A bfloat16 model's norm weight or bias as the GEMM's row pass reads it: float32, made once."""
    return packed(t, "float32", t.float) if t is not None and t.dtype == torch.bfloat16 else t


def _mm_layer_norm(a, b, bias, residual, weight, norm_bias, eps, rms=False):
    # The rows normalized in the GEMM's parallel region right after their store (kiln_gemm.h):
    # no second pass over the product from memory, no kernel of its own (passes/gemm_layer_norm.py).
    # A bfloat16 product is normalized from its float32 sum, as eager's layer norm computes.
    return kiln_gemm.mm(a, _kiln_panels(b), b.shape[1], bias, residual=residual,
                        row_norm=kiln_gemm.RowNorm(_as_float32(weight), _as_float32(norm_bias), eps,
                                                   kind=kiln_gemm.norm_kind(rms)))


def _mm_layer_norm_fake(a, b, bias, residual, weight, norm_bias, eps, rms=False):
    return a.new_empty((a.shape[0], b.shape[1]))


def _mm_add_layer_norm(a, b, bias, residual, weight, norm_bias, eps, rms=False):
    # (the sum, its layer norm): a pre-norm model reads the sum again as its residual stream.
    # (bfloat16: the sum and its norm both written as bfloat16 by the row pass from the float32 sum)
    normed = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
    total = kiln_gemm.mm(a, _kiln_panels(b), b.shape[1], bias, residual=residual,
                         row_norm=kiln_gemm.RowNorm(_as_float32(weight), _as_float32(norm_bias), eps, normed,
                                                    kiln_gemm.norm_kind(rms)))
    return total, normed


def _mm_add_layer_norm_fake(a, b, bias, residual, weight, norm_bias, eps, rms=False):
    return a.new_empty((a.shape[0], b.shape[1])), a.new_empty((a.shape[0], b.shape[1]))


# ---- kiln::mm_softmax: softmax(a @ b + bias + residual) over rows in kiln's GEMM ---------------
# (`log`: log_softmax.) A classifier's probabilities, an MoE router's weights over its experts.

def _mm_softmax(a, b, bias, residual, log=False):
    return kiln_gemm.mm(a, _kiln_panels(b), b.shape[1], bias, residual=residual,
                        row_norm=kiln_gemm.RowNorm.softmax(log))


def _mm_softmax_fake(a, b, bias, residual, log=False):
    return a.new_empty((a.shape[0], b.shape[1]))


# ---- kiln::conv: 2-d convolution with optional unary post-op and added tensor ----------------
#
# `padding` is [ph, pw] as ATen's, or [top, left, bottom, right]: a "same" pad of a stride-2
# convolution (one more row and column after than before) folded in (conv_prepack.py), which
# kiln's depthwise kernel pads inside its loops and the libraries through an explicit pad first.


def symmetric(x: torch.Tensor, padding) -> tuple[torch.Tensor, list[int]]:
    """x and a padding of ATen's form for the convolution `padding` asks for: four entries become
    a zero pad of x by their difference and the smaller side's padding."""
    if len(padding) != 4:
        return x, list(padding)
    top, left, bottom, right = padding
    ph, pw = min(top, bottom), min(left, right)
    return aten.constant_pad_nd(x, [left - pw, right - pw, top - ph, bottom - ph], 0.0), [ph, pw]


def _conv_aten(memory_format: torch.memory_format | None) -> Callable:
    def run(x, weight, bias, stride, padding, dilation, groups, unary, scalars, algorithm, other):
        x, padding = symmetric(x, padding)
        if memory_format is not None:
            x = x.contiguous(memory_format=memory_format)
            weight = packed(weight, "channels_last", lambda: weight.contiguous(memory_format=memory_format))
        y = aten.convolution(x, weight, bias, stride, padding, dilation, False, [0, 0], groups)
        if other is not None:
            y = y + other
        return unary_aten(y, unary, scalars, algorithm)

    return run


def _conv_onednn(x, weight, bias, stride, padding, dilation, groups, unary, scalars, algorithm, other):
    x, padding = symmetric(x, padding)
    x = x.contiguous(memory_format=torch.channels_last)
    blocked = packed(weight, f"onednn{tuple(x.shape)}", lambda: mkldnn._reorder_convolution_weight(
        weight, padding, stride, dilation, groups, list(x.shape)))
    if other is None:
        return mkldnn._convolution_pointwise(x, blocked, bias, padding, stride, dilation, groups, unary, scalars, algorithm)
    other = other.contiguous(memory_format=torch.channels_last)
    unary_or_none = None if unary == "none" else unary
    return mkldnn._convolution_pointwise.binary(
        x, other, blocked, bias, padding, stride, dilation, groups, "add", 1.0, unary_or_none, scalars, algorithm)


def _conv_onednn_into_other(x, weight, bias, stride, padding, dilation, groups, unary, scalars, algorithm, other):
    # oneDNN's convolution writing its result over the added tensor: the memory plan chooses this
    # when `other` dies here and has the result's layout (kiln/schedule/memory.py).
    x, padding = symmetric(x, padding)
    blocked = packed(weight, f"onednn{tuple(x.shape)}", lambda: mkldnn._reorder_convolution_weight(
        weight, padding, stride, dilation, groups, list(x.shape)))
    unary_or_none = None if unary == "none" else unary
    return mkldnn._convolution_pointwise_.binary(other, x.contiguous(memory_format=torch.channels_last), blocked, bias, padding,
                                                 stride, dilation, groups, "add", 1.0, unary_or_none, scalars, algorithm)


def kiln_conv_applies(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation, groups: int) -> bool:
    """Whether kiln's own kernels run this convolution: a depthwise one (kiln_depthwise.py) or one
    whose windows do not overlap (kiln_conv_gemm.py, kiln's GEMM). The autotuner offers "kiln" for
    these only."""
    return (kiln_depthwise.applies(x, weight, groups)
            or kiln_conv_gemm.applies(x, weight, stride, padding, dilation, groups))


def _conv_kiln(x, weight, bias, stride, padding, dilation, groups, unary, scalars, algorithm, other):
    # kiln's own kernels: depthwise convolutions, and those of non-overlapping windows as kiln's GEMM.
    if kiln_depthwise.applies(x, weight, groups):
        wp = packed(weight, "kiln_depthwise", lambda: kiln_depthwise.pack(weight))
        return kiln_depthwise.conv(x, wp, tuple(weight.shape[2:]), bias, stride, padding, dilation, unary, scalars,
                                   algorithm, other)
    x, padding = symmetric(x, padding)
    if kiln_conv_gemm.applies(x, weight, stride, padding, dilation, groups):
        panels = packed(weight, "kiln", lambda: kiln_conv_gemm.pack(weight))
        return kiln_conv_gemm.conv(x, panels, weight.shape[0], bias, unary, scalars, algorithm, other,
                                   tuple(weight.shape[2:]), tuple(stride))
    raise RuntimeError(f"kiln::conv: kiln's kernels run depthwise convolutions and those of non-overlapping windows "
                       f"(1x1, or stride = kernel, no padding) only, not weight "
                       f"{tuple(weight.shape)} in {groups} groups, stride {tuple(stride)}, padding {tuple(padding)}")


# In order of preference when timings tie (kiln/autotune/choose.py), after "kiln" (TIES_TO in
# kiln/autotune/gemm.py).
CONV_IMPLS: dict[str, Callable] = {
    "onednn": _conv_onednn,
    "aten_channels_last": _conv_aten(torch.channels_last),
    "aten": _conv_aten(None),
    "kiln": _conv_kiln,
}


# Implementations the memory plan picks rather than the autotuner (they overwrite an input).
IN_PLACE_CONV_IMPLS: dict[str, Callable] = {"onednn_into_other": _conv_onednn_into_other}


def _conv(x, weight, bias, stride, padding, dilation, groups, unary, scalars, algorithm, other, impl):
    run = CONV_IMPLS.get(impl) or IN_PLACE_CONV_IMPLS[impl]
    return run(x, weight, bias, stride, padding, dilation, groups, unary, scalars, algorithm, other)


def _conv_fake(x, weight, bias, stride, padding, dilation, groups, unary, scalars, algorithm, other, impl):
    x, padding = symmetric(x, padding)
    if impl == "aten":
        y = aten.convolution(x, weight, bias, stride, padding, dilation, False, [0, 0], groups)
        return y if other is None else y + other
    y = aten.convolution(x.contiguous(memory_format=torch.channels_last), weight, bias, stride, padding,
                         dilation, False, [0, 0], groups)
    return y.contiguous(memory_format=torch.channels_last)


# The compiled wrapper calls these Python functions directly (kiln/codegen/wrapper.py): the same
# code the registered CPU kernels run, without ~20 µs of dispatch per call. (kiln::attention, a
# C++ operator, goes through the dispatcher: its kernel is C++, a few µs away.)
DIRECT_CALLS: dict[str, Callable] = {"kiln::mm": _mm, "kiln::mm_layer_norm": _mm_layer_norm,
                                     "kiln::mm_add_layer_norm": _mm_add_layer_norm, "kiln::mm_softmax": _mm_softmax,
                                     "kiln::conv": _conv,
                                     "kiln::attention": kiln_attention.attention}

_lib.impl("mm", _mm, "CPU")
_lib.impl("conv", _conv, "CPU")
_lib.impl("mm_layer_norm", _mm_layer_norm, "CPU")
_lib.impl("mm_add_layer_norm", _mm_add_layer_norm, "CPU")
_lib.impl("mm_softmax", _mm_softmax, "CPU")
torch.library.register_fake("kiln::mm", _mm_fake, lib=_lib)
torch.library.register_fake("kiln::conv", _conv_fake, lib=_lib)
torch.library.register_fake("kiln::mm_layer_norm", _mm_layer_norm_fake, lib=_lib)
torch.library.register_fake("kiln::mm_add_layer_norm", _mm_add_layer_norm_fake, lib=_lib)
torch.library.register_fake("kiln::mm_softmax", _mm_softmax_fake, lib=_lib)

