"""List, dict and set comprehensions and generator expressions."""

import itertools

import torch

import kiln
from tests.capture.util import check


def t(*shape):
    return torch.randn(*shape) if shape else torch.randn(3)


def test_list_comprehension_with_condition():
    def f(x):
        squares = [i * i for i in range(6) if i % 2 == 0]
        scaled = [x * i for i in range(3)]
        return squares, scaled, [x + k for k in squares if k > 0]

    check(f, t())


def test_dict_and_set_comprehensions():
    def f(x):
        names = ["a", "bb", "ccc"]
        lengths = {n: len(n) for n in names}
        tensors = {n: x * len(n) for n in names if n != "bb"}
        sizes = {len(n) % 2 for n in names}
        inverted = {v: k for k, v in lengths.items()}
        return lengths, tensors, sizes, inverted

    check(f, t())


def test_nested_comprehensions():
    def f(x):
        grid = [[i * j for j in range(3)] for i in range(2)]
        flat = [v for row in grid for v in row if v]
        pairs = [(i, j) for i in range(3) for j in range(i)]
        mats = [[x * i + j for j in range(2)] for i in range(2)]
        return grid, flat, pairs, torch.stack([torch.stack(r) for r in mats])

    check(f, t())


def test_comprehension_captures_outer_variables():
    def f(x, scale):
        offset = x.mean()
        factors = [1, 2, 3]
        out = [x * scale * k + offset for k in factors]
        keyed = {k: out[i] for i, k in enumerate("abc")}
        return out, keyed

    check(f, t(), 0.5)


def test_comprehension_over_list_of_tensors():
    def f(xs):
        doubled = [v * 2 for v in xs]
        shapes = [v.shape[0] for v in xs]
        positive = [v.relu() for v in xs if v.dim() == 1]
        return doubled, shapes, positive, torch.stack(doubled).sum(0)

    check(f, [t(), t(), t()])


def test_comprehension_over_tensor_rows():
    def f(x):
        return [row.sum() for row in x], torch.stack([r * i for i, r in enumerate(x)])

    check(f, t(4, 2))


def test_zip_enumerate_range_reversed():
    def f(xs, ys):
        sums = [a + b for a, b in zip(xs, ys)]
        weighted = [v * i for i, v in enumerate(xs, start=1)]
        back = [xs[i] for i in reversed(range(len(xs)))]
        stepped = [i for i in range(10, 0, -3)]
        return sums, weighted, back, stepped, [i * v for i, v in reversed(list(enumerate(ys)))]

    check(f, [t(), t()], [t(), t()])


def test_sorted_map_filter():
    def f(x):
        names = ["ccc", "a", "bb"]
        by_len = [n.upper() for n in sorted(names, key=len)]
        lengths = list(map(len, names))
        evens = list(filter(lambda n: n % 2 == 0, range(7)))
        shifted = [x + v for v in map(lambda n: n * 10, evens)]
        truthy = list(filter(None, [0, 1, "", "s", None]))
        return by_len, lengths, evens, shifted, truthy, sorted(names, reverse=True)

    check(f, t())


def test_map_over_tensors_with_two_iterables():
    def f(xs, ys):
        return list(map(torch.add, xs, ys)), list(map(lambda a: a.sin(), xs))

    check(f, [t(), t()], [t(), t()])


def test_any_all_sum_over_generators():
    def f(x, xs):
        n = sum(v.shape[0] for v in xs)
        total = sum(v * 2 for v in xs)
        has_big = any(v.dim() > 1 for v in xs)
        all_float = all(v.dtype == torch.float32 for v in xs)
        none = any(i > 10 for i in range(3))
        every = all(i >= 0 for i in range(3))
        return x * n + total, has_big, all_float, none, every, sum(i for i in range(5) if i % 2), sum([], 0)

    check(f, t(), [t(), t(), t()])


def test_generator_expression_consumed_by_constructors():
    def f(x):
        tup = tuple(x * i for i in range(3))
        st = set(i % 2 for i in range(5))
        d = dict((str(i), x + i) for i in range(2))
        lst = list(v for v in tup)
        return tup, st, d, lst, torch.cat(tuple(v.unsqueeze(0) for v in tup)), max(i * i for i in range(4))

    check(f, t())


def test_generator_expression_partially_consumed():
    def f(x):
        gen = (x * i for i in range(1, 4))
        first = next(gen)
        rest = list(gen)
        empty = next((v for v in []), None)
        return first, rest, empty

    check(f, t())


def test_comprehension_variable_does_not_leak():
    def f(x):
        i = 100
        ys = [x * i for i in range(2)]
        return ys, i

    check(f, t())


def test_comprehension_over_dict_items_and_string():
    def f(x, d):
        scaled = {k: v * 2 for k, v in d.items() if k != "skip"}
        chars = [c for c in "hello" if c != "l"]
        return scaled, chars, [k for k in d], {c: i for i, c in enumerate("ab")}

    check(f, t(), {"a": t(), "skip": 1, "b": t()})


def test_itertools_inside_comprehension():
    def f(x):
        prods = [x * a + b for a, b in itertools.product(range(2), [10, 20])]
        chained = [v for v in itertools.chain([1, 2], (3,))]
        return prods, chained

    check(f, t())


def test_conditional_expression_inside_comprehension():
    def f(x):
        return [x * i if i % 2 else -x for i in range(4)], {i: ("odd" if i % 2 else "even") for i in range(3)}

    check(f, t())


def test_walrus_in_comprehension():
    def f(x):
        out = [y for i in range(4) if (y := i * 2) > 2]
        return x * len(out), out, y

    check(f, t())


def test_comprehension_in_nested_function_with_closure():
    def f(x):
        scale = 3

        def apply(values):
            return [v * scale for v in values]

        return apply([x, x + 1]), [apply([i]) for i in range(2)]

    check(f, t())


def test_a_break_inside_a_comprehension_over_a_zip_of_a_count():
    # A break inside a comprehension compiles the comprehension's own frame, whose code takes its
    # iterator as ".0" (Python 3.11): the binder renames it (it was a SyntaxError raised to the
    # user; found by Dynamo's test_dict_list_values).
    import itertools

    def inner(args):
        return [x[1].shape for x in args]

    def fn(tensors):
        return inner(zip(itertools.count(), tensors["args"]))

    compiled = kiln.compile(fn, backend="eager")
    for args in ([torch.ones(5, 5), torch.ones(5, 6)], [torch.ones(5, 7)]):
        assert compiled({"args": args}) == fn({"args": args})
