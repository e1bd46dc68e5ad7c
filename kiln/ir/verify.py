"""IR invariants: `verify(node)` for one node, `verify_program(program)` for a lowered graph.

The tests check every lowered Program; `KILN_VERIFY=1` makes the driver check each graph after
lowering (and the scheduler's invariants after scheduling, kiln/schedule/verify.py).
"""

from __future__ import annotations

from typing import Iterable

import sympy
import torch

from kiln.ir.analysis import ReadsWrites, run
from kiln.ir.nodes import Node, Reduction, Scatter
from kiln.ir.program import ComputeStep, Program


class IRError(ValueError):
    """An IR node breaks an invariant; the message names the node and the rule."""


def _is_index_symbol(sym: sympy.Symbol) -> bool:
    name = sym.name
    return len(name) > 1 and name[0] in "ir" and name[1:].isdigit()


def _inner_ranges(node: Node) -> tuple:
    if isinstance(node, Reduction):
        return node.reduction_ranges
    return node.source_ranges if isinstance(node, Scatter) else ()


def _inner_vars(node: Node) -> tuple:
    if isinstance(node, Reduction):
        return node.reduction_vars()
    return node.source_vars() if isinstance(node, Scatter) else ()


def verify(node: Node, known_buffers: Iterable[str] | None = None) -> None:
    """Raise IRError unless `node` is well formed: a torch dtype, integer-valued ranges, a body that
    runs under the protocol, loads only from known buffers, and indices only over its own loops."""
    label = node.name or type(node).__name__
    if not isinstance(node.dtype, torch.dtype):
        raise IRError(f"{label}: dtype must be a torch.dtype, got {node.dtype!r}")
    ranges = list(node.ranges) + list(_inner_ranges(node))
    for r in ranges:
        if r.is_integer is False or (r.is_number and r < 0):
            raise IRError(f"{label}: range {r} is not a non-negative integer")
    if isinstance(node, Reduction) and not node.reduction_ranges:
        raise IRError(f"{label}: a Reduction needs at least one reduction range")
    try:
        deps = run(ReadsWrites(), node)
    except Exception as e:  # noqa: BLE001 - any failure of the body is the node's fault
        raise IRError(f"{label}: body fails under the ops protocol: {type(e).__name__}: {e}") from e
    own = set(node.index_vars()) | set(_inner_vars(node))
    for expr in [index for _, index in deps.reads + deps.writes] + deps.index_exprs:
        stray = {s for s in expr.free_symbols if _is_index_symbol(s) and s not in own}
        if stray:
            raise IRError(f"{label}: index {expr} uses loop variables {sorted(map(str, stray))} it does not own")
    if known_buffers is not None:
        unknown = [b for b in deps.buffers_read if b not in set(known_buffers)]
        if unknown:
            raise IRError(f"{label}: loads from unknown buffers {unknown}")


def verify_program(program: Program) -> None:
    """Every node passes `verify`, reading only buffers defined before it (inputs, earlier steps)."""
    known = {b.name for b in program.inputs if b is not None}
    for step in program.steps:
        if isinstance(step, ComputeStep):
            verify(step.node, known)
            known.add(step.buffer.name)
        else:
            known.update(b.name for b in step.outputs if b is not None)
    missing = [o.name for o in program.outputs if hasattr(o, "name") and o.name not in known]
    if missing:
        raise IRError(f"program outputs {missing} are never computed")
