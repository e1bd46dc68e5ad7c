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
        self.checks_indices: set[str] = set()  # kernels with indirect indexing: check the error flag after
        for step in program.kernels:
            if not is_static(step.node):
                raise NotImplementedError("C++ kernels with symbolic sizes")
            inputs = [buffers[name] for name in buffers_read(step.node)]
            self.reads[step.buffer.name] = inputs
            sources.append(kernel_source(f"kernel_{step.buffer.name}", step.node, step.buffer, inputs))
            if "kiln_index(" in sources[-1]:
                self.checks_indices.add(step.buffer.name)
        self.source = "\n\n".join(sources)
        library = load_library(self.source) if program.kernels else None
        self.kernels = {}
        self.index_error = ctypes.c_int.in_dll(library, "kiln_index_error") if library is not None else None
        for step in program.kernels:
            fn = getattr(library, f"kernel_{step.buffer.name}")
            fn.argtypes = [ctypes.c_void_p] * (len(self.reads[step.buffer.name]) + 1)
            fn.restype = None
            self.kernels[step.buffer.name] = fn

        self.call = self._generate_call()

    def _generate_call(self):
        """The program as straight-line Python: allocate, call kernels and externs, return outputs.
        Generated once, so a call pays no interpretation of the step list."""
        lines, scope = [], {"torch": torch, "_in_layout": _in_layout, "empty_strided": torch.empty_strided,
                            "index_error": self.index_error, "_raise_index_error": _raise_index_error}
        params = [b.name if b is not None else f"_unused{k}" for k, b in enumerate(self.program.inputs)]
        for b in self.program.inputs:
            if b is not None:
                scope[f"layout_{b.name}"] = b.layout
                lines.append(f"{b.name} = _in_layout({b.name}, layout_{b.name})")
        for k, step in enumerate(self.program.steps):
            if isinstance(step, ComputeStep):
                size, stride = _ints(step.buffer.layout)
                name = step.buffer.name
                scope[f"kernel_{name}"] = self.kernels[name]
                scope[f"dtype_{name}"] = step.buffer.layout.dtype
                ptrs = ", ".join(f"{b.name}.data_ptr()" for b in self.reads[name])
                lines.append(f"{name} = empty_strided({size}, {stride}, dtype=dtype_{name})")
                lines.append(f"kernel_{name}({ptrs + ', ' if ptrs else ''}{name}.data_ptr())")
                if name in self.checks_indices:
                    lines.append(f"if index_error.value: _raise_index_error(index_error, {name!r})")
            else:
                scope[f"op{k}"] = step.op
                names = {}

                def arg(value: Any) -> str:
                    if isinstance(value, Buffer):
                        return value.name
                    key = f"const{k}_{len(names)}"
                    names[key] = value
                    return key

                args = pytree.tree_map(arg, list(step.args), is_leaf=lambda v: isinstance(v, Buffer))
                kwargs = pytree.tree_map(arg, dict(step.kwargs), is_leaf=lambda v: isinstance(v, Buffer))
                scope.update(names)
                call = f"op{k}({', '.join(_render(a) for a in args)}{', ' if args and kwargs else ''}" \
                       f"{', '.join(f'{key}={_render(v)}' for key, v in kwargs.items())})"
                outs = step.outputs
                if len(outs) == 1 and outs[0] is not None:
                    lines.append(f"{outs[0].name} = {call}")
                else:
                    lines.append(f"_result = {call}")
                    lines += [f"{b.name} = _result[{i}]" for i, b in enumerate(outs) if b is not None]
                for b in outs:
                    if b is not None and step.op is not torch.ops.aten.as_strided.default:
                        scope[f"layout_{b.name}"] = b.layout
                        lines.append(f"{b.name} = _in_layout({b.name}, layout_{b.name})")
        returns = []
        for k, o in enumerate(self.program.outputs):
            if isinstance(o, Buffer):
                returns.append(o.name)
            else:
                scope[f"out_const{k}"] = o
                returns.append(f"out_const{k}")
        body = "\n".join(f"    {line}" for line in lines) or "    pass"
        self.python = f"def call({', '.join(params)}):\n{body}\n    return ({', '.join(returns)}{',' if len(returns) == 1 else ''})\n"
        exec(compile(self.python, "<kiln wrapper>", "exec"), scope)
        return scope["call"]

    def __call__(self, *args: Any) -> tuple:
        return self.call(*args)


def _raise_index_error(flag: ctypes.c_int, kernel: str) -> None:
    flag.value = 0
    raise IndexError(f"index out of range in kiln kernel {kernel} (an indexing op read outside its input)")


def _render(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_render(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(_render(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return str(value)


def compile_cpp(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> CppProgram:
    """Lower `gm` and compile its kernels; the result runs the graph."""
    return CppProgram(GraphLowering(gm).lower())
