"""The memory plan (`MemoryPlan`, kiln/ir/schedule.py): when each buffer dies, and which dead
buffer's memory a new one takes.

Only memory kiln's own kernels allocate is reused; graph inputs and outputs belong to the caller.
Every other buffer, an extern's result included, is dropped right after its last reader, as eager
drops it: results held to the end of the call raise the peak, and their release all at once lets
malloc hand the heap back to the system, so the next call page-faults its memory in again. An
extern whose schema says it returns a view keeps its inputs alive as long as its outputs. A new
buffer reuses a dead one of exactly the same size, strides and dtype, so the wrapper just rebinds
a name (no allocation, and memory that is already in cache). A kernel's output may also be
written over one of its inputs that dies at that kernel (kiln/schedule/inplace.py says which
inputs a kernel can overwrite), an extern's result included unless it may view other memory."""

from __future__ import annotations

from typing import Any

from kiln.ir.nodes import Buffer, Layout
from kiln.ir.schedule import FusedKernel, MemoryPlan, step_reads
from kiln.lowering.extern_layouts import returns_view
from kiln.schedule.inplace import overwritable_inputs


def _returns_view(op: Any) -> bool:
    return returns_view(op) is not False  # an op without a schema may return anything


def plan_memory(steps: list, outputs: list, owned: dict[str, Buffer], written_back: dict[str, Buffer] | None = None) -> MemoryPlan:
    """`owned`: the buffers kernels allocate (by name), in allocation order. `written_back`: an
    output that is a mutated input's new value -> that input (Program.written_back), which its
    kernel may write over: the input is the caller's, but the call replaces its values anyway."""
    last_use: dict[str, int] = {}
    aliases: dict[str, set[str]] = {}  # extern output -> buffers it may view
    for k, step in enumerate(steps):
        reads = step_reads(step)
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

    layouts = {b.name: b.layout for step in steps for b in step.outputs if b is not None}
    plan, dead, overwritten = MemoryPlan(), [], set()
    for k, step in enumerate(steps):
        dying = _dying(last_use, k, set(layouts), kept, steps)
        if isinstance(step, FusedKernel):
            # Not a view (it would write into its base), nor viewed by another input of the kernel.
            viewed = set().union(*(aliases.get(b.name, set()) for b in step.inputs))
            overwritable = {name for name in dying if name not in aliases and name not in viewed}
            chosen = _overwrites(step, overwritable, layouts)
            chosen.update(_written_back_in_place(step, written_back or {}, last_use, k, aliases, viewed, chosen))
            plan.inplace.update(chosen)
            overwritten |= set(chosen.values())
            for out in step.outputs:
                match = next((d for d in dead if owned[d].layout == out.layout), None)
                if match is not None and out.name not in kept and out.name not in plan.inplace:
                    dead.remove(match)
                    plan.reuses[out.name] = match
        else:
            into = _conv_into_other(step, set(dying), aliases, layouts)
            if into is not None:
                plan.extern_inplace[k] = into
                overwritten.add(into)
        for name in dying:
            plan.frees.setdefault(k, []).append(name)
            if name in owned and name not in overwritten:
                dead.append(name)
    return plan


def _conv_into_other(step: Any, dying: set[str], aliases: dict[str, set[str]], layouts: dict[str, Layout]) -> str | None:
    """The residual a oneDNN `kiln::conv` may write its result over: it dies here, is an
    intermediate of this graph with the result's layout, and neither views nor is viewed by the
    convolution's other inputs."""
    if str(step.op) != "kiln.conv.default" or step.argument("impl") != "onednn" or not isinstance(step.argument("other"), Buffer):
        return None
    other, out = step.argument("other").name, step.outputs[0]
    inputs = [step.argument(name) for name in ("x", "weight", "bias")]
    others = {b.name for b in inputs if isinstance(b, Buffer)}
    others = others.union(*(aliases.get(n, set()) for n in others))
    if other not in dying or other in aliases or other in others or out is None or layouts.get(other) != out.layout:
        return None
    return other


def _overwrites(kernel: Any, dying: set[str], layouts: dict[str, Layout]) -> dict[str, str]:
    """Outputs of `kernel` written over inputs that die at it (at most one input per output).
    A graph output may be: what it overwrites is an intermediate nothing else holds."""
    chosen: dict[str, str] = {}
    for out, names in overwritable_inputs(kernel).items():
        layout = next(b.layout for b in kernel.outputs if b.name == out)
        name = next((n for n in names if n in dying and n not in chosen.values() and layouts[n] == layout), None)
        if name is not None:
            chosen[out] = name
    return chosen


def _written_back_in_place(kernel: Any, written_back: dict[str, Buffer], last_use: dict[str, int], k: int,
                           aliases: dict[str, set[str]], viewed: set[str], chosen: dict[str, str]) -> dict[str, str]:
    """Outputs of `kernel` that are new values of mutated inputs, written over those inputs: the
    input is read last by this kernel (as `overwritable_inputs` allows), not viewed, and of the
    output's layout. A scatter over it then writes only its scattered elements (a KV cache's row)."""
    found = {}
    for out, names in overwritable_inputs(kernel).items():
        target = written_back.get(out)
        layout = next(b.layout for b in kernel.outputs if b.name == out)
        if (target is not None and target.name in names and last_use.get(target.name) == k and out not in chosen
                and target.name not in viewed and not any(target.name in bases for bases in aliases.values())
                and target.layout == layout):
            found[out] = target.name
    return found


def _dying(last_use: dict[str, int], k: int, produced: set[str], kept: set[str], steps: list) -> list[str]:
    # A buffer nobody reads after the step that makes it (rows only its kernel uses) dies with it.
    step = steps[k]
    unread = [b.name for b in step.outputs if b is not None and b.name not in last_use]
    return [name for name, at in last_use.items() if at == k and name in produced and name not in kept] + \
        [name for name in unread if name not in kept]
