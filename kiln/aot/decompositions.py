"""The decomposition table used to trace to core ATen: PyTorch's core table plus kiln's own.

A few ops in PyTorch's table are kept whole (`KEPT_WHOLE`), each with the reason.

kiln's entries go in `KILN_DECOMPOSITIONS`, one small function per op, registered with
`@decomposition(aten.op.overload)`; they win over PyTorch's for the same op. Add one when a later
layer (a lowering, a pattern) wants an op in a different form than PyTorch's table gives.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch._decomp import core_aten_decompositions

aten = torch.ops.aten

KILN_DECOMPOSITIONS: dict[torch._ops.OpOverload, Callable] = {}

# Ops PyTorch's core table decomposes that kiln keeps whole.
KEPT_WHOLE = {
    # The table's version returns the attention probabilities where the op returns logsumexp, and
    # the decomposition runs under autograd, so the recorded backward op would get the wrong
    # tensor. Kept whole, it is one call of the fused CPU flash kernel, forward and backward.
    aten._scaled_dot_product_flash_attention_for_cpu.default,
}


def decomposition(op: torch._ops.OpOverload) -> Callable[[Callable], Callable]:
    """Register `fn` as kiln's decomposition of `op`.

    Example::

        @decomposition(aten.silu.default)
        def silu(x):
            return x * torch.sigmoid(x)
    """

    def register(fn: Callable) -> Callable:
        if op in KILN_DECOMPOSITIONS:
            raise ValueError(f"kiln already decomposes {op}")
        KILN_DECOMPOSITIONS[op] = fn
        return fn

    return register


@functools.cache
def _core_table() -> dict:
    return dict(core_aten_decompositions())


def decomposition_table() -> dict[torch._ops.OpOverload, Callable]:
    """The table make_fx traces with: PyTorch's core-ATen decompositions, then kiln's on top."""
    table = {op: fn for op, fn in _core_table().items() if op not in KEPT_WHOLE}
    return {**table, **KILN_DECOMPOSITIONS}


@decomposition(aten.take.default)
def take(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    # PyTorch's `flat[index]` reads a 0-d index as a Python integer (a data-dependent `.item()`);
    # advanced indexing keeps it a tensor, for any index shape, negative indices included.
    return aten.index.Tensor(x.reshape(-1), [index])


@decomposition(aten.dist.default)
def dist(x: torch.Tensor, other: torch.Tensor, p: float = 2) -> torch.Tensor:
    # The p-norm of the difference, which the vector-norm lowering computes as one reduction.
    return aten.linalg_vector_norm.default(x - other, p)


@decomposition(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask):
    # PyTorch's table, except float32's weight gradient, which takes eager's CPU kernel's steps:
    # dgamma = sum(dy * fma(rstd, x, -rstd * mean)). Where x == mean (a one-element row) the true
    # value is 0, PyTorch's table gives 0, and eager gives the rounding of rstd * mean (up to 1e-4
    # with rstd = 1/sqrt(eps)); the FMA is computed in float64, exact for float32 operands.
    from torch._decomp.decompositions import native_layer_norm_backward as table

    want_weight = output_mask[1] and weight is not None and input.dtype == torch.float32
    if not want_weight:
        return table(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)
    d_input, _, d_bias = table(grad_out, input, normalized_shape, mean, rstd, weight, bias,
                               [output_mask[0], False, output_mask[2]])
    axis = input.dim() - len(normalized_shape)
    mean, rstd = (t.reshape(*t.shape[:axis], *[1] * len(normalized_shape)) for t in (mean, rstd))
    shift = -(rstd * mean)  # rounded to float32, as eager's
    x_hat = (rstd.double() * input.double() + shift.double()).float()
    d_weight = grad_out * x_hat
    if axis > 0:
        d_weight = torch.sum(d_weight, list(range(axis)))
    return d_input, d_weight, d_bias
