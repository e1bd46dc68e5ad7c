"""One compiled graph checked stage by stage on the inputs of one of its calls: its ATen graph
against the loop-IR reference (the lowering), and each generated kernel, run alone on the
reference values of its inputs, against the reference values of its outputs.

The reference (kiln/lowering/reference.py) computes every buffer of the graph's Program: each
IR node by the reference executor (kiln/ir/evaluate.py, PyTorch ops over whole tensors), each
extern by calling its operator. A kernel runs alone through a wrapper printed, by the graph's own
code generator, from a schedule of that kernel only (`kernel_alone`), over the kernels the graph
already loaded. Given reference inputs, a kernel downstream of a wrong one still matches: the
check names the kernels that are wrong themselves.

Example::

    checks = check_graph(graph, recorded_inputs)
    [k.function for k in checks.kernels if not k.difference.ok]  # ['kernel_93565f38a12a286b']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from kiln.backend.codegens import CODEGENS
from kiln.backend.report import kernel_line, kernel_ops
from kiln.codegen.wrapper_plan import wrapper_plan
from kiln.debug.tolerance import Difference, Tolerance, compare
from kiln.ir.nodes import Buffer
from kiln.ir.schedule import FusedKernel, MemoryPlan, Schedule
from kiln.lowering.reference import reference_buffers
from kiln.runtime.compiled_graph import CompiledGraph


@dataclass(frozen=True)
class KernelCheck:
    kernel: str  # its name in the schedule and the fusion report: "kernel3"
    function: str  # the generated function, as in the KILN_DEBUG_DIR dump: "kernel_93565f38a12a286b"
    ops: dict[str, int]  # the computing ops of its IR nodes, per element
    description: str  # its line of the fusion report: ops, loops, IR nodes
    difference: Difference  # its outputs against the reference's


@dataclass
class GraphCheck:
    lowering: Difference  # the loop-IR reference's outputs against the ATen graph's
    kernels: list[KernelCheck] = field(default_factory=list)

    @property
    def wrong_kernels(self) -> list[KernelCheck]:
        return [k for k in self.kernels if not k.difference.ok]


def kernel_alone(kernel: FusedKernel) -> Schedule:
    """A schedule of `kernel` only: what it reads in (the inputs it writes over included, which
    the memory plan gives it again), what it stores out."""
    written_over = list(kernel.overwrites.values())
    memory = MemoryPlan(inplace={output: input.name for output, input in kernel.overwrites.items()})
    return Schedule([*kernel.inputs, *written_over], [kernel], list(kernel.outputs), memory)


def _checkable(graph: CompiledGraph) -> str | None:
    """Why the graph's kernels cannot be checked, or None."""
    if graph.stages is None:
        return "it was loaded from the AOT graph cache (no Program to check against)"
    schedule = graph.stages.schedule
    if schedule.size_inputs or not all(k.has_static_sizes for k in schedule.kernels):
        return "it has symbolic sizes (the reference executor needs numbers)"
    return None


def _fresh(value: Any, buffer: Buffer, written: set[str]) -> Any:
    """A reference value as a kernel's argument: a copy where the kernel writes over it."""
    if buffer.name not in written:
        return value
    return torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device=value.device).copy_(value)


def check_kernel(graph: CompiledGraph, kernel: FusedKernel, reference: dict[str, torch.Tensor],
                 tolerance: Tolerance) -> KernelCheck:
    """`kernel` of `graph` run alone on `reference`'s values of its inputs, against its outputs'."""
    stages, artifact = graph.stages, graph.artifact
    alone = kernel_alone(kernel)
    checks = set(stages.kernels.checks) & {kernel.name}
    plan = wrapper_plan(alone, checks, stages.kernels.size_arguments, artifact.device)
    call = graph.other_call(CODEGENS[artifact.codegen].python_wrapper(plan))
    written = {b.name for b in kernel.overwrites.values()}
    outputs = call(*(_fresh(reference[b.name], b, written) for b in alone.inputs))
    worst = Difference()
    for buffer, output in zip(kernel.outputs, outputs):
        found = compare(reference[buffer.name], output, tolerance, name=buffer.name)
        worst = found if found.ratio > worst.ratio else worst
    return KernelCheck(kernel.name, artifact.kernels[kernel.name][0], kernel_ops(kernel),
                       kernel_line(kernel, stages.kernels), worst)


def check_graph(graph: CompiledGraph, inputs: Sequence[Any], tolerance: Tolerance = Tolerance()) -> GraphCheck:
    """`graph`'s lowering and each of its kernels, on `inputs` (one call's, as the graph got them).
    Raises NotImplementedError, saying why, for a graph that cannot be checked."""
    reason = _checkable(graph)
    if reason is not None:
        raise NotImplementedError(reason)
    stages = graph.stages
    reference = reference_buffers(stages.program, inputs)
    expected = tuple(stages.graph(*inputs))
    lowered = tuple(reference[o.name] if isinstance(o, Buffer) else o for o in stages.program.outputs)
    checks = GraphCheck(compare(expected, lowered, tolerance))
    for kernel in stages.schedule.kernels:
        checks.kernels.append(check_kernel(graph, kernel, reference, tolerance))
    return checks
