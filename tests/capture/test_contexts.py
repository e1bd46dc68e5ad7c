"""Context managers under capture: grad mode, autocast, user context managers, is_compiling."""

import contextlib

import pytest
import torch

import kiln
from tests.capture.util import assert_same, check


def _grad_flags(value):
    if isinstance(value, torch.Tensor):
        return [value.requires_grad]
    if isinstance(value, (list, tuple)):
        return [flag for v in value for flag in _grad_flags(v)]
    return []


def check_grad(fn, *args):
    """check(), plus: outputs' requires_grad as in eager, and grad mode restored after the call."""
    compiled = check(fn, *args)
    expected = fn(*args)
    before = torch.is_grad_enabled()
    actual = compiled(*args)
    assert torch.is_grad_enabled() is before
    assert _grad_flags(actual) == _grad_flags(expected)
    return compiled


def test_no_grad_block():
    def f(x):
        with torch.no_grad():
            y = x * 2
        z = x * 3
        return y, z, y.requires_grad

    check_grad(f, torch.randn(3, requires_grad=True))


def test_enable_grad_inside_no_grad():
    def f(x):
        with torch.no_grad():
            a = x + 1
            with torch.enable_grad():
                b = x * 2
            c = x - 1
        return a, b, c

    check_grad(f, torch.randn(3, requires_grad=True))


@pytest.mark.parametrize("mode", [True, False])
def test_set_grad_enabled_block(mode):
    def f(x, mode):
        with torch.set_grad_enabled(mode):
            y = x.sin()
        return y, x.cos(), torch.is_grad_enabled()

    check_grad(f, torch.randn(3, requires_grad=True), mode)


def test_set_grad_enabled_as_call_restored_after_frame():
    def f(x):
        torch.set_grad_enabled(False)
        y = x * 2
        torch.set_grad_enabled(True)
        return y, x * 3

    check_grad(f, torch.randn(3, requires_grad=True))


def test_called_under_outer_no_grad():
    def f(x):
        with torch.enable_grad():
            return x * 2, torch.is_grad_enabled()

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3, requires_grad=True)
    with torch.no_grad():
        out, flag = compiled(x)
        assert not torch.is_grad_enabled()
    assert out.requires_grad and flag


@torch.no_grad()
def _frozen_double(x):
    return x * 2


@torch.enable_grad()
def _tracked_triple(x):
    return x * 3


def test_grad_decorators_on_inlined_functions():
    def f(x):
        a = _frozen_double(x)
        with torch.no_grad():
            b = _tracked_triple(x)
        return a, b, x + 1

    check_grad(f, torch.randn(3, requires_grad=True))


def test_decorated_function_compiled_directly():
    check_grad(_frozen_double, torch.randn(3, requires_grad=True))


def test_is_grad_enabled_read_inside():
    def f(x):
        if torch.is_grad_enabled():
            return x * 2
        return x * 3

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    assert_same(compiled(x), x * 2)
    with torch.no_grad():
        assert_same(compiled(x), x * 3)  # the grad mode is guarded: a second entry
    assert_same(compiled(x), x * 2)
    assert len(compiled.kiln_cache.entries) == 2


