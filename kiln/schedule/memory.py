"""The memory plan: when each buffer dies, and which dead buffer's memory a new one takes.

Only memory kiln's own kernels allocate is planned; graph inputs, outputs and extern results
belong to others. An extern whose schema says it returns a view keeps its inputs alive as long
as its outputs. A new buffer reuses a dead one of exactly the same size, strides and dtype, so
the wrapper just rebinds a name (no allocation, and memory that is already in cache)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch.utils import _pytree as pytree

from kiln.ir.nodes import Buffer


@dataclass
class MemoryPlan:
    frees: dict[int, list[str]] = field(default_factory=dict)  # step -> buffers dead after it
    reuses: dict[str, str] = field(default_factory=dict)  # new buffer -> dead buffer it takes over


def _returns_view(op: Any) -> bool:
    schema = getattr(op, "_schema", None)
    return schema is None or any(r.alias_info is not None for r in schema.returns)


def _step_reads(step: Any) -> list[str]:
    from kiln.schedule.fusion import FusedKernel

    if isinstance(step, FusedKernel):
        return [b.name for b in step.inputs]
    return [b.name for b in pytree.tree_leaves((step.args, step.kwargs)) if isinstance(b, Buffer)]


def plan_memory(steps: list, outputs: list, owned: dict[str, Buffer]) -> MemoryPlan:
    """`owned`: the buffers kernels allocate (by name), in allocation order."""
    from kiln.schedule.fusion import FusedKernel

    last_use: dict[str, int] = {}
    aliases: dict[str, set[str]] = {}  # extern output -> buffers it may view
    for k, step in enumerate(steps):
        reads = _step_reads(step)
        for name in reads:
            for base in {name} | aliases.get(name, set()):
                last_use[base] = k
        if not isinstance(step, FusedKernel) and _returns_view(step.op):
            bases = set().union(*({r} | aliases.get(r, set()) for r in reads)) if reads else set()
            for out in step.outputs:
                if out is not None:
                    aliases[out.name] = bases
    kept = set()
    for o in outputs:
        if isinstance(o, Buffer):
            kept |= {o.name} | aliases.get(o.name, set())

    plan, dead = MemoryPlan(), []
    for k, step in enumerate(steps):
        if isinstance(step, FusedKernel):
            for out in step.outputs:
                match = next((d for d in dead if owned[d].layout == out.layout), None)
                if match is not None and out.name not in kept:
                    dead.remove(match)
                    plan.reuses[out.name] = match
        for name in _dying(last_use, k, owned, kept, steps):
            plan.frees.setdefault(k, []).append(name)
            dead.append(name)
    return plan


def _dying(last_use: dict[str, int], k: int, owned: dict[str, Buffer], kept: set[str], steps: list) -> list[str]:
    # A buffer nobody reads after its own kernel (rows only that kernel uses) dies with it.
    from kiln.schedule.fusion import FusedKernel

    step = steps[k]
    unread = [b.name for b in step.outputs if b.name not in last_use] if isinstance(step, FusedKernel) else []
    return [name for name, at in last_use.items() if at == k and name in owned and name not in kept] + \
        [name for name in unread if name not in kept]
