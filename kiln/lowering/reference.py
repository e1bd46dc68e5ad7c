"""Runs a Program with the IR's reference executor and PyTorch's kernels for externs: a slow,
code-generator-free oracle for lowerings (and the graph compiler of the `kiln_ir_reference` tests),
and the reference each generated kernel is checked against by kiln.debug.bisect."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import fx
from torch.utils import _pytree as pytree

from kiln.ir.evaluate import evaluate
from kiln.ir.nodes import Buffer
from kiln.ir.program import ComputeStep, Program
from kiln.lowering.graph import GraphLowering


def _concrete(layout) -> tuple[list[int], list[int], int]:
    return [int(s) for s in layout.size], [int(s) for s in layout.stride], int(layout.offset)


def _write(out: torch.Tensor, value: torch.Tensor) -> None:
    # A layout with stride-0 dims (an expanded graph output) holds one element per such dim.
    for d, (size, stride) in enumerate(zip(out.shape, out.stride())):
        if stride == 0 and size > 1:
            out, value = out.narrow(d, 0, 1), value.narrow(d, 0, 1)
    out.copy_(value)


def _in_layout(value: Any, buffer: Buffer) -> Any:
    """`value` with the strides of `buffer`'s static layout, as the wrapper passes it to the kernels
    (a load reads the flat storage through the layout's strides)."""
    layout = buffer.layout
    if not isinstance(value, torch.Tensor) or not layout.is_static or value.numel() <= 1:
        return value
    size, stride, offset = _concrete(layout)
    if list(value.stride()) == stride or offset != 0:
        return value
    out = torch.empty_strided(size, stride, dtype=value.dtype, device=value.device)
    _write(out, value)
    return out


def reference_buffers(program: Program, args: Sequence[Any]) -> dict[str, torch.Tensor]:
    """Every buffer of `program` by name, computed from `args`: each compute step by the reference
    executor, each extern by calling its operator. Inputs and extern results are laid out as the
    lowering recorded (as the wrapper lays them out for the kernels).

    Example::

        buffers = reference_buffers(graph.program, inputs)
        buffers["buf3"]  # what a kernel that stores buf3 should have stored
    """
    tensors: dict[str, torch.Tensor] = {}
    for buffer, arg in zip(program.inputs, args):
        if buffer is not None:
            tensors[buffer.name] = _in_layout(arg, buffer)
    for step in program.steps:
        if isinstance(step, ComputeStep):
            size, stride, offset = _concrete(step.buffer.layout)
            out = torch.empty_strided(size, stride, dtype=step.buffer.layout.dtype)
            _write(out, evaluate(step.node, tensors))
            tensors[step.buffer.name] = out
        else:
            call_args, call_kwargs = pytree.tree_map_only(Buffer, lambda b: tensors[b.name], (step.args, step.kwargs))
            result = step.op(*call_args, **call_kwargs)
            results = result if isinstance(result, (tuple, list)) else [result]
            for buffer, value in zip(step.outputs, results):
                if buffer is not None:
                    tensors[buffer.name] = _in_layout(value, buffer)
    return tensors


def run_program(program: Program, args: Sequence[Any]) -> tuple:
    """The program's outputs for `args`, computed by reference."""
    tensors = reference_buffers(program, args)
    return tuple(tensors[o.name] if isinstance(o, Buffer) else o for o in program.outputs)


def compile_reference(gm: fx.GraphModule, example_inputs: Sequence[Any]):
    """A graph compiler for `kiln.aot.compile`: lower once, run by reference evaluation."""
    program = GraphLowering(gm).lower()
    runner = lambda *args: run_program(program, args)  # noqa: E731
    runner.program = program
    return runner
