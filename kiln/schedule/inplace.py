"""Which inputs a kernel may overwrite with one of its outputs.

An output can be written over an input that dies at this kernel when the input is read only by
the member that computes the output, and only at the element that member stores in the same
iteration: each element is then read before it is overwritten, and never read again. The memory
plan (kiln/schedule/memory.py) makes the final choice, among inputs that die here and have the
output's layout. A scatter qualifies when its initial values read the input at the element they
initialize and its scattered values do not read it: `grad + embedding_backward(...)` then
accumulates into `grad` where it lies, with no copy and no fresh memory (fresh memory is
page-faulted in, which costs more than the writes on a large embedding table).
"""

from __future__ import annotations

import sympy

from kiln.ir.analysis import OpCounter, ReadsWrites, run
from kiln.ir.index_bounds import simplify
from kiln.ir.nodes import Pointwise
from kiln.ir.schedule import FusedKernel, LoopNest, loop_extents


def scatter_init(nest: LoopNest) -> Pointwise:
    node = nest.node
    return Pointwise(node.dtype, node.ranges, node.init_fn, name=node.name)


def _scattered_reads(nest: LoopNest) -> set[str]:
    """Buffers a scatter's targets and values read (not its initial values)."""
    node = nest.node
    return set(run(ReadsWrites(), Pointwise(node.dtype, node.source_ranges, lambda r: node.inner_fn(r)[1],
                                            name=node.name)).buffers_read)


def _init_reads(nest: LoopNest) -> list[tuple[str, sympy.Expr]]:
    init = scatter_init(nest)
    extents = loop_extents(init)
    return [(name, simplify(index, extents)) for name, index in run(ReadsWrites(), init).reads]


def overwritable_inputs(kernel: FusedKernel) -> dict[str, list[str]]:
    """Output name -> the kernel's inputs that output may be written over (see the module doc)."""
    inputs = {b.name for b in kernel.inputs}
    if kernel.is_scatter:
        nest = kernel.members[0]
        reads = _init_reads(nest)
        taken = _scattered_reads(nest)
        return {nest.name: [name for name in dict.fromkeys(n for n, _ in reads)
                            if name in inputs and name not in taken
                            and all(i == nest.store_index for n, i in reads if n == name)]}
    readers: dict[str, list[tuple[LoopNest, sympy.Expr]]] = {}
    for m in kernel.members:
        for name, index in m.reads:
            if name in inputs:
                readers.setdefault(name, []).append((m, index))
    outputs = {b.name for b in kernel.outputs}
    result: dict[str, list[str]] = {}
    for m in kernel.members:
        if m.name not in outputs or m.is_reduction:
            continue
        result[m.name] = [name for name, reads in readers.items()
                          if all(reader is m and index == m.store_index for reader, index in reads)]
    return result


def init_is_copy_of(nest: LoopNest, name: str) -> bool:
    """Are a scatter's initial values just `name` at the element they initialize? (Written over
    `name`, the scatter then has nothing to initialize.)"""
    init = scatter_init(nest)
    counts = run(OpCounter(), init).counts
    return set(counts) <= {"load"} and _init_reads(nest) == [(name, nest.store_index)]
