"""The C++ wrapper of a scheduled CPU graph: the Python wrapper's steps (kiln/codegen/wrapper.py)
as one C function, so a call crosses from Python once instead of once per kernel and extern.

    extern "C" int kiln_graph_call(kiln_tensor* inputs, kiln_tensor* outputs)

It takes ownership of one tensor handle per graph input, writes one new handle per output, and
returns 0; 1 on an error (the message in `kiln_error()`), 2 when a kernel's index check failed.
Kernels are called directly (the wrapper is a translation unit of the graph's library);
allocations, layout copies and extern operators go through kiln's runtime (kiln_runtime.h), whose
`kiln_call_op` calls an operator with every argument of its schema, normalized here from the
step's arguments and the schema's defaults: one of kiln's C++ operators (kiln::mm, kiln::conv,
kiln::attention, ...) as the runtime's own function, directly, any other through the dispatcher.

Not generated (`NotImplementedError`, the caller keeps the Python wrapper): a graph with size or
constant outputs, with size inputs, on another device, or calling an extern that is not a
dispatcher operator.
"""

from __future__ import annotations

import json
import math
from typing import Any

import sympy
import torch

from kiln.codegen.cpp.printer import CPP_INDEX
from kiln.codegen.index_printer import print_index
from kiln.codegen.wrapper import computable_layout
from kiln.externs.prepacked import IN_PLACE_CONV_IMPL
from kiln.ir.nodes import Buffer, Layout
from kiln.ir.program import ExternStep
from kiln.ir.schedule import FusedKernel, Schedule
from kiln.ir.sizes import is_size_symbol, unbound_symbols
from kiln.native import header_text

# c10::ScalarType, c10::MemoryFormat, c10::Layout and c10::DeviceType codes.
DTYPE_CODES = {torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4, torch.float16: 5,
               torch.float32: 6, torch.float64: 7, torch.complex64: 9, torch.complex128: 10, torch.bool: 11,
               torch.bfloat16: 15}
MEMORY_FORMAT_CODES = {torch.contiguous_format: 0, torch.preserve_format: 1, torch.channels_last: 2,
                       torch.channels_last_3d: 3}
LAYOUT_CODES = {torch.strided: 0}
DEVICE_CODES = {"cpu": 0}
ENUMS = [(torch.dtype, "KILN_DTYPE", DTYPE_CODES), (torch.memory_format, "KILN_MEMORY_FORMAT", MEMORY_FORMAT_CODES),
         (torch.layout, "KILN_LAYOUT", LAYOUT_CODES)]

ENTRY = "kiln_graph_call"


def cpp_wrapper(schedule: Schedule, checks: set[str], functions: dict[str, tuple[str, int]],
                size_arguments: dict[str, list[str]], device: str = "cpu") -> str:
    """The wrapper's C++ source for `schedule`; `functions`: kernel -> (C function, pointer count)."""
    if device != "cpu":
        raise NotImplementedError(f"a C++ wrapper for a graph on {device}")
    if schedule.size_inputs or any(b is None for b in schedule.inputs):
        raise NotImplementedError("a C++ wrapper for a graph with size inputs or unused inputs")
    if not all(isinstance(o, Buffer) for o in schedule.outputs):
        raise NotImplementedError("a C++ wrapper for a graph returning sizes or constants")
    return _Writer(schedule, checks, functions, size_arguments).source()


