"""The C++ wrapper of a scheduled CPU graph: its wrapper plan (kiln/codegen/wrapper_plan.py), the
one the Python wrapper prints, printed as one C function, so a call crosses from Python once
instead of once per kernel and extern.

    extern "C" int kiln_graph_call(kiln_tensor* inputs, kiln_tensor* outputs)

It takes ownership of one tensor handle per graph input it reads, writes one new handle per output, and
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
from kiln.codegen.wrapper_plan import (Allocate, BindSize, CheckIndex, ExternCall, Free, InLayout, KernelCall,
                                       Return, Reuse, ToDevice, View, WrapperPlan, WriteOver, print_lines)
from kiln.ir.nodes import Buffer
from kiln.ir.sizes import unbound_symbols
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


def cpp_wrapper(plan: WrapperPlan, functions: dict[str, tuple[str, int]]) -> str:
    """`plan` (kiln/codegen/wrapper_plan.py) as the wrapper's C++ source; `functions`: kernel ->
    (C function, pointer count)."""
    if plan.device != "cpu":
        raise NotImplementedError(f"a C++ wrapper for a graph on {plan.device}")
    printer = _CppPrinter(plan, functions)
    print_lines(printer, plan)
    return printer.source()


class _CppPrinter:
    """One method per line kind of the plan, each appending the line's C++ to the function body;
    `source` then declares every handle the body named and releases each at the end."""

    def __init__(self, plan: WrapperPlan, functions: dict[str, tuple[str, int]]) -> None:
        self.functions = functions
        # The call leaves out the inputs the graph never reads (kiln/runtime/compiled_graph.py `_cpp_call`).
        self.inputs = [p.name for p in plan.parameters if p.kind != "unused"]
        self.handles: list[str] = list(self.inputs)  # every local handle, released at the end
        self.bindings: list[str] = []  # read before the body: its lines may use them
        self.body: list[str] = []
        self.called: dict[str, tuple[int, int]] = {}  # C function -> (pointers, size symbols) it takes
        self.outputs: list[str] = []

    def source(self) -> str:
        entry = [f"kiln_tensor {name} = inputs[{k}];" for k, name in enumerate(self.inputs)]
        inputs = set(self.inputs)
        locals_ = [f"kiln_tensor {name} = nullptr;" for name in dict.fromkeys(self.handles) if name not in inputs]
        release = [f"if ({name}) kiln_release({name});" for name in dict.fromkeys(self.handles)]
        declarations = [f'extern "C" void {fn}({", ".join(["void*"] * pointers + ["int64_t"] * sizes)});'
                        for fn, (pointers, sizes) in sorted(self.called.items())]
        lines = [*entry, *self.bindings, *locals_, "int rc = 1;", *self.body, *self.outputs, "rc = 0;", "fail:",
                 *release, "return rc;"]
        return "\n".join([header_text(("kiln_scalar.h",), defines_flag=False), _runtime_header(), *declarations,
                          f'extern "C" int {ENTRY}(kiln_tensor* inputs, kiln_tensor* outputs) {{',
                          *(f"  {line}" for line in lines), "}", ""])

    def bind_size(self, line: BindSize) -> None:
        if line.dim is None:
            # An integer input arrives as a 0-d int64 tensor (the C function takes tensors only:
            # kiln/runtime/compiled_graph.py `_cpp_call` makes it).
            self.bindings.append(f"const int64_t {line.symbol.name} = *(const int64_t*)kiln_data({line.source});")
            return
        self.bindings.append(f"const int64_t {line.symbol.name} = kiln_size({line.source}, {line.dim});")

    def in_layout(self, line: InLayout) -> None:
        self.body.append(f"{{ {_array('s', line.layout.size)} {_array('t', line.layout.stride)} "
                         f"if (kiln_in_layout(&{line.name}, {len(line.layout.size)}, s, t)) goto fail; }}")

    def to_device(self, line: ToDevice) -> None:
        # Only a GPU graph has host inputs, and `cpp_wrapper` refuses those.
        raise NotImplementedError(f"a C++ wrapper moving {line.name} to a device")

    def allocate(self, line: Allocate) -> None:
        b = line.buffer
        if b.layout.dtype not in DTYPE_CODES:
            raise NotImplementedError(f"a C++ wrapper allocating {b.layout.dtype}")
        self.handles.append(b.name)
        self.body.append(f"{{ {_array('s', b.layout.size)} {_array('t', b.layout.stride)} "
                         f"{b.name} = kiln_empty_strided({len(b.layout.size)}, s, t, {DTYPE_CODES[b.layout.dtype]}); }}")

    def reuse(self, line: Reuse) -> None:
        self.handles.append(line.name)
        self.body.append(f"{line.name} = {line.dead}; {line.dead} = nullptr;")

    def write_over(self, line: WriteOver) -> None:
        # A second owner of the input's tensor: the input's handle is released where it dies.
        self.handles.append(line.name)
        self.body.append(f"{line.name} = kiln_share({line.input});")

    def kernel_call(self, line: KernelCall) -> None:
        function, pointers = self.functions[line.kernel]
        self.called[function] = (pointers, len(line.sizes))
        self.body.append(f"{function}({', '.join([*(f'kiln_data({b})' for b in line.buffers), *line.sizes])});")

    def check_index(self, line: CheckIndex) -> None:
        message = json.dumps(f"index out of range in kiln kernel {', '.join(line.kernels)} (an indexing op read outside its input)")
        self.body.append(f"if (kiln_index_error) {{ kiln_index_error = 0; kiln_set_error({message}); rc = 2; goto fail; }}")

    def extern_call(self, line: ExternCall) -> None:
        step = line.step
        if not isinstance(step.op, torch._ops.OpOverload):
            raise NotImplementedError(f"a C++ wrapper calling {step.op!r}, not a dispatcher operator")
        schema = step.op._schema
        values = _schema_values(schema, list(step.args), dict(step.kwargs))
        lists: list[str] = []
        args = [self._argument(v, a.type, lists) for v, a in zip(values, schema.arguments)]
        outs = step.outputs
        block = [f"static void* op = kiln_find_op({json.dumps(schema.name)}, {json.dumps(schema.overload_name)}); if (!op) goto fail;",
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

    def view(self, line: View) -> None:
        """A view as kiln_reinterpret, an alias made without the dispatcher (~0.1 µs against
        ~1.5 µs boxed); a view the graph returns stays a real one, through the dispatcher, as
        does one keeping its base's offset (None): kiln_reinterpret takes the offset itself."""
        _, size, stride, offset = _schema_values(line.step.op._schema, list(line.step.args), dict(line.step.kwargs))
        if line.is_output or offset is None:
            self.extern_call(ExternCall(line.step_index, line.step))
            return
        out = line.step.outputs[0]
        self.handles.append(out.name)
        self.body.append(f"{{ {_array('s', size)} {_array('t', stride)} "
                         f"{out.name} = kiln_reinterpret({line.base.name}, {len(size)}, s, t, "
                         f"{print_index(sympy.sympify(offset), CPP_INDEX)}); }}")

    def free(self, line: Free) -> None:
        self.body += [f"kiln_release({name}); {name} = nullptr;" for name in line.names]

    def return_(self, line: Return) -> None:
        if not all(isinstance(o, Buffer) for o in line.values):
            raise NotImplementedError("a C++ wrapper for a graph returning sizes or constants")
        self.outputs = [f"outputs[{k}] = kiln_share({o.name});" for k, o in enumerate(line.values)]

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
