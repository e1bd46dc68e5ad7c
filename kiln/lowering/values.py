"""What lowerings pass around: a tensor as sizes, a dtype and a loader `index -> ops value`.

A value computed by pointwise lowerings is not materialized: its loader calls its inputs' loaders,
so a chain of pointwise ops becomes one loop body (vertical fusion by construction). Values are
`realize`d into buffers only where something needs memory: an extern call, a reduction's result,
a graph output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import sympy
import torch

from kiln.ir.nodes import Buffer, Layout, Reduction
from kiln.ir.ops import ops

Index = Sequence[sympy.Expr]

# 16-bit floats are stored in 16 bits and computed in float32. A pointwise result of one of these
# types keeps float32's precision while it stays inside a fused body; it is rounded where it is
# stored and where the graph casts it explicitly (`round_low_precision`), as Inductor does by
# default. A chain like GELU's mul/erf/add/mul rounds once, as eager's own GELU kernel does,
# instead of after every step (three times the work, and further from the exact result).
LOW_PRECISION = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class TensorValue:
    size: tuple[sympy.Expr, ...]
    dtype: torch.dtype
    loader: Callable[[Index], Any]
    buffer: Buffer | None = None  # set when the value is exactly a buffer's contents
    # Set when the value is a strided view of a buffer's storage: (base buffer, the view's layout).
    # An extern call can then take it as a view instead of a copy.
    strided: tuple[Buffer, Layout] | None = None

    @classmethod
    def of_buffer(cls, buffer: Buffer) -> "TensorValue":
        return cls(buffer.layout.size, buffer.layout.dtype, buffer.load, buffer, (buffer, buffer.layout))

    @property
    def rank(self) -> int:
        return len(self.size)


@dataclass
class ReductionResult:
    """What a reduction lowering returns: the node to realize, the size eager gives its result
    (keepdim), and an optional pointwise step on the realized result (mean's division).

    Only a buffer can hold a reduction's result, so the graph realizes it (graph.py, or a lowering
    through `context.realize`) and continues with `then` on the buffer's value."""

    node: Reduction
    size: list[sympy.Expr]
    then: Callable[["TensorValue"], "TensorValue"] | None = None


def broadcast_sizes(*sizes: Sequence[sympy.Expr]) -> tuple[sympy.Expr, ...]:
    """NumPy broadcasting over sympy sizes (equal, or one of them 1)."""
    rank = max(len(s) for s in sizes)
    out = []
    for d in range(rank):
        dims = {s[len(s) - rank + d] for s in sizes if len(s) - rank + d >= 0} - {sympy.Integer(1)}
        if len(dims) > 1:
            raise ValueError(f"sizes {[list(s) for s in sizes]} do not broadcast")
        out.append(dims.pop() if dims else sympy.Integer(1))
    return tuple(out)


def broadcast_to(value: TensorValue, size: Sequence[sympy.Expr]) -> TensorValue:
    """`value` read at the indices of the broadcast `size` (size-1 dims read index 0)."""
    lead = len(size) - value.rank
    own = value.size

    def loader(index: Index) -> Any:
        return value.loader([sympy.Integer(0) if own[d] == 1 else index[lead + d] for d in range(len(own))])

    return TensorValue(tuple(size), value.dtype, loader)


def as_dtype(value: TensorValue, dtype: torch.dtype) -> TensorValue:
    """`value` converted elementwise to `dtype` (itself if it already has it)."""
    if value.dtype == dtype:
        return value
    return TensorValue(value.size, dtype, lambda index: ops.to_dtype(value.loader(index), dtype))


def round_low_precision(value: Any, dtype: torch.dtype) -> Any:
    """A loaded value of `dtype` with exactly that type's precision: a 16-bit float computed in
    float32 is rounded (the C++ printer skips values already exact, such as loads)."""
    return ops.to_dtype(value, dtype) if dtype in LOW_PRECISION else value
