"""A lowered Program as a callable: C++ kernels compiled once per graph, externs through PyTorch.

`compile_cpp(gm, example_inputs)` is a graph compiler for `kiln.aot.compile`. Today's limits: all
sizes static (symbolic ones raise NotImplementedError), scalar (not yet vectorized) loops.
"""

from __future__ import annotations

import ctypes
from typing import Any, Sequence

import torch
from torch import fx
from torch.utils import _pytree as pytree

from kiln.codegen.cpp.kernel import HEADER, buffers_read, is_static, kernel_source
from kiln.ir.nodes import Buffer, Layout
from kiln.lowering.graph import ComputeStep, GraphLowering, Program
from kiln.runtime.cpp_compile import load_library


def _ints(layout: Layout) -> tuple[list[int], list[int]]:
    return [int(s) for s in layout.size], [int(s) for s in layout.stride]


def _in_layout(t: torch.Tensor, layout: Layout) -> torch.Tensor:
    # Kernels were generated for these strides; a tensor laid out otherwise is copied to them.
    size, stride = _ints(layout)
    if list(t.stride()) == stride or t.numel() <= 1:
        return t
    return torch.empty_strided(size, stride, dtype=t.dtype).copy_(t)


class CppProgram:
    def __init__(self, program: Program) -> None:
        self.program = program
        buffers: dict[str, Buffer] = {b.name: b for b in program.inputs if b is not None}
        for step in program.steps:
            for b in [step.buffer] if isinstance(step, ComputeStep) else step.outputs:
                if b is not None:
                    buffers[b.name] = b
        self.reads: dict[str, list[Buffer]] = {}
        sources = [HEADER]
        for step in program.kernels:
            if not is_static(step.node):
                raise NotImplementedError("C++ kernels with symbolic sizes")
            inputs = [buffers[name] for name in buffers_read(step.node)]
            self.reads[step.buffer.name] = inputs
            sources.append(kernel_source(f"kernel_{step.buffer.name}", step.node, step.buffer, inputs))
        self.source = "\n\n".join(sources)
        library = load_library(self.source) if program.kernels else None
        self.kernels = {}
        for step in program.kernels:
            fn = getattr(library, f"kernel_{step.buffer.name}")
            fn.argtypes = [ctypes.c_void_p] * (len(self.reads[step.buffer.name]) + 1)
            fn.restype = None
            self.kernels[step.buffer.name] = fn

    def __call__(self, *args: Any) -> tuple:
        tensors: dict[str, torch.Tensor] = {}
        for buffer, arg in zip(self.program.inputs, args):
            if buffer is not None:
                tensors[buffer.name] = _in_layout(arg, buffer.layout)
        for step in self.program.steps:
            if isinstance(step, ComputeStep):
                size, stride = _ints(step.buffer.layout)
                out = torch.empty_strided(size, stride, dtype=step.buffer.layout.dtype)
                ptrs = [tensors[b.name].data_ptr() for b in self.reads[step.buffer.name]]
                self.kernels[step.buffer.name](*ptrs, out.data_ptr())
                tensors[step.buffer.name] = out
            else:
                call_args, call_kwargs = pytree.tree_map_only(Buffer, lambda b: tensors[b.name], (step.args, step.kwargs))
                result = step.op(*call_args, **call_kwargs)
                for buffer, value in zip(step.outputs, result if isinstance(result, (tuple, list)) else [result]):
                    if buffer is not None:
                        tensors[buffer.name] = _in_layout(value, buffer.layout)
        return tuple(tensors[o.name] if isinstance(o, Buffer) else o for o in self.program.outputs)


def compile_cpp(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> CppProgram:
    """Lower `gm` and compile its kernels; the result runs the graph."""
    return CppProgram(GraphLowering(gm).lower())
