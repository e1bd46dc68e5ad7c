"""The Python wrapper of a scheduled graph: straight-line code that allocates buffers, calls the
kernels and the externs in order, frees what dies, and returns the outputs.

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
from kiln.externs.prepacked import IN_PLACE_CONV_IMPL
from kiln.ir.nodes import Buffer, Layout
from kiln.ir.program import ExternStep
from kiln.ir.schedule import FusedKernel, MemoryPlan, Schedule
from kiln.ir.sizes import is_size_symbol, unbound_symbols


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


def _size_bindings(schedule: Schedule) -> list[str]:
    """`ks<n> = <input>.shape[d]` for each size symbol, from the first input that has it as a dim."""
    lines, bound = [], set()
    for k, symbol in schedule.size_inputs.items():
        lines.append(f"{symbol.name} = {_param(schedule, k)}")
        bound.add(symbol)
    for b in schedule.inputs:
        for d, size in enumerate(b.layout.size if b is not None else ()):
            if is_size_symbol(size) and size not in bound:
                lines.append(f"{size.name} = {b.name}.shape[{d}]")
                bound.add(size)
    return lines


def _param(schedule: Schedule, k: int) -> str:
    b = schedule.inputs[k]
    if b is not None:
        return b.name
    return schedule.size_inputs[k].name + "_input" if k in schedule.size_inputs else f"_unused{k}"


def _op_name(op: Any) -> str | None:
    return op.name() if isinstance(op, torch._ops.OpOverload) else None


def python_wrapper(schedule: Schedule, checks: set[str], kernel_arguments: str = "pointers",
                   device: str = "cpu", host_inputs: frozenset[str] = frozenset(),
                   size_arguments: dict[str, list[str]] | None = None) -> WrapperCode:
    """`schedule` as the source of `call`; `checks`: kernels after which the index-error flag is
    read; `kernel_arguments`: what a kernel is called with, its buffers' data pointers (C++
    functions) or the tensors themselves (Triton launchers); `device`: where buffers are allocated;
    `host_inputs`: inputs of a GPU graph that arrive on the CPU, moved to the device on entry.
    `size_arguments`: the size symbols each kernel takes after its buffers. On a GPU the flag is
    read once, after the last kernel: reading it waits for the device, which after every kernel
    would stall the host's launches."""
    size_arguments = size_arguments or {}
    if kernel_arguments not in ("pointers", "tensors"):
        raise ValueError(f"kernel_arguments must be 'pointers' or 'tensors', got {kernel_arguments!r}")
    code = WrapperCode("")
    if device != "cpu":
        code.constants["device"] = torch.device(device)
    lines = []
    params = [_param(schedule, k) for k in range(len(schedule.inputs))]
    lines += _size_bindings(schedule)
    for b in schedule.inputs:
        if b is not None:
            lines.append(f"{b.name} = _in_layout({b.name}, {_layout_argument(b.name, b.layout, code.constants)})")
            if b.name in host_inputs:
                # Eager lets host tensors (a 0-dim scalar, a CPU index) mix with GPU ones; a
                # kernel reads device memory only.
                lines.append(f"{b.name} = {b.name}.to(device)")
    memory = schedule.memory
    reused = set(memory.reuses.values())
    read_at_end = [] if device != "cpu" else None
    for k, step in enumerate(schedule.steps):
        if isinstance(step, FusedKernel):
            check = step.name in checks
            if check and read_at_end is not None:
                read_at_end.append(step.name)
                check = False
            lines += _kernel_call(step, code.constants, memory, check, kernel_arguments, size_arguments.get(step.name, []))
        else:
            lines += _extern_call(k, step, code, memory.extern_inplace.get(k))
        dead = [name for name in memory.frees.get(k, []) if name not in reused]
        if dead:
            lines.append(f"del {', '.join(dead)}")
    if read_at_end:
        lines.append(f"if index_error.value: _raise_index_error(index_error, {', '.join(read_at_end)!r})")
    returns = []
    for k, o in enumerate(schedule.outputs):
        if isinstance(o, Buffer):
            returns.append(o.name)
        elif _is_size(o):
            returns.append(_size(o))
        else:
            code.constants[f"out_const{k}"] = o
            returns.append(f"out_const{k}")
    body = "\n".join(f"    {line}" for line in lines) or "    pass"
    code.source = f"def call({', '.join(params)}):\n{body}\n    return ({', '.join(returns)}{',' if len(returns) == 1 else ''})\n"
    return code


