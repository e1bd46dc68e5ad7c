"""The scheduling pipeline over a lowered Program: drop nodes nobody reads, give pointwise nodes
their loop order, fuse nodes into kernels, merge loops that walk memory as one, keep
kernel-private results in registers, plan memory."""

from __future__ import annotations

from typing import Any

from kiln import config
from kiln.ir.analysis import ReadsWrites, run
from kiln.ir.nodes import Buffer
from kiln.ir.program import ComputeStep, ExternStep, Program
from kiln.ir.schedule import FusedKernel, LoopNest, Schedule, step_reads
from kiln.ir.target import Target
from kiln.schedule.fusion import KernelBuilder
from kiln.schedule.gemm_template import gemm_templates
from kiln.schedule.inplace import init_is_copy_of, scatter_init
from kiln.schedule.loop_order import ordered_nest
from kiln.schedule.memory import plan_memory
from kiln.schedule.merge_loops import merge_loops


def live_steps(program: Program) -> list[ComputeStep | ExternStep]:
    """The program's steps without compute nodes whose results nobody reads."""
    needed = {o.name for o in program.outputs if isinstance(o, Buffer)}
    kept = []
    for step in reversed(program.steps):
        if isinstance(step, ComputeStep):
            if step.buffer.name not in needed:
                continue
            needed.update(run(ReadsWrites(), step.node).buffers_read)
        else:
            needed.update(step_reads(step))
        kept.append(step)
    return kept[::-1]


def _group(steps: list[ComputeStep | ExternStep]) -> list[FusedKernel | ExternStep]:
    """Greedy fusion in program order: a node joins the latest kernel when it fits and everything
    it reads from outside that kernel already exists at the kernel's position."""
    placed: list[Any] = []
    available: set[str] = set()  # buffers written by steps placed so far
    builder: KernelBuilder | None = None
    available_at_builder: set[str] = set()
    for step in steps:
        if isinstance(step, ExternStep):
            placed.append(step)
            available |= {b.name for b in step.outputs if b is not None}
            continue
        nest = ordered_nest(step.buffer, step.node)
        reads = {name for name, _ in nest.reads}
        if builder is not None:
            inside = set(builder.kernel.written)
            outside_ok = all(r in inside or r in available_at_builder or r not in available for r in reads)
            if outside_ok and builder.accepts(nest):
                available.add(nest.name)
                continue
        builder = KernelBuilder(f"kernel{len(placed)}", nest, len(placed))
        available_at_builder = set(available)
        placed.append(builder.kernel)
        available.add(nest.name)
    return placed


def _finish(steps: list, outputs: list[Any], buffers: dict[str, Buffer]) -> None:
    """Locals, inputs and outputs of each kernel, once every reader is known."""
    readers: dict[str, set[int]] = {}
    for k, step in enumerate(steps):
        reads = step_reads(step) if isinstance(step, ExternStep) else {n for m in step.members for n, _ in m.reads}
        for name in reads:
            readers.setdefault(name, set()).add(k)
    results = {o.name for o in outputs if isinstance(o, Buffer)}
    for k, step in enumerate(steps):
        if not isinstance(step, FusedKernel):
            continue
        for m in step.members:
            private = readers.get(m.name, set()) <= {k} and m.name not in results
            if private and len(m.ranges) == len(step.outer) and not m.is_scatter:  # one value per outer iteration
                step.locals.add(m.name)
            else:
                step.outputs.append(m.buffer)
        written = step.written
        names = dict.fromkeys(name for m in step.members for name, _ in m.reads if name not in written)
        step.inputs = [buffers[name] for name in names]


def _scatter_init_nest(kernel: FusedKernel) -> LoopNest | None:
    """The loop that writes a scatter kernel's initial values, unless the input its output is
    written over already holds them."""
    nest = kernel.members[0]
    overwritten = kernel.overwrites.get(nest.name)
    if overwritten is not None and init_is_copy_of(nest, overwritten.name):
        return None
    return ordered_nest(nest.buffer, scatter_init(nest))


GEMM_TEMPLATE_SETTINGS = ("auto", "always", "timed", "never")


def gemm_template_mode(target: Target) -> str:
    """How matrix products meet their pointwise consumers in Triton kernels (setting
    `backend.triton_gemm`): "fused" (the product computed in the consumer's kernel), "timed" (the
    kernel times that template against the library's product, then the consumer, at its first
    call and keeps the faster) or "never". `auto` is "fused" on CPU (the interpreter, where the
    template is what is being tested: its times say nothing about a GPU) and "timed" on a GPU,
    where with `backend.autotune` off nothing is timed and the library computes every product."""
    wanted = config.backend.triton_gemm
    if wanted not in GEMM_TEMPLATE_SETTINGS:
        raise ValueError(f"backend.triton_gemm (KILN_TRITON_GEMM) must be one of {', '.join(GEMM_TEMPLATE_SETTINGS)}; "
                         f"got {wanted!r}")
    if wanted == "auto":
        if target.device == "cpu":
            return "fused"
        return "never" if config.backend.autotune == "off" else "timed"
    return {"always": "fused"}.get(wanted, wanted)


def schedule(program: Program, target: Target | None = None) -> Schedule:
    """The program's steps as fused kernels and externs, with a memory plan. For a `target`
    whose code generator computes matrix products inside kernels (Triton), products move into
    the kernels that consume them (gemm_template.py)."""
    steps = [merge_loops(s) if isinstance(s, FusedKernel) else s for s in _group(live_steps(program))]
    buffers = {b.name: b for b in program.inputs if b is not None}
    for step in program.steps:
        for b in [step.buffer] if isinstance(step, ComputeStep) else step.outputs:
            if b is not None:
                buffers[b.name] = b
    _finish(steps, program.outputs, buffers)
    if target is not None and target.codegen.gemm_templates and gemm_template_mode(target) != "never":
        steps = gemm_templates(steps, program.outputs)
    owned = {b.name: b for s in steps if isinstance(s, FusedKernel) for b in s.outputs}
    inputs = {b.name: b for b in program.inputs if b is not None}
    memory = plan_memory(steps, program.outputs, owned, {out: inputs[name] for out, name in program.written_back.items()})
    for kernel in (s for s in steps if isinstance(s, FusedKernel)):
        kernel.overwrites = {b.name: buffers[memory.inplace[b.name]] for b in kernel.outputs if b.name in memory.inplace}
        taken = {b.name for b in kernel.overwrites.values()}
        kernel.inputs = [b for b in kernel.inputs if b.name not in taken]  # read through the output's pointer
        if kernel.is_scatter:
            kernel.scatter_init = _scatter_init_nest(kernel)
    return Schedule(program.inputs, steps, program.outputs, memory, program.size_inputs)
