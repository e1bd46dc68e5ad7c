"""The Python wrapper of a scheduled graph: its wrapper plan (kiln/codegen/wrapper_plan.py) printed
as straight-line code that allocates buffers, calls the kernels and the externs in order, frees
what dies, and returns the outputs.

Generated once per graph, so a call pays no interpretation of the step list. The wrapper's text
names everything it needs; plain values (layouts, dtypes, extern arguments) go to `constants` and
ATen operators to `ops` (by qualified name), and the runtime binds both, the kernels and its
helpers (`_in_layout`, `empty_strided`, `index_error`, `_raise_index_error`) before running it
(kiln/runtime/compiled_graph.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
from torch.utils import _pytree as pytree

from kiln.codegen.index_printer import PYTHON_INDEX, print_index
from kiln.codegen.wrapper_plan import (Allocate, BindSize, CheckIndex, ExternCall, Free, InLayout, KernelCall,
                                       Return, Reuse, ToDevice, View, WrapperPlan, WriteOver, print_lines)
from kiln.ir.nodes import Buffer, Layout
from kiln.ir.program import ExternStep
from kiln.ir.sizes import unbound_symbols


@dataclass
class WrapperCode:
    source: str  # defines `call(*inputs) -> tuple of outputs`
    constants: dict[str, Any] = field(default_factory=dict)  # wrapper globals that are plain values
    ops: dict[str, str] = field(default_factory=dict)  # wrapper globals that are ATen ops, by qualified name


def _size(value: Any) -> str:
    """A size as Python source: a number, or an expression over the size symbols bound at the
    top of `call` (kiln/ir/sizes.py)."""
    return print_index(sympy.sympify(value), PYTHON_INDEX)


def _is_size(value: Any) -> bool:
    """A symbolic size the wrapper can compute (no symbol of a size computed from tensor data)."""
    return isinstance(value, sympy.Basic) and not value.is_Integer and not unbound_symbols(value)


def _sizes_strides_source(layout: Layout) -> str:
    """(sizes, strides) as a Python expression, evaluated at each call where symbolic."""
    tup = lambda xs: "(" + "".join(f"{_size(x)}, " for x in xs) + ")"  # noqa: E731
    return f"({tup(layout.size)}, {tup(layout.stride)})"


def _layout_argument(name: str, layout: Layout, constants: dict) -> str:
    """The `_in_layout` argument for a buffer: a constant for static layouts, else source."""
    if not layout.is_static:
        return _sizes_strides_source(layout)
    constants[f"layout_{name}"] = (tuple(int(s) for s in layout.size), tuple(int(s) for s in layout.stride))
    return f"layout_{name}"


def python_wrapper(plan: WrapperPlan, kernel_arguments: str = "pointers") -> WrapperCode:
    """`plan` (kiln/codegen/wrapper_plan.py) as the source of `call`; `kernel_arguments`: what a
    kernel is called with, its buffers' data pointers (C++ functions) or the tensors themselves
    (Triton launchers)."""
    if kernel_arguments not in ("pointers", "tensors"):
        raise ValueError(f"kernel_arguments must be 'pointers' or 'tensors', got {kernel_arguments!r}")
    printer = _PythonPrinter(plan, kernel_arguments)
    print_lines(printer, plan)
    code = printer.code
    body = "\n".join(f"    {line}" for line in printer.lines) or "    pass"
    params = ", ".join(p.name for p in plan.parameters)
    returns = printer.returns
    code.source = f"def call({params}):\n{body}\n    return ({', '.join(returns)}{',' if len(returns) == 1 else ''})\n"
    return code


class _PythonPrinter:
    """One method per line kind of the plan, each appending the line's Python."""

    def __init__(self, plan: WrapperPlan, kernel_arguments: str) -> None:
        self.code = WrapperCode("")
        if plan.device != "cpu":
            self.code.constants["device"] = torch.device(plan.device)
        self.pointer = ".data_ptr()" if kernel_arguments == "pointers" else ""
        self.on_device = ", device=device" if plan.device != "cpu" else ""
        self.lines: list[str] = []
        self.returns: list[str] = []

    def bind_size(self, line: BindSize) -> None:
        source = line.source if line.dim is None else f"{line.source}.shape[{line.dim}]"
        self.lines.append(f"{line.symbol.name} = {source}")

    def in_layout(self, line: InLayout) -> None:
        self.lines.append(f"{line.name} = _in_layout({line.name}, {_layout_argument(line.name, line.layout, self.code.constants)})")

    def to_device(self, line: ToDevice) -> None:
        self.lines.append(f"{line.name} = {line.name}.to(device)")

    def allocate(self, line: Allocate) -> None:
        b = line.buffer
        size = "[" + ", ".join(_size(s) for s in b.layout.size) + "]"
        stride = "[" + ", ".join(_size(s) for s in b.layout.stride) + "]"
        self.code.constants[f"dtype_{b.name}"] = b.layout.dtype
        self.lines.append(f"{b.name} = empty_strided({size}, {stride}, dtype=dtype_{b.name}{self.on_device})")

    def reuse(self, line: Reuse) -> None:
        self.lines.append(f"{line.name} = {line.dead}; del {line.dead}")

    def write_over(self, line: WriteOver) -> None:
        self.lines.append(f"{line.name} = {line.input}")

    def kernel_call(self, line: KernelCall) -> None:
        self.lines.append(f"{line.kernel}({', '.join([*(f'{b}{self.pointer}' for b in line.buffers), *line.sizes])})")

    def check_index(self, line: CheckIndex) -> None:
        self.lines.append(f"if index_error.value: _raise_index_error(index_error, {', '.join(line.kernels)!r})")

    def extern_call(self, line: ExternCall) -> None:
        self.lines += _extern_call(line.step_index, line.step, self.code)

    def view(self, line: View) -> None:
        # The schedule's views, a hundred in a BERT call: the tensor's method costs 1.4 µs, the
        # op's overload 3.6 (its Python dispatch).
        self.lines += _extern_call(line.step_index, line.step, self.code, as_method=not line.step.kwargs)

    def free(self, line: Free) -> None:
        self.lines.append(f"del {', '.join(line.names)}")

    def return_(self, line: Return) -> None:
        for k, o in enumerate(line.values):
            if isinstance(o, Buffer):
                self.returns.append(o.name)
            elif _is_size(o):
                self.returns.append(_size(o))
            else:
                self.code.constants[f"out_const{k}"] = o
                self.returns.append(f"out_const{k}")


