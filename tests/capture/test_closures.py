"""Closures, nonlocal, lambdas, partials, decorators and recursion inside captured code."""

import functools

import pytest
import torch

import kiln
from tests.capture.util import check, op_count


def test_closure_over_local_and_argument():
    def f(x, k):
        bias = x.sum()

        def add(y):
            return y * k + bias

        return add(x), add(x + 1)

    check(f, torch.randn(3), 2.0)


def test_closure_sees_later_assignment_of_enclosing_local():
    def f(x):
        scale = 1.0

        def g():
            return x * scale

        scale = 3.0  # the cell is shared: g reads the new value
        return g()

    check(f, torch.randn(3))


def test_nested_closures_three_levels():
    def f(x):
        a = x + 1

        def outer(b):
            def middle(c):
                def inner(d):
                    return a * b + c * d + x

                return inner(c + 1)

            return middle(b * 2)

        return outer(x.cos())

    check(f, torch.randn(4))


def test_nonlocal_write_seen_by_enclosing_function():
    def f(x):
        total = x * 0
        count = 0

        def accumulate(v):
            nonlocal total, count
            total = total + v
            count += 1

        accumulate(x)
        accumulate(x.sin())
        accumulate(x * 3)
        return total / count, count

    check(f, torch.randn(3))


def test_nonlocal_across_two_levels():
    def f(x):
        acc = x

        def outer():
            def inner():
                nonlocal acc
                acc = acc * 2

            inner()
            inner()
            return acc

        r = outer()
        return r, acc + 1

    check(f, torch.randn(3))


def test_lambdas():
    def f(x, y):
        square = lambda t: t * t  # noqa: E731
        combine = lambda a, b=2.0, *, c=1.0: a * b + c  # noqa: E731
        pick = lambda *ts: ts[-1]  # noqa: E731
        return square(x), combine(x, y), combine(x, c=y), pick(x, y, x + y)

    check(f, torch.randn(3), torch.randn(3))


def test_lambda_capturing_loop_variable_late_binding():
    def f(x):
        fns = []
        for i in range(3):
            fns.append(lambda t: t + i)  # every lambda sees the last i
        fns_bound = [lambda t, i=i: t + i for i in range(3)]
        return [g(x) for g in fns], [g(x) for g in fns_bound]

    check(f, torch.randn(2))


def test_closure_returned_by_helper_and_called_inside():
    def make_scaler(factor):
        def scale(t):
            return t * factor

        return scale

    def f(x):
        double = make_scaler(2)
        by_x = make_scaler(x)
        return double(x) + by_x(x)

    check(f, torch.randn(3))


def test_closure_factory_with_counter_state():
    def make_counter():
        n = 0

        def step(t):
            nonlocal n
            n += 1
            return t * n

        return step

    def f(x):
        step = make_counter()
        a = step(x)
        b = step(x)
        c = step(x)
        return a + b + c

    compiled = check(f, torch.randn(3))
    assert op_count(compiled) == 5


def test_returning_a_closure_made_inside():
    # The function object is rebuilt around a real cell holding what the trace put in it.
    def f(x):
        def inner(t):
            return t + x

        return inner

    x = torch.randn(3)
    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    inner = compiled(x)
    torch.testing.assert_close(inner(x), x + x)
    assert inner.__qualname__ == f(x).__qualname__ and inner.__closure__[0].cell_contents is x


def test_function_attributes_set_and_read_inside():
    def f(x):
        def deco(fn):
            @functools.wraps(fn)
            def wrapper(t: torch.Tensor) -> torch.Tensor:
                return fn(t) * 2

            return wrapper

        @deco
        def h(t: torch.Tensor):
            return t + 1

        h.tag = 3
        return h.__wrapped__(x), h(x) + h.tag, h.__annotations__, h.__dict__.get("tag"), h.__qualname__

    check(f, torch.randn(3))


def _make_outside_closure(scale):
    def apply(t):
        return t * scale

    return apply


def test_closure_defined_outside_reads_cells():
    scaled = _make_outside_closure(3.0)
    offset = torch.ones(3)

    def f(x):
        return scaled(x) + offset

    check(f, torch.randn(3))


def test_changing_captured_value_outside_recompiles():
    scale = 2.0

    def f(x):
        return x * scale

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), x * 2.0)
    scale = 5.0  # noqa: F841 - read through the cell of f
    torch.testing.assert_close(compiled(x), x * 5.0)
    assert compiled.kiln_cache.fallback is None


def test_changing_cell_of_called_outside_closure_stays_correct():
    factor = 2

    def helper(t):
        return t * factor

    def f(x):
        return helper(x) + 1

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), x * 2 + 1)
    factor = 7  # noqa: F841
    torch.testing.assert_close(compiled(x), x * 7 + 1)
    assert compiled.kiln_cache.fallback is None


