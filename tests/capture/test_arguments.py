"""Argument binding of the compiled function and of inlined callees: defaults, keyword-only,
positional-only, *args/**kwargs, f(*t, **d), and the TypeError of a bad call."""

import pytest
import torch

import kiln
from tests.capture.util import check, op_count


def test_defaults_of_compiled_function():
    def f(x, a=2, b=3.0):
        return x * a + b

    check(f, torch.randn(3))
    check(f, torch.randn(3), 5)
    check(f, torch.randn(3), b=-1.0)


def test_keyword_only_arguments():
    def f(x, *, scale, shift=0.5):
        return x * scale + shift

    check(f, torch.randn(3), scale=2.0)
    check(f, torch.randn(3), shift=1.0, scale=3.0)


def test_positional_only_arguments():
    def f(x, y=1.0, /, z=2.0):
        return x * y + z

    check(f, torch.randn(3), 4.0, z=5.0)
    check(f, torch.randn(3))


def test_varargs_and_varkw_of_compiled_function():
    def f(x, *rest, **options):
        out = x
        for r in rest:
            out = out + r
        if options.get("double"):
            out = out * 2
        return out, len(rest), sorted(options)

    check(f, torch.randn(3), torch.randn(3), 2.0, double=True, tag="t")
    check(f, torch.randn(3))


def test_inlined_callee_with_all_parameter_kinds():
    def g(a, b=1, /, c=2, *args, d, e=5, **kw):
        return a * b + c + sum(args) + d * e + sum(kw.values()), list(kw)

    def f(x):
        return (
            g(x, d=1),
            g(x, 2, 3, 4, 5, d=6, z=7),
            g(x, c=10, d=0, e=1, y=2, b=3),  # `b` is positional-only: it lands in **kw
        )

    check(f, torch.randn(3))


def test_call_with_star_args_and_star_star_kwargs():
    def g(a, b, c=0, *, k=1, **kw):
        return (a + b + c) * k, kw

    def f(x, t, d):
        return g(*t, **d), g(x, *t[:1], **{"k": 3}), g(*(x, x), c=1, **d), g(x, *[], b=2, **{})

    check(f, torch.randn(3), (torch.randn(3), 2.0), {"k": 2, "extra": 5})


def test_compiled_function_called_with_star_args():
    def f(x, y, *, k=1):
        return x * y * k

    args, kwargs = (torch.randn(3), torch.randn(3)), {"k": 3}
    check(f, *args, **kwargs)


def test_varargs_forwarding_through_wrappers():
    def inner(x, y=1, *, z=2):
        return x * y + z

    def forward_all(*args, **kwargs):
        return inner(*args, **kwargs)

    def f(x):
        return forward_all(x), forward_all(x, 3), forward_all(x, z=4), forward_all(*[x], **{"y": 5})

    check(f, torch.randn(3))


def test_default_arguments_that_are_tensors_or_none():
    bias = torch.randn(3)

    def g(x, b=bias, mask=None, *, weight=None):
        if mask is not None:
            x = x * mask
        if weight is None:
            weight = torch.ones(3)
        return x * weight + b

    def f(x, m=None, w=torch.full((3,), 2.0)):
        return g(x), g(x, mask=m), g(x, weight=w), g(x, x, x, weight=x)

    compiled = check(f, torch.randn(3))
    check(f, torch.randn(3), torch.randn(3))
    assert op_count(compiled) > 0


def test_tensor_default_is_read_not_copied():
    state = torch.zeros(3)

    def f(x, acc=state):
        return x + acc

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), x)
    state.add_(1.0)  # in-place change of the default tensor is seen
    torch.testing.assert_close(compiled(x), x + 1)


def test_mutable_default_arguments_read_only():
    def g(x, scales=[1.0, 2.0], table={"a": 3.0}):  # noqa: B006
        out = x
        for s in scales:
            out = out * s
        return out + table["a"], len(scales), list(table)

    def f(x, names=("a", "b"), opts={"k": 2}):  # noqa: B006
        return g(x), g(x, [4.0]), names, opts["k"] * x

    check(f, torch.randn(3))


def test_mutable_default_changed_outside_is_seen():
    def f(x, cfg={"k": 2.0}):  # noqa: B006
        return x * cfg["k"]

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), x * 2)
    f.__defaults__[0]["k"] = 5.0
    torch.testing.assert_close(compiled(x), x * 5)


def test_bad_call_of_compiled_function_raises_type_error_as_eager():
    def f(x, y, /, *, k):
        return x + y * k

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    calls = [((x,), {"k": 1}), ((x, x, x), {"k": 1}), ((x, x), {}), ((x, x), {"k": 1, "z": 2}), ((x,), {"y": x, "k": 1})]
    for args, kwargs in calls:
        with pytest.raises(TypeError) as expected:
            f(*args, **kwargs)
        with pytest.raises(TypeError) as actual:
            compiled(*args, **kwargs)
        assert str(actual.value) == str(expected.value)


def test_bad_call_of_inlined_callee_escaping_raises_type_error():
    def g(a, b):
        return a + b

    def f(x):
        return g(x, x, x)

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    with pytest.raises(TypeError, match=r"takes 2 positional arguments but 3 were given"):
        compiled(torch.randn(3))


def _callee(a, b=1, /, c=2, *, k):
    return a


def test_bad_call_caught_inside_has_eager_message():
    def f(x):
        messages = []
        for args, kwargs in [((), {"k": 1}), ((1, 2, 3, 4), {"k": 1}), ((1,), {"z": 1, "k": 1}),
                             ((1,), {"b": 2, "k": 1}), ((1,), {}), ((1, 2), {"a": 1, "k": 1}),
                             ((1, 2, 3), {"c": 3, "k": 1})]:
            try:
                _callee(*args, **kwargs)
            except TypeError as e:
                messages.append(str(e))
        return x, messages

    compiled = check(f, torch.randn(2))
    assert len(compiled(torch.randn(2))[1]) == 7


def test_bad_call_of_lambda_and_nested_function_caught_inside():
    def f(x):
        def inner(a, *, b):
            return a

        out = []
        for call in (lambda: inner(x), lambda: inner(x, x, b=1), lambda: (lambda t: t)()):
            try:
                call()
            except TypeError as e:
                out.append(e.args[0])
        return x, out

    check(f, torch.randn(2))


def test_different_argument_kinds_recompile_or_reuse():
    def f(x, n=1, *, flag=False):
        return x * n if flag else x + n

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    for args, kwargs in [((x,), {}), ((x, 1), {}), ((x,), {"n": 1}), ((x, 2), {"flag": True}), ((x,), {})]:
        torch.testing.assert_close(compiled(*args, **kwargs), f(*args, **kwargs))
    assert len(compiled.kiln_cache.entries) == 2  # n=1/flag=False shared however it is passed
    assert compiled.kiln_cache.fallback is None


def test_a_parameter_named_self_passed_by_keyword():
    # Dynamo's test_repros.py test_foreach_decomp_arg_names: the compiled function's own
    # __call__(self, ...) took the user's `self=` keyword.
    def foreach_pow(self, exponent):
        return [t ** exponent for t in self]

    compiled = kiln.compile(foreach_pow, backend="eager", fullgraph=True)
    x = [torch.rand(2, 2)]
    torch.testing.assert_close(compiled(self=x, exponent=2.5), foreach_pow(self=x, exponent=2.5))
