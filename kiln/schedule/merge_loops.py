"""Adjacent loops merged into one where every access walks them as one.

ResNet's late layers are 14x14 and 7x7 planes: with 8 float lanes, a loop over 7 columns never
runs vector code and one over 14 runs one vector and six scalar steps. When every index of a
kernel moves by `s` along the outer loop of a pair and by `s / n` along the inner (n its trip
count) — a contiguous plane — the pair is one loop of `m*n` iterations (49, 196), nearly all in
vectors. Merging is tried after fusion, so it never changes which nodes share a kernel: outer
loops merge only when every member agrees, a member's own inner loops (a reduction's, a row's)
when that member does.

A merged loop `v` stands for `(v // n, v % n)`; the pair merges when, after index simplification,
no index (load, store or computed index) still divides or takes a remainder of `v`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

import sympy

from kiln.ir.analysis import ReadsWrites, run
from kiln.ir.index_bounds import linear_stride, simplify
from kiln.ir.indexing import FloorDiv, Mod
from kiln.ir.nodes import Pointwise, Reduction, index_symbols
from kiln.ir.schedule import FusedKernel, LoopNest, loop_extents


def _merged_ranges(ranges: Sequence[sympy.Expr], d: int) -> tuple[sympy.Expr, ...]:
    return (*ranges[:d], ranges[d] * ranges[d + 1], *ranges[d + 2:])


def _unmerged(index: Sequence[sympy.Expr], d: int, inner: sympy.Expr) -> list[sympy.Expr]:
    """The original index of a merged one: the merged variable split into (v // inner, v % inner)."""
    v = index[d]
    return [*index[:d], FloorDiv(v, inner), Mod(v, inner), *index[d + 1:]]


def _substitution(prefix: str, rank: int, d: int, inner: sympy.Expr) -> dict[sympy.Symbol, sympy.Expr]:
    """Old loop variables (rank of them) in terms of the merged ones."""
    return dict(zip(index_symbols(prefix, rank), _unmerged(index_symbols(prefix, rank - 1), d, inner)))


def _merge_member(nest: LoopNest, d: int, reduction: bool) -> LoopNest | None:
    """`nest` with loop pair (d, d+1) merged (of its reduction loops when `reduction`), or None
    when an access would divide or take a remainder of the merged loop."""
    node = nest.node
    if (node.reduction_ranges if reduction else node.ranges)[d + 1] == 0:
        return None  # an empty loop: nothing to gain, and no remainder by zero
    if reduction:
        inner = node.reduction_ranges[d + 1]
        fn: Callable = lambda idx, ridx: node.inner_fn(idx, _unmerged(ridx, d, inner))
        new = Reduction(node.dtype, node.ranges, _merged_ranges(node.reduction_ranges, d), node.reduction_type, fn,
                        name=node.name, src_dtype=node.src_dtype)
        store, var = nest.store_index, new.reduction_vars()[d]
    else:
        inner = node.ranges[d + 1]
        ranges = _merged_ranges(node.ranges, d)
        if isinstance(node, Reduction):
            new = Reduction(node.dtype, ranges, node.reduction_ranges, node.reduction_type,
                            lambda idx, ridx: node.inner_fn(_unmerged(idx, d, inner), ridx),
                            name=node.name, src_dtype=node.src_dtype)
        else:
            new = Pointwise(node.dtype, ranges, lambda idx: node.inner_fn(_unmerged(idx, d, inner)), name=node.name)
        store, var = nest.store_index.xreplace(_substitution("i", len(node.ranges), d, inner)), new.index_vars()[d]
    extents = loop_extents(new)
    accesses = run(ReadsWrites(), new)
    reads = [(name, simplify(index, extents)) for name, index in accesses.reads]
    store = simplify(sympy.expand(store), extents)
    computed = [simplify(index, extents) for index in accesses.index_exprs]
    if any(linear_stride(index, var) is None for index in [store, *computed, *(i for _, i in reads)]):
        return None
    return replace(nest, node=new, store_index=store, reads=reads)


def _merge_outer(kernel: FusedKernel) -> FusedKernel:
    d = len(kernel.outer) - 2
    while d >= 0:
        members = [_merge_member(m, d, reduction=False) for m in kernel.members]
        if all(m is not None for m in members):
            kernel = replace(kernel, outer=_merged_ranges(kernel.outer, d), members=members)
        d -= 1
    return kernel


def _merge_inner(kernel: FusedKernel, nest: LoopNest) -> LoopNest:
    """`nest`'s own loops merged: a reduction's reduction loops, a pointwise member's inner ones."""
    if nest.is_reduction:
        first, count = 0, len(nest.node.reduction_ranges)
    else:
        first, count = len(kernel.outer), len(nest.ranges)
    d = count - 2
    while d >= first:
        merged = _merge_member(nest, d, reduction=nest.is_reduction)
        if merged is not None:
            nest = merged
        d -= 1
    return nest


def merge_loops(kernel: FusedKernel) -> FusedKernel:
    """`kernel` with the adjacent loops merged that every access walks as one (module doc)."""
    if kernel.is_scatter:
        return kernel
    kernel = _merge_outer(kernel)
    return replace(kernel, members=[_merge_inner(kernel, m) for m in kernel.members])