def test_autocast_bfloat16():
    def f(a, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            c = a @ b
            d = c.float() + 1
        return c, d, c @ b.to(c.dtype)

    compiled = check(f, torch.randn(4, 4), torch.randn(4, 4))
    expected = f(torch.ones(4, 4), torch.ones(4, 4))
    actual = compiled(torch.ones(4, 4), torch.ones(4, 4))
    assert [t.dtype for t in actual] == [t.dtype for t in expected] == [torch.bfloat16, torch.float32, torch.bfloat16]
    assert not torch.is_autocast_enabled("cpu")


def test_autocast_disabled_inside_enabled():
    def f(a, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            c = a @ b
            with torch.autocast("cpu", enabled=False):
                d = a @ b
        return c.dtype, d.dtype, c, d

    check(f, torch.randn(2, 2), torch.randn(2, 2))


class Tracker:
    def __init__(self, scale):
        self.scale = scale
        self.events = []

    def __enter__(self):
        self.events.append("enter")
        return self.scale

    def __exit__(self, exc_type, exc, tb):
        self.events.append("exit" if exc_type is None else "error")
        return False


def test_user_context_manager_created_inside():
    def f(x):
        t = Tracker(3.0)
        with t as s:
            y = x * s
        return y, t.events

    check(f, torch.randn(3))


def test_user_context_manager_passed_in_records_events():
    def f(x, t):
        with t as s:
            y = x * s
        return y

    t_eager, t_compiled = Tracker(2.0), Tracker(2.0)
    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    assert_same(compiled(x, t_compiled), f(x, t_eager))
    assert t_compiled.events == t_eager.events == ["enter", "exit"]


class Suppress:
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        return exc_type is not None and issubclass(exc_type, ValueError)


def test_user_context_manager_suppresses_exception():
    def f(x):
        y = x + 1
        with Suppress():
            y = y * 2
            raise ValueError("dropped")
        return y

    check(f, torch.randn(3))


@contextlib.contextmanager
def _scaled(k):
    yield k * 2


def test_contextlib_contextmanager():
    def f(x):
        with _scaled(3) as k:
            return x * k

    check(f, torch.randn(3))


def test_is_compiling_takes_other_branch():
    def f(x):
        if torch.compiler.is_compiling():
            return x * 10
        return x - 10

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    assert_same(f(x), x - 10)
    # The one allowed difference from eager: compiled code sees is_compiling() == True.
    assert_same(compiled(x), x * 10)
    assert len(compiled.kiln_cache.entries) == 1 and compiled.kiln_cache.fallback is None
    assert not torch.compiler.is_compiling()


def test_grad_mode_restored_after_capture_error():
    def f(x):
        with torch.no_grad():
            return x.data_ptr()  # (an address: never in a graph)

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    with pytest.raises(kiln.CaptureError):
        compiled(torch.randn(1, requires_grad=True))
    assert torch.is_grad_enabled()
    fallback = kiln.compile(f, backend="eager")
    x = torch.randn(1, requires_grad=True)
    assert fallback(x) == f(x)
    assert torch.is_grad_enabled()


@pytest.mark.parametrize("decorate", [
    lambda f: torch.enable_grad()(f), lambda f: torch.enable_grad(f), lambda f: torch.set_grad_enabled(True)(f)])
def test_a_function_decorated_with_a_grad_mode_inside_runs_in_it(decorate):
    def fn(x):
        def inner(x):
            return x.sin()

        with torch.no_grad():
            wrapped = decorate(inner)
            assert not torch.is_grad_enabled()  # decorating switched nothing
            return wrapped(x), wrapped

    x = torch.zeros(3, requires_grad=True)
    out, wrapped = kiln.compile(fn, backend="eager", fullgraph=True)(x)
    assert out.requires_grad and torch.equal(out, x.sin())
    with torch.no_grad():
        assert wrapped(x).requires_grad  # the returned function keeps its mode


@pytest.mark.parametrize("restore", [True, False])
def test_a_break_after_grad_mode_was_switched_by_a_call_resumes_in_that_mode(restore):
    def fn(a, b):
        prev = torch.is_grad_enabled()
        torch.set_grad_enabled(False)
        a = a + 1
        kiln.graph_break()
        out = a * b
        if restore:
            torch.set_grad_enabled(prev)
        return out, out.requires_grad

    compiled = kiln.compile(fn, backend="eager")
    a, b = torch.ones(3), torch.ones(3, requires_grad=True)
    try:
        for _ in range(2):
            out, requires_grad = compiled(a, b)
            assert requires_grad is False and not out.requires_grad  # b * a computed under no_grad
            assert torch.is_grad_enabled() is restore  # left as eager leaves it
            torch.set_grad_enabled(True)
    finally:
        torch.set_grad_enabled(True)
    assert len(compiled.kiln_cache.entries) == 1


def test_a_set_grad_enabled_object_alive_at_a_break_restores_its_prior_mode_on_exit():
    def fn(x):
        x = x + 1
        ctx = torch.set_grad_enabled(True)  # (switched here; its exit restores the mode before it)
        kiln.graph_break()
        with ctx:
            y = x * w
        return y, torch.is_grad_enabled()

    w = torch.ones(3, requires_grad=True)
    compiled = kiln.compile(fn, backend="eager")
    with torch.no_grad():
        want, got = fn(torch.zeros(3)), compiled(torch.zeros(3))
        assert not torch.is_grad_enabled()
    assert got[1] is want[1] is False and got[0].requires_grad == want[0].requires_grad is True
    assert len(compiled.kiln_cache.entries) == 1 and not compiled.kiln_cache.fallback


def test_warnings_catch_warnings_around_traced_code_and_returned():
    import warnings

    def fn(x):
        with warnings.catch_warnings(record=True) as log:
            y = x.sin()
        return y, log, warnings.catch_warnings(record=True)

    compiled = kiln.compile(fn, backend="eager", fullgraph=True)
    x = torch.randn(3)
    (y, log, made), (_, log2, made2) = compiled(x), compiled(x)
    torch.testing.assert_close(y, x.sin())
    assert log == [] and log is not log2
    assert isinstance(made, warnings.catch_warnings) and made is not made2
    with pytest.raises(TypeError):
        kiln.compile(lambda x: warnings.catch_warnings(bad=1), backend="eager", fullgraph=True)(x)
