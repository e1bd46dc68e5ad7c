"""The wrapper plan (kiln/codegen/wrapper_plan.py): the lines it makes for a small hand-made
schedule, every decision in them, and both wrapper printers printing every line kind."""

import pytest
import sympy
import torch

from kiln.codegen import cpp_wrapper as cpp_wrapper_module
from kiln.codegen import wrapper as python_wrapper_module
from kiln.codegen.cpp_wrapper import cpp_wrapper
from kiln.codegen.wrapper import python_wrapper
from kiln.codegen.wrapper_plan import (LINE_KINDS, Allocate, BindSize, CheckIndex, ExternCall, Free, InLayout,
                                       KernelCall, Parameter, Return, Reuse, ToDevice, View, WriteOver, wrapper_plan)
from kiln.ir.nodes import Buffer, Layout
from kiln.ir.program import ExternStep
from kiln.ir.schedule import FusedKernel, MemoryPlan, Schedule

aten = torch.ops.aten
ks0 = sympy.Symbol("ks0", integer=True, positive=True)


def _schedule() -> Schedule:
    """x[ks0, 4] -> k0 -> a; b = mm(a, w); v = view of b; k1(v) -> c in a's memory, d over x.
    (Buffers are named as the lowering names them: the C++ wrapper's blocks have locals `a`, `r`, `s`, `t`.)"""
    buffer = lambda name, size: Buffer(name, Layout.contiguous(size, torch.float32))  # noqa: E731
    x, w, a, b = buffer("x_1", (ks0, 4)), buffer("w_1", (4, 4)), buffer("buf0", (ks0, 4)), buffer("buf1", (ks0, 4))
    v, c, d = buffer("buf2", (4, ks0)), buffer("buf3", (ks0, 4)), buffer("buf4", (ks0, 4))
    steps = [FusedKernel("k0", (ks0,), inputs=[x], outputs=[a]),
             ExternStep([b], aten.mm.default, (a, w), {}),
             ExternStep([v], aten.as_strided.default, (b, [4, ks0], [1, 4], 0), {}),
             FusedKernel("k1", (ks0,), inputs=[v, x], outputs=[c, d])]
    memory = MemoryPlan(frees={1: ["buf0"], 3: ["buf1", "buf2"]}, reuses={"buf3": "buf0"}, inplace={"buf4": "x_1"})
    return Schedule([x, w], steps, [c, d], memory)


def test_the_plan_holds_every_decision_in_order():
    plan = wrapper_plan(_schedule(), {"k0"}, {"k0": ["ks0"], "k1": ["ks0"]})
    assert plan.parameters == (Parameter("x_1", "tensor"), Parameter("w_1", "tensor"))
    kinds = [type(line) for line in plan.lines]
    assert kinds == [BindSize, InLayout, InLayout, Allocate, KernelCall, CheckIndex, ExternCall, InLayout, View,
                     Reuse, WriteOver, KernelCall, Free, Return]
    lines = plan.lines
    assert lines[0] == BindSize(ks0, "x_1", 0)
    assert lines[4] == KernelCall("k0", ("x_1", "buf0"), ("ks0",))
    assert lines[7].name == "buf1"  # the extern's result checked against the layout the kernels expect
    assert lines[8].base.name == "buf1" and not lines[8].is_output  # a view: no layout fix-up after it
    assert (lines[9], lines[10]) == (Reuse("buf3", "buf0"), WriteOver("buf4", "x_1"))
    # buf0 is dead after step 1 but its memory lives on as buf3: only buf1 and buf2 are released.
    assert [line.names for line in lines if isinstance(line, Free)] == [("buf1", "buf2")]
    assert [o.name for o in lines[-1].values] == ["buf3", "buf4"]


def test_on_a_gpu_host_inputs_move_and_the_index_flag_is_read_once_at_the_end():
    plan = wrapper_plan(_schedule(), {"k0", "k1"}, device="cuda", host_inputs=frozenset({"w_1"}))
    kinds = [type(line) for line in plan.lines]
    assert ToDevice("w_1") in plan.lines and kinds.index(ToDevice) == kinds.index(InLayout) + 2
    assert [line for line in plan.lines if isinstance(line, CheckIndex)] == [CheckIndex(("k0", "k1"))]
    assert kinds[-2:] == [CheckIndex, Return]


@pytest.mark.parametrize("printer", [python_wrapper_module._PythonPrinter, cpp_wrapper_module._CppPrinter])
def test_each_printer_prints_every_line_kind(printer):
    assert {kind.kind for kind in LINE_KINDS} <= set(vars(printer))


def test_both_printers_print_the_plan():
    plan = wrapper_plan(_schedule(), {"k0"}, {"k0": ["ks0"], "k1": ["ks0"]})
    source = python_wrapper(plan).source
    for text in ("def call(x_1, w_1):", "ks0 = x_1.shape[0]", "buf0 = empty_strided([ks0, 4], [4, 1]",
                 "k0(x_1.data_ptr(), buf0.data_ptr(), ks0)", "_raise_index_error(index_error, 'k0')",
                 "buf1 = op1(buf0, w_1)", "buf1 = _in_layout(buf1, ((ks0, 4, ), (4, 1, )))", "buf2 = buf1.as_strided(",
                 "buf3 = buf0; del buf0", "buf4 = x_1", "del buf1, buf2", "return (buf3, buf4)"):
        assert text in source, text
    cpp = cpp_wrapper(plan, {"k0": ("kernel_k0", 2), "k1": ("kernel_k1", 4)})
    for text in ("const int64_t ks0 = kiln_size(x_1, 0);", "buf0 = kiln_empty_strided(2, s, t, 6)",
                 "kernel_k0(kiln_data(x_1), kiln_data(buf0), ks0);", "kiln_set_error(", 'kiln_find_op("aten::mm", "")',
                 "kiln_in_layout(&buf1", "buf2 = kiln_reinterpret(buf1, 2, s, t, 0L)", "buf3 = buf0; buf0 = nullptr;",
                 "buf4 = kiln_share(x_1);", "kiln_release(buf1); buf1 = nullptr;", "outputs[1] = kiln_share(buf4);"):
        assert text in cpp, text
    with pytest.raises(NotImplementedError, match="on cuda"):
        cpp_wrapper(wrapper_plan(_schedule(), set(), device="cuda"), {})
    with pytest.raises(NotImplementedError, match="to a device"):
        cpp_wrapper_module._CppPrinter(plan, {}).to_device(ToDevice("w_1"))


def test_one_size_symbol_passed_as_two_inputs_gets_two_parameters_and_one_binding():
    # Dynamo may hand a graph the same symbolic size as two scalar inputs (seen on Qwen2's decode
    # step); two parameters of one name were a SyntaxError in the printed wrapper.
    x = Buffer("x_1", Layout.contiguous((ks0, 4), torch.float32))
    out = Buffer("buf0", Layout.contiguous((ks0, 4), torch.float32))
    schedule = Schedule([None, None, x], [FusedKernel("k0", (ks0,), inputs=[x], outputs=[out])], [out], MemoryPlan(),
                        size_inputs={0: ks0, 1: ks0})
    plan = wrapper_plan(schedule, set(), {"k0": ["ks0"]})
    assert [p.name for p in plan.parameters] == ["ks0_input", "ks0_input1", "x_1"]
    assert [line for line in plan.lines if isinstance(line, BindSize)] == [BindSize(ks0, "ks0_input", None)]
    compile(python_wrapper(plan, "pointers").source, "<wrapper>", "exec")  # prints as valid Python
