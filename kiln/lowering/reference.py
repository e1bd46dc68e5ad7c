"""Runs a Program with the IR's reference executor and PyTorch's kernels for externs: a slow,
code-generator-free oracle for lowerings (and the graph compiler of the `kiln_ir_reference` tests)."""

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


def run_program(program: Program, args: Sequence[Any]) -> tuple:
    tensors: dict[str, torch.Tensor] = {}
    for buffer, arg in zip(program.inputs, args):
        if buffer is not None:
            tensors[buffer.name] = arg
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
                    tensors[buffer.name] = value
    return tuple(tensors[o.name] if isinstance(o, Buffer) else o for o in program.outputs)


def compile_reference(gm: fx.GraphModule, example_inputs: Sequence[Any]):
    """A graph compiler for `kiln.aot.compile`: lower once, run by reference evaluation."""
    program = GraphLowering(gm).lower()
    runner = lambda *args: run_program(program, args)  # noqa: E731
    runner.program = program
    return runner
