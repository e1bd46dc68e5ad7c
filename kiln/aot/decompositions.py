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