def _op_name(op: Any) -> str | None:
    return op.name() if isinstance(op, torch._ops.OpOverload) else None


def _extern_call(k: int, step: ExternStep, code: WrapperCode, as_method: bool = False) -> list[str]:
    """The call of schedule step `k`; `as_method`: a view, called as its base tensor's method."""
    name = _op_name(step.op)
    if name is not None:
        code.ops[f"op{k}"] = name
    else:
        code.constants[f"op{k}"] = step.op  # not an ATen op: kept as is (such a graph is not cacheable)
    names: dict[str, Any] = {}

    def arg(value: Any) -> str:
        if isinstance(value, Buffer):
            return value.name
        if _is_size(value):
            return _size(value)  # computed at each call from the inputs' sizes
        if isinstance(value, sympy.Integer):
            value = int(value)
        key = f"const{k}_{len(names)}"
        names[key] = value
        return key

    args = pytree.tree_map(arg, list(step.args), is_leaf=lambda v: isinstance(v, Buffer))
    kwargs = pytree.tree_map(arg, dict(step.kwargs), is_leaf=lambda v: isinstance(v, Buffer))
    code.constants.update(names)
    if as_method:
        call = f"{args[0]}.as_strided({', '.join(_render(a) for a in args[1:])})"
    else:
        call = f"op{k}({', '.join(_render(a) for a in args)}{', ' if args and kwargs else ''}" \
               f"{', '.join(f'{key}={_render(v)}' for key, v in kwargs.items())})"
    outs, lines = step.outputs, []
    if len(outs) == 1 and outs[0] is not None:
        lines.append(f"{outs[0].name} = {call}")
    else:
        lines.append(f"_result = {call}")
        lines += [f"{b.name} = _result[{i}]" for i, b in enumerate(outs) if b is not None]
    return lines


def _render(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_render(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(_render(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return str(value)