class _Writer:
    def __init__(self, schedule: Schedule, checks: set[str], functions: dict[str, tuple[str, int]],
                 size_arguments: dict[str, list[str]]) -> None:
        self.schedule, self.checks, self.functions, self.size_arguments = schedule, checks, functions, size_arguments
        self.handles: list[str] = []  # every local handle, released at the end
        self.body: list[str] = []
        self.ops = 0

    def source(self) -> str:
        s = self.schedule
        entry = []
        for k, b in enumerate(s.inputs):
            if b is None:
                entry.append(f"kiln_release(inputs[{k}]);")
            else:
                self.handles.append(b.name)
                entry.append(f"kiln_tensor {b.name} = inputs[{k}];")
        entry += self._size_bindings()
        for b in s.inputs:
            if b is not None:
                self.body.append(self._in_layout(b.name, b.layout))
        reused = set(s.memory.reuses.values())
        for k, step in enumerate(s.steps):
            if isinstance(step, FusedKernel):
                self._kernel(step)
            else:
                self._extern(k, step, s.memory.extern_inplace.get(k))
            for name in s.memory.frees.get(k, []):
                if name not in reused:
                    self.body.append(f"kiln_release({name}); {name} = nullptr;")
        outputs = [f"outputs[{k}] = kiln_share({o.name});" for k, o in enumerate(s.outputs)]
        inputs = {b.name for b in s.inputs if b is not None}
        locals_ = [f"kiln_tensor {name} = nullptr;" for name in dict.fromkeys(self.handles) if name not in inputs]
        release = [f"if ({name}) kiln_release({name});" for name in dict.fromkeys(self.handles)]
        kernels = sorted({self.functions[k.name] for k in s.kernels})
        declarations = [f'extern "C" void {fn}({", ".join(["void*"] * count + ["int64_t"] * len(self._sizes_of(fn)))});'
                        for fn, count in kernels]
        lines = [*entry, *locals_, "int rc = 1;", *self.body, *outputs, "rc = 0;", "fail:", *release, "return rc;"]
        return "\n".join([header_text(("kiln_scalar.h",), defines_flag=False), _runtime_header(), *declarations,
                          f'extern "C" int {ENTRY}(kiln_tensor* inputs, kiln_tensor* outputs) {{',
                          *(f"  {line}" for line in lines), "}", ""])

    def _sizes_of(self, function: str) -> list[str]:
        for kernel, (fn, _) in self.functions.items():
            if fn == function:
                return self.size_arguments.get(kernel, [])
        return []

    def _size_bindings(self) -> list[str]:
        lines, bound = [], set()
        for b in self.schedule.inputs:
            for d, size in enumerate(b.layout.size if b is not None else ()):
                if is_size_symbol(size) and size not in bound:
                    lines.append(f"const int64_t {size.name} = kiln_size({b.name}, {d});")
                    bound.add(size)
        return lines

    def _in_layout(self, name: str, layout: Layout) -> str:
        return (f"{{ {_array('s', layout.size)} {_array('t', layout.stride)} "
                f"if (kiln_in_layout(&{name}, {len(layout.size)}, s, t)) goto fail; }}")

    def _allocate(self, b: Buffer) -> str:
        if b.layout.dtype not in DTYPE_CODES:
            raise NotImplementedError(f"a C++ wrapper allocating {b.layout.dtype}")
        return (f"{{ {_array('s', b.layout.size)} {_array('t', b.layout.stride)} "
                f"{b.name} = kiln_empty_strided({len(b.layout.size)}, s, t, {DTYPE_CODES[b.layout.dtype]}); }}")

    def _kernel(self, kernel: FusedKernel) -> None:
        memory = self.schedule.memory
        for b in kernel.outputs:
            self.handles.append(b.name)
            if b.name in memory.reuses:  # the dead buffer's memory, under the new name
                self.body.append(f"{b.name} = {memory.reuses[b.name]}; {memory.reuses[b.name]} = nullptr;")
            elif b.name in memory.inplace:  # written over an input that dies here
                self.body.append(f"{b.name} = kiln_share({memory.inplace[b.name]});")
            else:
                self.body.append(self._allocate(b))
        function, _ = self.functions[kernel.name]
        arguments = [f"kiln_data({b.name})" for b in kernel.inputs + kernel.outputs]
        arguments += self.size_arguments.get(kernel.name, [])
        self.body.append(f"{function}({', '.join(arguments)});")
        if kernel.name in self.checks:
            message = json.dumps(f"index out of range in kiln kernel {kernel.name} (an indexing op read outside its input)")
            self.body.append(f"if (kiln_index_error) {{ kiln_index_error = 0; kiln_set_error({message}); rc = 2; goto fail; }}")

    def _extern(self, k: int, step: ExternStep, into: str | None) -> None:
        if not isinstance(step.op, torch._ops.OpOverload):
            raise NotImplementedError(f"a C++ wrapper calling {step.op!r}, not a dispatcher operator")
        if into is not None:
            step = step.with_argument("impl", IN_PLACE_CONV_IMPL)
        schema = step.op._schema
        values = _schema_values(schema, list(step.args), dict(step.kwargs))
        if step.op is torch.ops.aten.as_strided.default and self._reinterpret(values, step.outputs[0]):
            return
        lists: list[str] = []
        args = [self._argument(v, a.type, lists) for v, a in zip(values, schema.arguments)]
        outs = step.outputs
        name, overload = schema.name, schema.overload_name
        self.ops += 1
        block = [f"static void* op = kiln_find_op({json.dumps(name)}, {json.dumps(overload)}); if (!op) goto fail;",
                 *lists,
                 f"const kiln_arg a[] = {{{', '.join(args)}}};" if args else "const kiln_arg* a = nullptr;",
                 f"kiln_tensor r[{max(len(outs), 1)}];",
                 f"if (kiln_call_op(op, a, {len(args)}, r, {len(outs)})) goto fail;"]
        for i, b in enumerate(outs):
            if b is None:
                block.append(f"if (r[{i}]) kiln_release(r[{i}]);")
            else:
                self.handles.append(b.name)
                block.append(f"{b.name} = r[{i}];")
        self.body.append("{ " + " ".join(block) + " }")
        for b in outs:
            if b is not None and step.op is not torch.ops.aten.as_strided.default and computable_layout(b.layout):
                self.body.append(self._in_layout(b.name, b.layout))

    def _reinterpret(self, values: list[Any], out: Buffer) -> bool:
        """A view op (the schedule's `as_strided`) as kiln_reinterpret, an alias made without the
        dispatcher (~0.1 µs against ~1.5 µs boxed). Not for graph outputs: those stay real views,
        as eager's are (autograd's view record, the version counter shared with the base)."""
        base, size, stride, offset = values
        if not isinstance(base, Buffer) or offset is None or any(out is o for o in self.schedule.outputs):
            return False
        self.handles.append(out.name)
        self.body.append(f"{{ {_array('s', size)} {_array('t', stride)} "
                         f"{out.name} = kiln_reinterpret({base.name}, {len(size)}, s, t, "
                         f"{print_index(sympy.sympify(offset), CPP_INDEX)}); }}")
        return True

    def _argument(self, value: Any, type_: Any, lists: list[str]) -> str:
        kind = type_.kind()
        if kind == "OptionalType":
            if value is None:
                return "{KILN_NONE, 0, 0.0, nullptr, 0}"
            type_ = type_.getElementType()
            kind = type_.kind()
        if isinstance(value, Buffer):
            return f"{{KILN_TENSOR, 0, 0.0, {value.name}, 0}}"
        if value is None:
            return "{KILN_NONE, 0, 0.0, nullptr, 0}"
        if isinstance(value, (list, tuple)):
            element = type_.getElementType() if kind == "ListType" else type_
            items = [self._argument(v, element, lists) for v in value]
            name = f"l{len(lists)}"
            lists.append(f"const kiln_arg {name}[] = {{{', '.join(items)}}};" if items else f"const kiln_arg* {name} = nullptr;")
            return f"{{KILN_LIST, 0, 0.0, {name}, {len(items)}}}"
        if isinstance(value, bool):
            return f"{{KILN_BOOL, {int(value)}, 0.0, nullptr, 0}}"
        for python_type, arg_kind, codes in ENUMS:
            if isinstance(value, python_type):
                if value not in codes:
                    raise NotImplementedError(f"a C++ wrapper passing {value}")
                return f"{{{arg_kind}, {codes[value]}, 0.0, nullptr, 0}}"
        if isinstance(value, torch.device):
            if value.type not in DEVICE_CODES:
                raise NotImplementedError(f"a C++ wrapper passing {value}")
            return f"{{KILN_DEVICE, {DEVICE_CODES[value.type]}, 0.0, nullptr, {-1 if value.index is None else value.index}}}"
        if isinstance(value, str):
            return f"{{KILN_STRING, 0, 0.0, {json.dumps(value)}, 0}}"
        if isinstance(value, sympy.Basic) and not value.is_Integer:
            if unbound_symbols(value):
                raise NotImplementedError(f"a C++ wrapper passing a size computed from tensor data, {value}")
            return f"{{KILN_INT, {print_index(value, CPP_INDEX)}, 0.0, nullptr, 0}}"
        if isinstance(value, (int, sympy.Integer)) and kind != "FloatType":
            return f"{{KILN_INT, {int(value)}L, 0.0, nullptr, 0}}"
        if isinstance(value, (int, float, sympy.Integer)):
            return f"{{KILN_DOUBLE, 0, {_double(float(value))}, nullptr, 0}}"
        raise NotImplementedError(f"a C++ wrapper passing {type(value).__name__} {value!r}")


