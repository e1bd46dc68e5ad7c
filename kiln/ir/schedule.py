"""What the scheduler hands to code generation: a graph's steps as fused kernels and externs, in
order, with a memory plan.

- `LoopNest`: one compute node as the scheduler sees it: its loops with size-1 dims dropped, in
  the chosen order, and the flat index it stores to (made by kiln/schedule/loop_nest.py).
- `FusedKernel`: nodes that share outer loops, run as one kernel (kiln/schedule/fusion.py).
- `MemoryPlan`: when each buffer dies, which dead buffer's memory a new one takes, which inputs
  results are written over (kiln/schedule/memory.py).
- `Schedule`: the whole graph (kiln/schedule/scheduler.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sympy
from torch.utils import _pytree as pytree

from kiln.ir.nodes import Buffer, Node, Reduction, Scatter
from kiln.ir.program import ExternStep, binds_memory


@dataclass
class LoopNest:
    buffer: Buffer
    node: Node  # normalized: no size-1 ranges (a reduction keeps at least one reduction range)
    store_index: sympy.Expr  # element offset into `buffer`'s storage, over node.index_vars()
    reads: list[tuple[str, sympy.Expr]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.buffer.name

    @property
    def is_reduction(self) -> bool:
        return isinstance(self.node, Reduction)

    @property
    def is_scatter(self) -> bool:
        return isinstance(self.node, Scatter)

    @property
    def ranges(self) -> tuple[sympy.Expr, ...]:
        return self.node.ranges


def loop_extents(node: Node) -> dict[sympy.Symbol, sympy.Expr]:
    """Each loop variable of `node` with its trip count."""
    extents = dict(zip(node.index_vars(), node.ranges))
    if isinstance(node, Reduction):
        extents.update(zip(node.reduction_vars(), node.reduction_ranges))
    if isinstance(node, Scatter):
        extents.update(zip(node.source_vars(), node.source_ranges))
    return extents


@dataclass
class GemmTemplate:
    """A matrix product computed inside a kernel, ahead of its members (kiln/schedule/gemm_template.py):
    `product` = `a` @ `b` is never stored; the members read it from registers."""

    a: Buffer
    b: Buffer
    product: Buffer


@dataclass
class FusedKernel:
    name: str
    outer: tuple[sympy.Expr, ...]
    members: list[LoopNest] = field(default_factory=list)
    locals: set[str] = field(default_factory=set)  # members kept in registers, never stored
    inputs: list[Buffer] = field(default_factory=list)  # read from memory written elsewhere
    outputs: list[Buffer] = field(default_factory=list)  # members stored to memory
    overwrites: dict[str, Buffer] = field(default_factory=dict)  # output -> input it is written over
    # A scatter kernel's loop writing its initial values, or None when they are already in place
    # (its output is written over an input that holds them); chosen by the scheduler.
    scatter_init: LoopNest | None = None
    gemm: GemmTemplate | None = None  # a product computed first, read by the members in registers

    @property
    def written(self) -> dict[str, LoopNest]:
        return {m.name: m for m in self.members}

    def inner_ranges(self, member: LoopNest) -> tuple[sympy.Expr, ...]:
        if member.is_scatter:
            return tuple(member.node.source_ranges)
        if member.is_reduction:
            return tuple(member.node.reduction_ranges)
        return tuple(member.ranges[len(self.outer):])

    @property
    def vectorizes_outer(self) -> bool:
        """No member has inner loops: the last outer loop is the one to vectorize."""
        return all(not self.inner_ranges(m) and not m.is_scatter for m in self.members)

    def argument_names(self) -> dict[str, str]:
        """Each buffer the kernel reads or writes -> its argument: `in<k>` for inputs, `out<k>`
        for outputs (an input written over is named as the output that takes its memory)."""
        names = {b.name: f"in{k}" for k, b in enumerate(self.inputs)}
        names.update({b.name: f"out{k}" for k, b in enumerate(self.outputs)})
        names.update({b.name: names[out] for out, b in self.overwrites.items()})
        return names

    def buffers(self) -> dict[str, Buffer]:
        """Every buffer the kernel's bodies name (its arguments and its members), by name."""
        found = {b.name: b for b in [*self.inputs, *self.outputs, *self.overwrites.values()]}
        found.update({m.name: m.buffer for m in self.members})
        return found

    @property
    def has_static_sizes(self) -> bool:
        """Every loop's trip count is an integer (code generators print sizes as constants)."""
        sizes = list(self.outer) + [s for m in self.members for s in (*m.ranges, *self.inner_ranges(m))]
        return all(sympy.sympify(s).is_Integer for s in sizes)

    @property
    def is_scatter(self) -> bool:
        """A scatter kernel: its one member, alone (see `KernelBuilder.accepts`)."""
        return any(m.is_scatter for m in self.members)


def step_reads(step: FusedKernel | ExternStep) -> list[str]:
    """The buffers a scheduled step reads, by name (a kernel's inputs, an extern's tensor arguments)."""
    if isinstance(step, FusedKernel):
        return [b.name for b in step.inputs]
    return [b.name for b in pytree.tree_leaves((step.args, step.kwargs)) if isinstance(b, Buffer)]


@dataclass
class MemoryPlan:
    frees: dict[int, list[str]] = field(default_factory=dict)  # step -> buffers dead after it
    reuses: dict[str, str] = field(default_factory=dict)  # new buffer -> dead buffer it takes over
    inplace: dict[str, str] = field(default_factory=dict)  # kernel output -> input it is written over
    extern_inplace: dict[int, str] = field(default_factory=dict)  # step -> the input its result is written over


@dataclass
class Schedule:
    inputs: list[Buffer | None]
    steps: list[FusedKernel | ExternStep]
    outputs: list[Any]
    memory: MemoryPlan
    size_inputs: dict[int, Any] = field(default_factory=dict)  # as Program's

    @property
    def kernels(self) -> list[FusedKernel]:
        return [s for s in self.steps if isinstance(s, FusedKernel)]

    @property
    def externs(self) -> list[ExternStep]:
        """ATen calls that compute something (as `Program.externs`)."""
        return [s for s in self.steps if isinstance(s, ExternStep) and not binds_memory(s)]