def test_closure_over_outside_tensor_sees_new_tensor():
    weight = torch.ones(3)

    def f(x):
        return x * weight

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), x)
    weight = torch.full((3,), 4.0)  # noqa: F841
    torch.testing.assert_close(compiled(x), x * 4)


def test_nonlocal_write_to_an_outside_cell_is_replayed():
    count = 0

    def f(x):
        nonlocal count
        count += 1
        return x + count

    x = torch.randn(3)
    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), x + 1)
    torch.testing.assert_close(compiled(x), x + 2)  # (the cell's contents are guarded: it recompiles)
    assert count == 2


def test_a_break_in_a_frame_with_closure_cells_resumes_and_shares_the_cells():
    # The broken frame's cells go to its resume function as they are: the closure made before the
    # break reads the value the rest of the frame writes.
    def f(x):
        k = 3

        def inner(y):
            return y * k

        y = inner(x).sin()
        print("a break")
        k = 5
        return inner(y).cos() + k

    compiled = kiln.compile(f, backend="eager")
    for _ in range(3):  # new cells and a new `inner` each call: no recompile
        x = torch.randn(4)
        torch.testing.assert_close(compiled(x), f(x))
    (entry,) = compiled.kiln_cache.entries
    assert entry.graph_break is not None and compiled.kiln_cache.fallback is None
    from kiln.capture.resume_code import origin

    (resume,) = [c for c in kiln.capture.cache.all_caches() if c.fn.__code__ is not f.__code__
                 and origin(c.fn.__code__)[0] is f.__code__]
    assert len(resume.entries) == 1 and resume.fallback is None


def test_functools_partial():
    def scaled_add(a, b, *, alpha=1.0, beta=0.0):
        return a + b * alpha + beta

    outside = functools.partial(scaled_add, alpha=3.0)

    def f(x, y):
        inside = functools.partial(scaled_add, x, beta=1.0)
        nested = functools.partial(inside, alpha=0.5)
        return inside(y), nested(y), outside(x, y), outside(x, y, alpha=2.0)

    check(f, torch.randn(3), torch.randn(3))


def _logged(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) + 1

    return wrapper


@_logged
def _decorated_outside(t, k=2):
    """Doc of the decorated function."""
    return t * k


def test_decorator_with_functools_wraps_defined_outside():
    def f(x):
        return _decorated_outside(x), _decorated_outside(x, k=3), _decorated_outside.__name__

    check(f, torch.randn(3))


def test_decorator_with_functools_wraps_applied_inside():
    def repeat(n):
        def decorate(fn):
            @functools.wraps(fn)
            def wrapper(t):
                for _ in range(n):
                    t = fn(t)
                return t

            return wrapper

        return decorate

    def f(x):
        @repeat(3)
        def step(t):
            """Add one."""
            return t + 1

        return step(x), step.__name__, step.__doc__

    check(f, torch.randn(3))


def test_bounded_recursion():
    def power(t, n):
        if n == 0:
            return torch.ones_like(t)
        return t * power(t, n - 1)

    def fib(n):
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    def f(x):
        return power(x, 4), fib(7)

    compiled = check(f, torch.randn(3))
    assert op_count(compiled) == 5


def test_recursion_through_a_closure():
    def f(x):
        def tree_sum(item):
            if isinstance(item, (list, tuple)):
                total = 0
                for sub in item:
                    total = total + tree_sum(sub)
                return total
            return item

        return tree_sum([x, (x * 2, [x + 1]), 3])

    check(f, torch.randn(3))


def test_unbounded_recursion_is_a_capture_error():
    def forever(t):
        return forever(t + 1)

    def f(x):
        return forever(x)

    with pytest.raises(kiln.CaptureError):
        kiln.compile(f, backend="eager", fullgraph=True)(torch.randn(2))


def test_deleted_cell_read_by_closure_raises_name_error_as_eager():
    def f(x):
        a = 1

        def g():
            return a

        del a
        try:
            g()
        except NameError as e:
            return x, str(e)
        return x, ""

    check(f, torch.randn(3))


def test_closures_made_in_a_loop():
    def f(x):
        late = [lambda: i for i in range(3)]
        total = 0
        for k in range(3):
            def h(k=k):
                return k * 2

            total += h()
        return x + total, [g() for g in late]

    check(f, torch.randn(3))


_CALLS = 0


def test_global_statement_write_is_replayed():
    def f(x):
        global _CALLS
        _CALLS += 1
        return x + _CALLS

    global _CALLS
    _CALLS = 0
    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), x + 1)
    torch.testing.assert_close(compiled(x), x + 2)
    assert _CALLS == 2
    assert compiled.kiln_cache.fallback is None


def test_nested_function_reads_cell_of_enclosing_scope_outside():
    def make():
        base = torch.full((3,), 10.0)

        def f(x):
            def inner():
                return x + base

            return inner()

        return f

    check(make(), torch.randn(3))


