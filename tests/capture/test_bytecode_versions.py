"""Constructs whose bytecode differs between CPython 3.11, 3.12 and 3.13, each captured and each
resumed after a graph break in the middle of it. They run on every Python kiln supports; on 3.13
they exercise its superinstructions (two locals packed in four bits each), CALL_KW, TO_BOOL,
CONVERT_VALUE/FORMAT_*, SET_FUNCTION_ATTRIBUTE and the NULL above the callable."""

import contextlib
import io

import pytest
import torch

import kiln
from kiln.capture.break_records import BREAKS
from tests.capture.util import assert_same, check


def _run_with_breaks(fn, *args):
    """Compile without fullgraph, compare with eager (output printed too), and require that the
    frame was resumed after its breaks rather than run eagerly."""
    compiled = kiln.compile(fn, backend="eager")
    eager_out, compiled_out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(eager_out):
        expected = fn(*args)
    BREAKS.clear()
    with contextlib.redirect_stdout(compiled_out):
        actual = compiled(*args)
    assert_same(actual, expected)
    assert compiled_out.getvalue() == eager_out.getvalue()
    assert compiled.kiln_cache.fallback is None and BREAKS and all(r.resumed for r in BREAKS), BREAKS
    return compiled


def test_pairs_of_locals_past_the_sixteenth_slot():
    def f(x):
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9 = (x + i for i in range(10))
        b0, b1, b2, b3, b4, b5, b6, b7, b8, b9 = a9, a8, a7, a6, a5, a4, a3, a2, a1, a0
        c, d = b9 * 2, b0 * 3
        e, g = d, c
        return a0 + a9 + b1 + b8, c + d, e - g

    check(f, torch.randn(3))


def test_a_break_in_a_frame_with_many_locals_resumes_with_each_in_its_slot():
    def f(x):
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9 = (x + i for i in range(10))
        b0, b1, b2, b3, b4, b5, b6, b7, b8, b9 = a9, a8, a7, a6, a5, a4, a3, a2, a1, a0
        dead = x * 100  # never read after the break: unbound in the resume function
        print("break")
        c, d = b9 * 2, b0 * 3
        e, g = d, c
        return a0 + a9 + b1 + b8, c + d, e - g

    _run_with_breaks(f, torch.randn(3))


def test_keyword_calls_captured_and_broken():
    def helper(x, *, scale, shift=0.0):
        print("in helper", scale)
        return x * scale + shift

    def f(x):
        y = torch.nn.functional.softmax(x, dim=-1)
        print("sum", end="\n", sep="")
        z = helper(y, scale=2.0, shift=1.0)  # inlined; its callee breaks
        return torch.cat([y, z], dim=0).sum(dim=0, keepdim=True)

    _run_with_breaks(f, torch.randn(2, 3))


def test_f_strings_with_conversions_and_specs():
    class Named:
        def __repr__(self):
            return "Named()"

    def f(x, n, name):
        label = f"{n!r:>6}|{name!s:<5}|{name!a}|{n:03d}|{3.25:.1f}|{Named()!r}"
        return x * len(label), label

    check(f, torch.randn(2), 7, "ab")


def test_nested_functions_with_defaults_keyword_defaults_annotations_and_cells():
    def f(x, k):
        bias = x.sum()

        def add(y: torch.Tensor, scale: float = 2.0, *, shift: float = 1.0) -> torch.Tensor:
            return y * scale * k + bias + shift

        first = (add(x), add(x, 3.0, shift=0.5), add.__defaults__, add.__kwdefaults__, sorted(add.__annotations__))
        add.__defaults__ = (5.0,)
        add.__kwdefaults__ = {"shift": -1.0}
        return first, add(x), add.__defaults__

    check(f, torch.randn(3), 2.0)


def test_a_comprehension_variable_named_as_a_cell():
    def f(x):
        fns = []
        for i in range(3):
            fns.append(lambda t: t + i)
        bound = [lambda t, i=i: t * i for i in range(3)]
        return [g(x) for g in fns], [g(x) for g in bound], i

    check(f, torch.randn(2))


@pytest.mark.parametrize("flag", [True, False])
def test_conditions_on_tensors_break_at_the_jump_and_resume(flag):
    def f(x):
        y = x + 1
        if not (y.sum() > 0):  # TO_BOOL, UNARY_NOT, then the jump on 3.13
            y = y * -1
        z = y.max() > 0 and y.min() < 10  # a kept value, tested by the jump
        return y, bool(z)

    _run_with_breaks(f, torch.ones(3) if flag else -torch.ones(3) * 5)


def test_loops_end_and_method_calls_keep_the_stack():
    def f(x, items):
        total = x.new_zeros(())
        for item in items:
            total = total + x.mul(item).sum()
        for k, v in {"a": 1, "b": 2}.items():
            total = total + v
        out = [t.float() for t in x.unbind(0)]
        return total, torch.stack(out).transpose(0, 1).contiguous()

    check(f, torch.randn(3, 2), [1.0, 2.0])


def test_a_break_inside_a_loop_over_a_tensor_method_result():
    def f(x):
        acc = []
        for row in x.unbind(0):
            print("row")
            acc.append(row.sum())
        return torch.stack(acc)

    _run_with_breaks(f, torch.randn(3, 2))


def test_call_with_star_arguments_and_a_break_in_the_callee():
    def callee(*args, **kwargs):
        print("callee", sorted(kwargs))
        return sum(args) * kwargs["w"]

    def f(x):
        parts = (x, x * 2)
        return callee(*parts, **{"w": 3.0})

    _run_with_breaks(f, torch.randn(2))

