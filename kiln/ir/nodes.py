"""The loop-level IR: buffers with layouts, and define-by-run `Pointwise` and `Reduction` nodes.

Sizes and indices are sympy expressions over integer index symbols (`i0, i1, ...` for a node's
output ranges, `r0, r1, ...` for its reduction ranges), so symbolic sizes need no special case.
A node's `inner_fn(index)` (or `inner_fn(index, rindex)`) returns the value of one element,
computed with `ops.*` calls; it is never run directly, always under a handler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import sympy
import torch


def index_symbols(prefix: str, count: int) -> tuple[sympy.Symbol, ...]:
    return tuple(sympy.Symbol(f"{prefix}{d}", integer=True, nonnegative=True) for d in range(count))


def _exprs(values: Sequence[Any]) -> tuple[sympy.Expr, ...]:
    return tuple(sympy.sympify(v) for v in values)


def contiguous_strides(size: Sequence[sympy.Expr]) -> tuple[sympy.Expr, ...]:
    strides, running = [], sympy.Integer(1)
    for s in reversed(size):
        strides.append(running)
        running = running * s
    return tuple(reversed(strides))


@dataclass(frozen=True)
class Layout:
    """Where a tensor's elements live in its flat storage: element `idx` is at `offset + idx·stride`."""

    size: tuple[sympy.Expr, ...]
    stride: tuple[sympy.Expr, ...]
    dtype: torch.dtype
    offset: sympy.Expr = sympy.Integer(0)

    @classmethod
    def contiguous(cls, size: Sequence[Any], dtype: torch.dtype) -> "Layout":
        size = _exprs(size)
        return cls(size, contiguous_strides(size), dtype)

    @property
    def is_static(self) -> bool:
        """Every size, stride and the offset are integers (not symbols a graph computed from data)."""
        return all(sympy.sympify(v).is_Integer for v in (*self.size, *self.stride, self.offset))

    def flat_index(self, index: Sequence[sympy.Expr]) -> sympy.Expr:
        if len(index) != len(self.size):
            raise ValueError(f"index of rank {len(index)} into a layout of rank {len(self.size)}")
        return self.offset + sum((i * s for i, s in zip(index, self.stride)), sympy.Integer(0))


@dataclass(frozen=True)
class Buffer:
    """A named tensor in memory: a graph input, or a node's realized result."""

    name: str
    layout: Layout

    def load(self, index: Sequence[sympy.Expr]) -> Any:
        """`ops.load` of the element at `index` (to be called inside an inner_fn)."""
        from kiln.ir.ops import ops

        return ops.load(self.name, self.layout.flat_index(index))


@dataclass
class Pointwise:
    """`out[index] = inner_fn(index)` for every index in `ranges`."""

    dtype: torch.dtype
    ranges: tuple[sympy.Expr, ...]
    inner_fn: Callable[[tuple[sympy.Symbol, ...]], Any]
    name: str | None = None

    def __post_init__(self) -> None:
        self.ranges = _exprs(self.ranges)

    def index_vars(self) -> tuple[sympy.Symbol, ...]:
        return index_symbols("i", len(self.ranges))

    def body(self) -> Any:
        """Run the body once under the current handler, on the node's own index symbols."""
        return self.inner_fn(self.index_vars())


@dataclass
class Reduction:
    """`out[index] = reduce(reduction_type, inner_fn(index, rindex) for rindex in reduction_ranges)`."""

    dtype: torch.dtype
    ranges: tuple[sympy.Expr, ...]
    reduction_ranges: tuple[sympy.Expr, ...]
    reduction_type: str
    inner_fn: Callable[[tuple[sympy.Symbol, ...], tuple[sympy.Symbol, ...]], Any]
    name: str | None = None
    src_dtype: torch.dtype | None = field(default=None)

    def __post_init__(self) -> None:
        from kiln.ir.ops import REDUCTION_TYPES

        self.ranges, self.reduction_ranges = _exprs(self.ranges), _exprs(self.reduction_ranges)
        if self.reduction_type not in REDUCTION_TYPES:
            raise ValueError(f"reduction_type must be one of {', '.join(REDUCTION_TYPES)}, got {self.reduction_type!r}")

    def index_vars(self) -> tuple[sympy.Symbol, ...]:
        return index_symbols("i", len(self.ranges))

    def reduction_vars(self) -> tuple[sympy.Symbol, ...]:
        return index_symbols("r", len(self.reduction_ranges))

    def body(self) -> Any:
        """The reduced value under the current handler: `ops.reduction` of the element body."""
        from kiln.ir.ops import ops

        value = self.inner_fn(self.index_vars(), self.reduction_vars())
        return ops.reduction(self.reduction_type, self.dtype, value)


SCATTER_MODES = (None, "sum", "prod", "max", "min")


@dataclass
class Scatter:
    """Writes at computed positions: `out[index] = init_fn(index)` for every index in `ranges`,
    then for every `source` index in `source_ranges`, with `(target, value) = inner_fn(source)`,
    `out[target] = value` (mode None: several sources hitting one target leave any one of their
    values, as eager's index_put) or `out[target] = combine(out[target], value)` (mode "sum",
    "prod", "max", "min": every source counts).

    `target` is an index over `ranges` (one expression per dim, usually holding symbols from
    `ops.indirect_indexing`); the output is the node's own contiguous buffer, so a scatter never
    writes memory another node produced. Source loop variables are `r0, r1, ...`.
    """

    dtype: torch.dtype
    ranges: tuple[sympy.Expr, ...]
    init_fn: Callable[[tuple[sympy.Symbol, ...]], Any]
    source_ranges: tuple[sympy.Expr, ...]
    inner_fn: Callable[[tuple[sympy.Symbol, ...]], tuple[Sequence[sympy.Expr], Any]]
    mode: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        self.ranges, self.source_ranges = _exprs(self.ranges), _exprs(self.source_ranges)
        if self.mode not in SCATTER_MODES:
            raise ValueError(f"mode must be one of {SCATTER_MODES}, got {self.mode!r}")

    def index_vars(self) -> tuple[sympy.Symbol, ...]:
        return index_symbols("i", len(self.ranges))

    def source_vars(self) -> tuple[sympy.Symbol, ...]:
        return index_symbols("r", len(self.source_ranges))

    def init(self) -> Any:
        """The initial value of `out[index]`, on the node's own index symbols."""
        return self.init_fn(self.index_vars())

    def scattered(self) -> tuple[tuple[sympy.Expr, ...], Any]:
        """(target index, value) of one source element, on the node's source symbols."""
        target, value = self.inner_fn(self.source_vars())
        return tuple(sympy.sympify(t) for t in target), value

    def body(self) -> Any:
        """Both parts once under the current handler (what analyses read): the initial value,
        then the scattered value, stored at its target's offset in a contiguous output."""
        from kiln.ir.ops import ops

        init = self.init()
        target, value = self.scattered()
        if len(target) != len(self.ranges):
            raise ValueError(f"scatter target {target} has rank {len(target)}, the output {len(self.ranges)}")
        ops.store(self.name or "scatter", Layout.contiguous(self.ranges, self.dtype).flat_index(target), value)
        return init


Node = Pointwise | Reduction | Scatter