def test_curried_closures_and_shared_cell_between_two_closures():
    def f(x):
        def adder(a):
            def add_b(b):
                def add_c(c):
                    return a + b + c

                return add_c

            return add_b

        def counter():
            c = 0

            def inc():
                nonlocal c
                c += 1

            def get():
                return c

            return inc, get

        inc, get = counter()
        inc()
        inc()
        return adder(x)(1)(2), x * get()

    check(f, torch.randn(3))


def _module_appending_to_enclosing_list():
    kept = []

    class Recorder(torch.nn.Module):
        def forward(self, x):
            kept.append(x * 2)
            return x + self.shift

        @property
        def shift(self):
            kept.append("shift")
            return 1.0

        @staticmethod
        def note(value):
            kept.append(value)

    return kept, Recorder()


def test_a_method_appending_to_its_enclosing_functions_list_changes_the_real_list():
    """A method's closure is reached through the class: its list was once changed only in kiln's
    copy, so `kept` stayed empty where eager filled it."""
    kept, module = _module_appending_to_enclosing_list()
    compiled = kiln.compile(module)
    x = torch.randn(4)
    for _ in range(3):
        torch.testing.assert_close(compiled(x), x + 1)
    assert len(kept) == 6
    assert [k for k in kept if isinstance(k, str)] == ["shift"] * 3
    torch.testing.assert_close(kept[0], x * 2)

    def call_static(x):
        type(module).note(x.sum())
        return x * 3

    compiled_static = kiln.compile(call_static)
    compiled_static(x)
    torch.testing.assert_close(kept[-1], x.sum())


@functools.lru_cache
def _scale_for(n):
    return 1.0 / n


@functools.cache
def _offsets(n):
    return tuple(range(n))


class _Rotary(torch.nn.Module):
    @functools.lru_cache(maxsize=None)  # noqa: B019  (a cached method, as some models write them)
    def _angle(self, n):
        return 3.0 / n

    def forward(self, x):
        return x * self._angle(x.shape[-1])


def test_lru_cache_and_cache_wrapped_functions_are_captured():
    # `functools.lru_cache` is C code (issue 22: a transformers helper's call broke a whole speech
    # model's frame into eager). On constant arguments it is called for real while capturing, as
    # eager calls it (its cache filled or hit), and its constant result is a constant of the
    # graph; otherwise the wrapped function is traced.
    def f(x):
        return torch.relu(x) * _scale_for(x.shape[-1]) + len(_offsets(3))

    _scale_for.cache_clear()
    check(f, torch.randn(4, 8))  # one graph, no break
    assert _scale_for.cache_info().currsize == 1  # 8 -> 1/8, computed once, eager and the capture alike
    check(_Rotary(), torch.randn(2, 6))  # a method: `self` is no constant, so the body is traced

    @functools.lru_cache
    def scaled(t):  # a tensor argument: traced
        return t * 2

    check(lambda x: scaled(x) + 1, torch.randn(3))


@pytest.mark.parametrize("attr", ["func", "args", "keywords", "__call__", "__name__", "__qualname__", "__dict__", "missing"])
def test_hasattr_of_a_partial_made_inside_is_the_partial_objects(attr):
    def fn(t):
        p = functools.partial(lambda x, y: torch.sin(x) + torch.cos(y), y=t)
        return p(t) if hasattr(p, attr) else torch.zeros_like(t)

    t = torch.randn(3)
    torch.testing.assert_close(kiln.compile(fn, backend="eager", fullgraph=True)(t), fn(t))


def test_a_partial_passed_in_holding_a_tensor_and_a_module():
    layer = torch.nn.Linear(2, 2)
    scaled = functools.partial(lambda x, w, m: m(x) * w, w=torch.full((2,), 3.0), m=layer)

    def fn(f, x):
        return f(x) + 1

    x = torch.randn(2)
    compiled = kiln.compile(fn, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(scaled, x), fn(scaled, x))
    scaled.keywords["w"].fill_(2.0)  # read again on the next call, as any input
    torch.testing.assert_close(compiled(scaled, x), fn(scaled, x))


def _times(x, y):
    return x * y


def test_a_new_partial_of_the_same_function_reuses_the_graph():
    def fn(f0, f1, x):
        return f0(x) * f1(x)

    compiled = kiln.compile(fn, backend="eager", fullgraph=True)
    p0, p1 = functools.partial(_times, y=torch.randn(2, 2)), functools.partial(_times, y=torch.randn(2, 2))
    x = torch.randn(2, 2)
    torch.testing.assert_close(compiled(p0, p1, x), fn(p0, p1, x))
    torch.testing.assert_close(compiled(p1, p0, x), fn(p1, p0, x))  # other partials, same kinds: no recompile
    assert len(compiled.kiln_cache.entries) == 1
    p2 = functools.partial(lambda x, y: x + y, y=torch.randn(2, 2))  # another function: another graph
    torch.testing.assert_close(compiled(p2, p2, x), fn(p2, p2, x))
    assert len(compiled.kiln_cache.entries) == 2
