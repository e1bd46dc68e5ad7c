"""The fusion report of a compiled graph (`KILN_LOGS=fusion`, the debug dump): how many kernels,
how many vectorized and distinct, how many extern calls, and per kernel the ops it fused."""

from __future__ import annotations

from typing import Any

from kiln.ir.analysis import OpCounter, run
from kiln.ir.program import Program
from kiln.ir.schedule import Schedule


def _op_count(node: Any) -> int:
    """Computing ops in one element of `node` (loads, stores and constants not counted)."""
    counts = run(OpCounter(), node).counts
    return sum(n for op, n in counts.items() if op not in ("load", "store", "constant", "index_expr"))


def fusion_report(program: Program, schedule: Schedule, kernels: Any) -> str:
    """`kernels`: what a code generator printed (CppKernels, TritonKernels)."""
    scheduled = schedule.kernels
    lines = [f"{len(scheduled)} kernels ({sum(kernels.vectorized.values())} vectorized, {len(set(kernels.functions.values()))} distinct) and "
             f"{len(schedule.externs)} extern calls from {len(program.kernels)} IR nodes"]
    for k in scheduled:
        members = ", ".join(f"{m.name}{'(local)' if m.name in k.locals else ''}" for m in k.members)
        ops = sum(_op_count(m.node) for m in k.members)
        lines.append(f"  {k.name}: {ops} ops, outer {list(k.outer)} [{members}]{' vectorized' if kernels.vectorized[k.name] else ''}")
    return "\n".join(lines)
