"""Unpacking in assignments, calls and literals."""

import pytest
import torch

import kiln
from tests.capture.util import check


def t(*shape):
    return torch.randn(*shape) if shape else torch.randn(3)


def test_tuple_and_list_unpacking():
    def f(x):
        a, b = x, x + 1
        [c, d] = [x * 2, 3]
        (e, g), h = (x, 1), 2
        return a + b + c * d, e * g + h

    check(f, t())


def test_unpack_input_sequences():
    def f(pair, items):
        a, b = pair
        c, d, e = items
        return a * b + c - d, e

    check(f, (t(), t()), [t(), 2, "s"])


def test_starred_unpacking():
    def f(x):
        a, *b, c = [x, x + 1, x + 2, x + 3]
        *d, e = (1, 2, 3)
        g, *h = (x,)
        first, *rest = "abc"
        return a + c, b, d, e, g, h, first, rest

    check(f, t())


def test_starred_unpacking_of_input_and_shape():
    def f(xs, y):
        head, *tail = xs
        *batch, n = y.shape
        return head * len(tail), batch, n, tail

    check(f, [t(), t(), t()], t(2, 3, 4))


def test_nested_unpacking():
    def f(data):
        (a, (b, c)), [d, *e] = data
        return a + b * c, d, e

    check(f, ((t(), (t(), t())), [1, 2, 3]))


def test_unpacking_in_for_loops():
    def f(pairs):
        total = 0
        for i, (a, b) in enumerate(pairs):
            total = total + a * b * i
        for (a, b), k in zip(pairs, "xy"):
            total = total + a
        return total

    check(f, [(t(), t()), (t(), t())])


def test_unpack_shape():
    def f(x):
        b, c, h = x.shape
        n, *rest = x.size()
        return x.reshape(b * c, h), n, rest, x.new_ones(h, b)

    check(f, t(2, 3, 4))


def test_swap_and_rotate():
    def f(x, y):
        x, y = y, x
        a, b, c = x, y, x * y
        a, b, c = c, a, b
        return x - y, a, b, c

    check(f, t(), t())


def test_unpack_tensor_along_dim0():
    def f(x):
        a, b, c = x
        first, *others = x
        return a + b * c, first, others

    check(f, t(3, 2))


def test_unpack_chunk_and_split_results():
    def f(x):
        q, k, v = x.chunk(3, dim=-1)
        a, b = torch.split(x, [2, 4], dim=-1)
        return q @ k.transpose(0, 1) + v.sum(), a, b

    check(f, t(2, 6))


def test_unpack_dict_iterates_keys():
    def f(x):
        d = {"a": x, "b": 2}
        k1, k2 = d
        (ka, va), (kb, vb) = d.items()
        return k1, k2, ka, va * vb

    check(f, t())


def test_star_args_in_calls():
    def add3(a, b, c):
        return a + b * c

    def f(x):
        args = [x, x + 1]
        pair = (2, 3)
        return add3(*args, 2), add3(x, *pair), add3(*[x], *(x, x)), torch.cat([*args, x]), max(*pair)

    check(f, t())


def test_double_star_kwargs_in_calls():
    def g(a, b=1, *, c=2, **rest):
        return a * b + c, sorted(rest)

    def f(x):
        kw = {"b": 3, "c": x}
        extra = {"z": 1, "y": 2}
        return g(x, **kw), g(a=x, **extra), g(x, **kw, **extra), g(**{"a": x})

    check(f, t())


def test_star_args_from_inputs():
    def g(*args, **kwargs):
        return len(args), sorted(kwargs), args[0] * kwargs["scale"]

    def f(items, options):
        return g(*items, **options)

    check(f, [t(), t()], {"scale": 2.0, "other": None})


def test_duplicate_keyword_raises_caught():
    def g(a):
        return a

    def f(x):
        try:
            return g(a=x, **{"a": x})
        except TypeError:
            return x + 1

    check(f, t())


def test_star_in_literals():
    def f(x):
        a, b = [x, 1], (2, x + 1)
        lst = [*a, *b, 3]
        tup = (*a, *range(2))
        st = {*"ab", *[1, 2], 2}
        return lst, tup, sorted(st, key=str), [*x.shape, 5]

    check(f, t(2, 3))


def test_double_star_in_dict_literals():
    def f(x, d):
        d1 = {"a": x, "b": 1}
        merged = {**d1, **d, "c": 3}
        override = {"b": 0, **d1}
        return merged, override, {**{}}, list(merged)

    check(f, t(), {"b": t(), "z": 2})


def test_unpacking_return_values_of_inlined_functions():
    def stats(x):
        return x.mean(), x.std(), x.shape

    def f(x):
        m, s, (n, k) = stats(x)
        return (x - m) / s * n + k

    check(f, t(4, 5))


def test_too_many_values_caught():
    def f(x):
        try:
            a, b = (x, x, x)
        except ValueError:
            a, b = x, 0
        try:
            c, d, *e = [1]
        except ValueError:
            c = 5
        return a + b + c

    check(f, t())


def test_unpacking_a_tensor_with_wrong_length_raises_like_eager():
    def f(x):
        a, b = x
        return a + b

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    with pytest.raises(ValueError):
        f(t(3, 2))
    with pytest.raises(ValueError):
        compiled(t(3, 2))
