"""Invariants of a Schedule, checked by the driver after scheduling under `KILN_VERIFY=1`.

Every kernel member passes the node verifier; a step reads only buffers that exist by then (graph
inputs, outputs of earlier steps, the kernel's own members); a buffer the memory plan frees is
never read after; the kernel a buffer is written over by is the last reader of that buffer. A
kernel's matrix product (`FusedKernel.gemm`) is available to its members.
"""

from __future__ import annotations

from torch.utils import _pytree as pytree

from kiln.ir.nodes import Buffer
from kiln.ir.schedule import FusedKernel, Schedule
from kiln.ir.verify import IRError, verify


def _reads(step) -> set[str]:
    if isinstance(step, FusedKernel):
        return {b.name for b in step.inputs} | {b.name for b in step.overwrites.values()}
    return {b.name for b in pytree.tree_leaves((step.args, step.kwargs)) if isinstance(b, Buffer)}


def verify_schedule(schedule: Schedule) -> None:
    """Raise IRError naming the step and the rule it breaks."""
    available = {b.name for b in schedule.inputs if b is not None}
    freed: dict[str, int] = {}
    for k, step in enumerate(schedule.steps):
        label = step.name if isinstance(step, FusedKernel) else f"step {k} (extern {step.op})"
        reads = _reads(step)
        missing = sorted(reads - available)
        if missing:
            raise IRError(f"{label}: reads {missing} before any step writes them")
        dead = sorted(name for name in reads if name in freed)
        if dead:
            raise IRError(f"{label}: reads {dead}, freed after step {freed[dead[0]]}")
        if isinstance(step, FusedKernel):
            own = set(available) | set(step.written)
            if step.gemm is not None:  # the product the kernel computes first, in registers
                own.add(step.gemm.product.name)
            for member in step.members:
                verify(member.node, own)
            available |= {b.name for b in step.outputs}
        else:
            available |= {b.name for b in step.outputs if b is not None}
        for name in schedule.memory.frees.get(k, []):
            freed[name] = k
    results = [o.name for o in schedule.outputs if isinstance(o, Buffer)]
    missing = [name for name in results if name not in available]
    if missing:
        raise IRError(f"schedule outputs {missing} are never written")