def _schema_values(schema: Any, args: list[Any], kwargs: dict[str, Any]) -> list[Any]:
    """Every argument of `schema` in order: given positionally, by name, or its default."""
    values = []
    for i, argument in enumerate(schema.arguments):
        if i < len(args) and not argument.kwarg_only:
            values.append(args[i])
        elif argument.name in kwargs:
            values.append(kwargs[argument.name])
        elif argument.has_default_value():
            values.append(argument.default_value)
        else:
            raise NotImplementedError(f"a C++ wrapper calling {schema.name}: no value for {argument.name}")
    return values


def _double(x: float) -> str:
    if math.isnan(x):
        return "__builtin_nan(\"\")"
    if math.isinf(x):
        return "__builtin_inf()" if x > 0 else "-__builtin_inf()"
    return repr(x)


def _array(name: str, values: Any) -> str:
    """The declaration of `name`, sizes or strides (symbolic ones computed at the call)."""
    if not values:
        return f"const int64_t* {name} = nullptr;"
    return f"const int64_t {name}[] = {{" + ", ".join(print_index(sympy.sympify(v), CPP_INDEX) for v in values) + "};"


def _runtime_header() -> str:
    from kiln.native import INCLUDE

    return (INCLUDE / "kiln_runtime.h").read_text().replace("#pragma once", "")
