"""Which implementation runs a GEMM or a convolution over a frozen weight, by measurement.

The candidates are the functions `kiln::mm` and `kiln::conv` dispatch to (kiln/runtime/prepacked.py),
run on random tensors of the node's shapes, dtypes and strides. The weight's packing is done in
the warm-up run, so only the steady state is timed. A candidate that raises (a library without
that dtype) is out.
"""

from __future__ import annotations

from typing import Callable

import torch

from kiln.autotune.choose import choose
from kiln.runtime.prepacked import CONV_IMPLS, MM_IMPLS

# Timing budget per candidate in seconds: the default search, and mode="max-autotune"'s.
BUDGET = {"default": 0.05, "max-autotune": 0.3}


def _like(val: torch.Tensor, memory_format: torch.memory_format | None = None) -> torch.Tensor:
    if memory_format is not None:
        return torch.randn(tuple(val.shape), dtype=val.dtype).contiguous(memory_format=memory_format)
    return torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype).normal_()


def _guarded(run: Callable[[], object]) -> Callable[[], object] | None:
    try:
        with torch.no_grad():
            run()
    except RuntimeError:
        return None
    return run


def _timed(candidates: dict[str, Callable[[], object]]) -> dict[str, Callable[[], object]]:
    def no_grad(run: Callable[[], object]) -> Callable[[], object]:
        def go() -> object:
            with torch.no_grad():
                return run()
        return go

    return {name: no_grad(run) for name, run in candidates.items() if _guarded(run) is not None}


def mm_impls(dtype: torch.dtype) -> list[str]:
    """The mm candidates for `dtype`, ATen first (the reference a tie goes to)."""
    names = ["aten", "aten_kn", "aten_nk", "onednn"]
    if dtype == torch.float32 and torch.backends.mkl.is_available():
        names.append("mkl")
    return names


def choose_mm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, mode: str = "default") -> str:
    """The fastest `kiln::mm` implementation for fake or meta values `a` [M, K], `b` [K, N]."""
    ra, rb = _like(a), _like(b)
    rbias = _like(bias) if bias is not None else None
    candidates = {name: (lambda f=MM_IMPLS[name]: f(ra, rb, rbias)) for name in mm_impls(a.dtype)}
    signature = (tuple(a.shape), tuple(b.shape), tuple(b.stride()), str(a.dtype), bias is not None)
    return choose("mm", signature, _timed(candidates), BUDGET[mode])


def choose_conv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, conv_args: tuple, unary: str,
                scalars: list, algorithm: str | None, other: torch.Tensor | None, mode: str = "default") -> str:
    """The fastest `kiln::conv` implementation, post-ops included: ATen's convolution on eager's
    layout or on channels-last data, or oneDNN with a blocked weight and the post-ops fused."""
    stride, padding, dilation, groups = conv_args
    rw = _like(w)
    rbias = _like(bias) if bias is not None else None
    candidates: dict[str, Callable[[], object]] = {}
    for name, impl in CONV_IMPLS.items():
        fmt = None if name == "aten" else torch.channels_last
        rx = _like(x, fmt)
        rother = _like(other, fmt) if other is not None else None
        candidates[name] = lambda impl=impl, rx=rx, rother=rother: impl(
            rx, rw, rbias, stride, padding, dilation, groups, unary, scalars, algorithm, rother)
    signature = (tuple(x.shape), tuple(x.stride()), tuple(w.shape), str(x.dtype), bias is not None, tuple(stride),
                 tuple(padding), tuple(dilation), groups, unary, tuple(scalars), algorithm, other is not None)
    return choose("conv", signature, _timed(candidates), BUDGET[mode])

