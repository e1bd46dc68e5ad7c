"""The fusion report of a compiled graph (`KILN_LOGS=fusion`, the debug dump): how many kernels,
how many vectorized and distinct, how many extern calls, and per kernel the ops it fused."""

from __future__ import annotations

from collections import Counter
from typing import Any

from kiln.ir.analysis import OpCounter, run
from kiln.ir.program import Program
from kiln.ir.schedule import FusedKernel, Schedule

_NOT_COMPUTING = ("load", "store", "constant", "index_expr")


def kernel_ops(kernel: FusedKernel) -> dict[str, int]:
    """The computing ops in one element of each member of `kernel`, by op name (loads, stores and
    constants not counted).

    Example::

        kernel_ops(schedule.kernels[0])  # {'add': 2, 'tanh': 1, 'exp': 1}
    """
    counts: Counter[str] = Counter()
    for member in kernel.members:
        counts.update({op: n for op, n in run(OpCounter(), member.node).counts.items() if op not in _NOT_COMPUTING})
    return dict(counts)


def kernel_line(kernel: FusedKernel, kernels: Any) -> str:
    """One kernel as the report lists it: its op count, outer loops, members (those kept in
    registers marked local) and whether it is vectorized."""
    members = ", ".join(f"{m.name}{'(local)' if m.name in kernel.locals else ''}" for m in kernel.members)
    vectorized = " vectorized" if kernels.vectorized[kernel.name] else ""
    return f"{kernel.name}: {sum(kernel_ops(kernel).values())} ops, outer {list(kernel.outer)} [{members}]{vectorized}"


def fusion_report(program: Program, schedule: Schedule, kernels: Any) -> str:
    """`kernels`: what a code generator printed (CppKernels, TritonKernels)."""
    scheduled = schedule.kernels
    lines = [f"{len(scheduled)} kernels ({sum(kernels.vectorized.values())} vectorized, {len(set(kernels.functions.values()))} distinct) and "
             f"{len(schedule.externs)} extern calls from {len(program.kernels)} IR nodes"]
    lines += [f"  {kernel_line(k, kernels)}" for k in scheduled]
    return "\n".join(lines)