def _kernel_call(kernel: FusedKernel, constants: dict, memory: MemoryPlan, check: bool, arguments: str,
                 sizes: list[str]) -> list[str]:
    lines = []
    for b in kernel.outputs:
        if b.name in memory.reuses:  # the dead buffer's name goes with its memory
            lines.append(f"{b.name} = {memory.reuses[b.name]}; del {memory.reuses[b.name]}")
        elif b.name in memory.inplace:  # the input's name dies after the call, as it would anyway
            lines.append(f"{b.name} = {memory.inplace[b.name]}")
        else:
            size = "[" + ", ".join(_size(s) for s in b.layout.size) + "]"
            stride = "[" + ", ".join(_size(s) for s in b.layout.stride) + "]"
            constants[f"dtype_{b.name}"] = b.layout.dtype
            on_device = ", device=device" if "device" in constants else ""
            lines.append(f"{b.name} = empty_strided({size}, {stride}, dtype=dtype_{b.name}{on_device})")
    pointer = ".data_ptr()" if arguments == "pointers" else ""
    ptrs = ", ".join([*(f"{b.name}{pointer}" for b in kernel.inputs + kernel.outputs), *sizes])
    lines.append(f"{kernel.name}({ptrs})")
    if check:
        lines.append(f"if index_error.value: _raise_index_error(index_error, {kernel.name!r})")
    return lines


def _extern_call(k: int, step: ExternStep, code: WrapperCode, into: str | None = None) -> list[str]:
    """`into`: a kiln::conv whose result the memory plan writes over its added input."""
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

    if into is not None:
        step = step.with_argument("impl", IN_PLACE_CONV_IMPL)
    args = pytree.tree_map(arg, list(step.args), is_leaf=lambda v: isinstance(v, Buffer))
    kwargs = pytree.tree_map(arg, dict(step.kwargs), is_leaf=lambda v: isinstance(v, Buffer))
    code.constants.update(names)
    call = f"op{k}({', '.join(_render(a) for a in args)}{', ' if args and kwargs else ''}" \
           f"{', '.join(f'{key}={_render(v)}' for key, v in kwargs.items())})"
    if step.op is torch.ops.aten.as_strided.default and not kwargs and isinstance(step.args[0], Buffer):
        # The schedule's views, a hundred in a BERT call: the tensor's method costs 1.4 µs, the
        # op's overload 3.6 (its Python dispatch).
        call = f"{args[0]}.as_strided({', '.join(_render(a) for a in args[1:])})"
    outs, lines = step.outputs, []
    if len(outs) == 1 and outs[0] is not None:
        lines.append(f"{outs[0].name} = {call}")
    else:
        lines.append(f"_result = {call}")
        lines += [f"{b.name} = _result[{i}]" for i, b in enumerate(outs) if b is not None]
    for b in outs:
        if b is not None and step.op is not torch.ops.aten.as_strided.default and computable_layout(b.layout):
            lines.append(f"{b.name} = _in_layout({b.name}, {_layout_argument(b.name, b.layout, code.constants)})")
    return lines


def computable_layout(layout: Layout) -> bool:
    """Known before the call or computed from the inputs' sizes (not from tensor data)."""
    return layout.is_static or not any(unbound_symbols(v) for v in (*layout.size, *layout.stride, layout.offset))


def _render(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_render(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(_render(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return str(value)
