"""kiln's operators written in C++ (kiln/native/src/kiln_runtime.cpp, `KILN_OPERATOR`): their fake
functions, `load`, which defines them, and `direct`, which calls one without the dispatcher.

The runtime library defines such an operator (its schema and CPU kernel) with the dispatcher when
it is loaded (kiln/native/libkiln.py `library`; built first where the C++ cache lacks it), so
Python code asks for one through `op(name)`, which loads the runtime once and registers the fake
functions below beside it. A C++ wrapper calls the same C++ function without the dispatcher
(kiln_find_op), and so do compiled graphs' Python wrappers and the autotuner (`direct`);
docs/native.md.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any, Callable

import torch

from kiln.native import libkiln, python_door

aten = torch.ops.aten


def _attention_fake(q, k, v, attn_mask, scale, is_causal):
    # The output as ATen's CPU kernel makes it (its meta function: `empty_like(query)`), so that
    # the graph's later views of it stay valid: q's order of dimensions, v's head size. The C++
    # kernel makes the same (kiln_runtime.cpp `attention_output`).
    dv = v.shape[3]
    if dv == q.shape[-1]:
        return torch.empty_like(q)
    order = sorted(range(4), key=lambda i: -q.stride(i))
    return torch.empty_permuted((*q.shape[:3], dv), order, dtype=q.dtype, device=q.device)


def _mm_fake(a, b, bias, unary, scalars, algorithm, impl):
    return a.new_empty((a.shape[0], b.shape[1]))


def _mm_quant_fake(a, qweight, scales, zeros, bits, group_size, bias, residual, unary, scalars, algorithm,
                   int8_activations=False, impl="kiln"):
    return a.new_empty((*a.shape[:-1], qweight.shape[0]))


def _mm_quant_gated_fake(a, qweight, scales, zeros, bits, group_size, bias, unary, scalars, algorithm,
                         int8_activations=False, impl="kiln"):
    return a.new_empty((*a.shape[:-1], qweight.shape[0] // 2))


def _mm_quant_layer_norm_fake(a, qweight, scales, zeros, bits, group_size, bias, residual, weight, norm_bias, eps,
                              rms=False, int8_activations=False, impl="kiln"):
    return a.new_empty((*a.shape[:-1], qweight.shape[0]))


def _mm_quant_add_layer_norm_fake(a, qweight, scales, zeros, bits, group_size, bias, residual, weight, norm_bias, eps,
                                  rms=False, int8_activations=False, impl="kiln"):
    return a.new_empty((*a.shape[:-1], qweight.shape[0])), a.new_empty((*a.shape[:-1], qweight.shape[0]))


def _post_op_fake(y, unary, scalars, algorithm):
    return torch.empty_like(y)


def _mm_layer_norm_fake(a, b, bias, residual, weight, norm_bias, eps, rms=False, impl="kiln"):
    return a.new_empty((a.shape[0], b.shape[1]))


def _mm_add_layer_norm_fake(a, b, bias, residual, weight, norm_bias, eps, rms=False, impl="kiln"):
    return a.new_empty((a.shape[0], b.shape[1])), a.new_empty((a.shape[0], b.shape[1]))


def _mm_softmax_fake(a, b, bias, residual, log=False, impl="kiln"):
    return a.new_empty((a.shape[0], b.shape[1]))


def symmetric(x: torch.Tensor, padding) -> tuple[torch.Tensor, list[int]]:
    """x and a padding of ATen's form for the convolution `padding` asks for: four entries
    ([top, left, bottom, right], a "same" pad of a stride-2 convolution folded in by
    kiln/passes/conv_prepack.py) become a zero pad of x by their difference and the smaller side's
    padding, as kiln::conv's C++ pads before every implementation but kiln's depthwise kernel."""
    if len(padding) != 4:
        return x, list(padding)
    top, left, bottom, right = padding
    ph, pw = min(top, bottom), min(left, right)
    return aten.constant_pad_nd(x, [left - pw, right - pw, top - ph, bottom - ph], 0.0), [ph, pw]


def _conv_fake(x, weight, bias, stride, padding, dilation, groups, unary, scalars, algorithm, other, impl):
    x, padding = symmetric(x, padding)
    if impl == "aten":
        y = aten.convolution(x, weight, bias, stride, padding, dilation, False, [0, 0], groups)
        return y if other is None else y + other
    y = aten.convolution(x.contiguous(memory_format=torch.channels_last), weight, bias, stride, padding,
                         dilation, False, [0, 0], groups)
    return y.contiguous(memory_format=torch.channels_last)


# The fake function of each operator the runtime defines, by name in the kiln namespace.
FAKES: dict[str, Callable] = {"attention": _attention_fake, "mm": _mm_fake, "mm_quant": _mm_quant_fake,
                              "mm_quant_gated": _mm_quant_gated_fake,
                              "mm_quant_layer_norm": _mm_quant_layer_norm_fake,
                              "mm_quant_add_layer_norm": _mm_quant_add_layer_norm_fake,
                              "post_op": _post_op_fake,
                              "mm_layer_norm": _mm_layer_norm_fake,
                              "mm_add_layer_norm": _mm_add_layer_norm_fake, "mm_softmax": _mm_softmax_fake,
                              "conv": _conv_fake}


@functools.cache
def load() -> None:
    """Load kiln's runtime (its operators defined) and register their fake functions, once."""
    libkiln.library()
    for name, fake in FAKES.items():
        torch.library.register_fake(f"kiln::{name}", fake)


@functools.cache
def op(name: str) -> torch._ops.OpOverload:
    """The operator kiln::`name` (its only overload), defined first where it is not yet."""
    load()
    return getattr(torch.ops.kiln, name).default


def is_op(target: Any, name: str) -> bool:
    """Whether `target` (a graph node's) is kiln::`name`, without loading the runtime: a graph that
    holds one was made after it was loaded."""
    return isinstance(target, torch._ops.OpOverload) and target.name() == f"kiln::{name}"


@functools.cache
def direct(name: str) -> Callable[..., Any]:
    """kiln::`name` as a C++ wrapper calls it (the runtime's function itself: no dispatcher, no
    autograd), through kiln's CPython extension: `direct("mm")(a, b, bias, ...)` takes the
    operator's arguments by position or name and returns its result. Compiled graphs' Python
    wrappers and the autotuner call kiln's operators this way (~0.5 µs beyond the work, against
    ~5 µs through the dispatcher)."""
    schema = op(name)._schema
    library = libkiln.library()
    found = library.kiln_find_op(f"kiln::{name}".encode(), b"")
    if not found:
        raise RuntimeError(library.kiln_error().decode())
    address = lambda fn: ctypes.cast(fn, ctypes.c_void_p).value  # noqa: E731
    names = tuple(a.name for a in schema.arguments)
    defaults = tuple(a.default_value for a in schema.arguments if a.has_default_value())
    return python_door.module().DirectOp(found, address(library.kiln_call_op), address(library.kiln_error),
                                         len(schema.returns), names, defaults)


def names_in(text: bytes | str) -> bool:
    """Whether `text` (a pickled graph's code) calls one of these operators: it then needs `load`
    before it is unpickled."""
    data = text.encode() if isinstance(text, str) else text
    return any(f"kiln.{name}".encode() in data for name in FAKES)
