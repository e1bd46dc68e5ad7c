"""Python operators and numeric builtins: constants folded while capturing, tensors in the graph."""

import math
import operator

import pytest
import torch

from tests.capture.util import check, op_count

BINARY_CASES = [
    (operator.add, 7, 3), (operator.sub, 7, 3), (operator.mul, 7, 3), (operator.truediv, 7, 2),
    (operator.floordiv, 7, 2), (operator.floordiv, -7, 2), (operator.floordiv, 7.5, 2), (operator.mod, -7, 3),
    (operator.mod, 7.5, -2), (operator.pow, 2, 10), (operator.pow, 2, -1), (operator.pow, 2.0, 0.5),
    (operator.and_, 12, 10), (operator.or_, 12, 10), (operator.xor, 12, 10), (operator.lshift, 3, 4),
    (operator.rshift, 100, 3), (operator.and_, True, False), (operator.or_, True, False), (operator.xor, True, True),
    (operator.add, True, 2), (operator.mul, 1.5, 4), (operator.sub, 0.1, 3),
]


def _binary_source(fn):
    return {
        operator.add: "a + b", operator.sub: "a - b", operator.mul: "a * b", operator.truediv: "a / b",
        operator.floordiv: "a // b", operator.mod: "a % b", operator.pow: "a ** b", operator.and_: "a & b",
        operator.or_: "a | b", operator.xor: "a ^ b", operator.lshift: "a << b", operator.rshift: "a >> b",
    }[fn]


def _compile_expression(source, names="x, a, b"):
    # Each operator written as Python syntax so BINARY_OP (not a call) is what runs.
    namespace = {"torch": torch, "math": math, "operator": operator}
    exec(f"def f({names}):\n    return x + 1, {source}\n", namespace)
    return namespace["f"]


@pytest.mark.parametrize("fn, a, b", BINARY_CASES, ids=lambda v: getattr(v, "__name__", repr(v)))
def test_binary_operator_on_constants(fn, a, b):
    check(_compile_expression(_binary_source(fn)), torch.randn(3), a, b)


@pytest.mark.parametrize("symbol", ["+=", "-=", "*=", "/=", "//=", "%=", "**=", "&=", "|=", "^=", "<<=", ">>="])
def test_inplace_operator_on_ints(symbol):
    namespace = {}
    exec(f"def f(x, a, b):\n    a {symbol} b\n    return x * 2, a\n", namespace)
    check(namespace["f"], torch.randn(3), 13, 3)


def test_inplace_operators_on_floats_and_sequences():
    def f(x, n):
        total = 1.5
        total += n
        total *= 2
        total -= 0.25
        total /= 4
        items = [1, 2]
        alias = items
        items += [3]
        items *= 2
        t = (1,)
        t += (2, 3)
        t *= 2
        s = "ab"
        s += "c"
        s *= 2
        return x + total, items, alias, t, s

    check(f, torch.randn(2), 3)


def test_unary_operators():
    def f(x, a, b, c):
        return x, -a, +a, ~a, not a, -b, +b, not b, -c, ~c, not c, not 0, not "", not [x], -(-a)

    check(f, torch.randn(2), 5, 2.5, True)


@pytest.mark.parametrize("a, b", [(1, 2), (2, 2), (3, 2), (1.5, 1), (True, 1), ("ab", "b"), ((1, 2), (1, 3))])
def test_comparisons(a, b):
    def f(x, a, b):
        return x.relu(), a < b, a <= b, a == b, a != b, a > b, a >= b

    check(f, torch.randn(2), a, b)


def test_chained_comparisons():
    def f(x, a, b, c):
        return x * 2, a < b < c, a < b > c, 0 <= a < 10, a == b == c, a < b <= c != 4, c > b > a > 0

    check(f, torch.randn(2), 1, 2, 3)
    check(f, torch.randn(2), 3, 2, 2)


def test_chained_comparison_short_circuits():
    calls = []

    def side(v):
        calls.append(v)
        return v

    def f(x, a):
        ok = 5 < a < side(10)
        return x + 1, ok

    check(f, torch.randn(2), 1)
    check(f, torch.randn(2), 7)


def test_is_and_is_not():
    marker = object()

    def f(x, a, b, none):
        return (x, a is None, none is None, none is not None, a is not None, a is b, True is True,
                marker is marker, f is f, x is x, x is not x, type(a) is int, type(a) is not float, ... is ...)

    check(f, torch.randn(2), 3, 3, None)


def test_in_and_not_in():
    def f(x, key, word):
        table = {"a": 1, "b": 2}
        return (x - 1, key in table, key not in table, 3 in [1, 2, 3], 4 not in (1, 2), "ell" in word,
                "z" not in word, 2 in {1, 2}, 5 in range(10), 10 in range(10), key in ["b", "c"])

    check(f, torch.randn(2), "a", "hello")
    check(f, torch.randn(2), "b", "world")


def test_in_with_tensor_items_compares_by_identity_first():
    def f(x, y):
        items = [x, y]
        return x + y, x in items

    check(f, torch.randn(2), torch.randn(2))


def test_zero_division_is_raised_and_handled():
    def f(x, a):
        try:
            r = a // 0
        except ZeroDivisionError:
            r = -1
        try:
            q = a % 0.0
        except ZeroDivisionError as e:
            q = str(e)
        return x + r, r, q

    check(f, torch.randn(2), 4)


def test_big_int_and_float_edge_cases():
    def f(x, a):
        big = a ** 40
        return x, big, big // 3, big % 1000, -big >> 5, float("inf") > big, 0.1 + 0.2, 1e300 * 10, (-8) ** (1 / 3) == (-8) ** (1 / 3)

    check(f, torch.randn(2), 7)


# --- tensors mixed with scalars -----------------------------------------------------------------


def test_tensor_scalar_arithmetic():
    def f(x, n, s):
        return (x + n, n - x, x * s, s / (x.abs() + 1), x // 2, 7 % (x.abs() + 1), x ** 2, 2 ** x, -x, +x,
                x - n * s, (x + 1) / n)

    compiled = check(f, torch.randn(5), 3, 0.5)
    assert op_count(compiled) > 0


def test_tensor_inplace_operators():
    def f(x, y):
        z = x.clone()
        z += y
        z *= 2
        z -= 1
        z /= 3
        w = y
        w = w + 1
        return z, w

    check(f, torch.randn(4), torch.randn(4))


def test_tensor_inplace_on_argument_mutates_it():
    def f(x, y):
        x += y
        x *= 2
        return x

    check(f, torch.randn(4), torch.randn(4))


def test_int_inplace_with_tensor_rebinds():
    def f(x):
        n = 3
        n += x
        m = 2.0
        m *= x
        return n, m

    check(f, torch.randn(3))


def test_matmul():
    def f(a, b, v):
        c = a @ b
        c @= b.T @ b
        return c, a @ v, v @ v

    check(f, torch.randn(2, 3), torch.randn(3, 3), torch.randn(3))


def test_integer_tensor_bit_operations():
    def f(a, b, m):
        return a & b, a | b, a ^ b, ~a, a << 1, b >> 1, m & ~m, m | True, a & 3, 5 ^ b

    check(f, torch.tensor([1, 2, 12]), torch.tensor([3, 8, 10]), torch.tensor([True, False, True]))


def test_tensor_comparisons_produce_bool_tensors():
    def f(x, y):
        return x < y, x <= 0, x == y, x != 0.5, 1 > x, x >= y, (x > 0) & (y < 0), ~(x > 0), (x < 0) | (y > 0)

    check(f, torch.randn(6), torch.randn(6))


def test_tensor_comparison_in_python_branch_is_unsupported():
    import kiln
    from kiln.capture.break_records import CaptureError

    def f(x):
        if (x > 0).all():
            return x + 1
        return x - 1

    with pytest.raises(CaptureError):
        kiln.compile(f, backend="eager", fullgraph=True)(torch.ones(3))
    fallback = kiln.compile(f, backend="eager")
    for x in (torch.ones(3), -torch.ones(3)):
        torch.testing.assert_close(fallback(x), f(x))


def test_scalar_result_of_shape_arithmetic():
    def f(x):
        n, m = x.shape
        half = n // 2
        return x[:half] * (m ** 2 - n % 3), n * m, n / m, -n, n > m

    check(f, torch.randn(4, 3))


def test_tensor_with_sequence_and_number_types():
    def f(x):
        return x + True, x * 2.5, x * False, x.int() + 1, x.int() / 2, x.int() // 2, x.bool() + 1

    check(f, torch.randn(4) * 4)


# --- math, builtins and the operator module on constants --------------------------------------------


def test_math_functions_on_constants():
    def f(x, a, b):
        return (x * math.pi, math.sqrt(a), math.floor(b), math.ceil(b), math.log(a), math.log(a, 2), math.exp(b),
                math.sin(b), math.gcd(a, 12), math.isclose(a, a + 1e-12), math.inf > a, math.isnan(b), math.prod([a, 3]),
                math.factorial(5), math.hypot(3, a), math.trunc(-b), math.copysign(a, -1), math.fsum([0.1] * 10),
                math.isqrt(a), math.e, math.tau, math.radians(180), math.comb(a, 2), math.log2(a), math.log10(1000))

    check(f, torch.randn(2), 16, 2.75)


def test_math_function_result_scales_tensor():
    def f(x, d):
        scale = 1 / math.sqrt(d)
        return x * scale + math.log(d)

    check(f, torch.randn(3), 64)


def test_math_of_tensor_is_unsupported():
    import kiln
    from kiln.capture.break_records import CaptureError

    def f(x):
        return math.sqrt(x)

    with pytest.raises(CaptureError):
        kiln.compile(f, backend="eager", fullgraph=True)(torch.tensor(4.0))
    assert kiln.compile(f, backend="eager")(torch.tensor(4.0)) == f(torch.tensor(4.0))


def test_numeric_builtins():
    def f(x, a, b):
        return (x, divmod(a, 3), divmod(-a, 3), divmod(b, 0.5), abs(-a), abs(-b), round(b), round(b, 1), round(2.5),
                round(3.5), round(a, -1), min(a, 3), max(a, 3), min([5, a, 9]), max((b, 1.0)), min(a, b), sum([1, 2, a]),
                sum([b, b], 0.5), sum(range(a)), pow(a, 2), pow(a, 2, 5), max([1, 5, 3], key=lambda v: -v),
                min([], default=7), max("abc"), int(b), float(a), bool(a), int("42"), int("ff", 16), float("1.5"),
                complex(1, a).imag, a.bit_length(), b.is_integer(), (2.5).as_integer_ratio(), hex(a), bin(a), oct(a),
                chr(65 + a % 26), ord("z"))

    check(f, torch.randn(2), 11, 2.25)


def test_min_max_sum_over_tensors():
    def f(x, y):
        total = sum([x, y, x * y])
        try:
            pair = divmod(x, 2)  # Tensor has no __divmod__
        except TypeError:
            pair = (x // 2, x % 2)
        return total, sum([x, y], torch.ones(3)), abs(x), pair

    check(f, torch.randn(3), torch.randn(3))


def test_max_over_tensors_of_many_elements_is_unsupported():
    # Python's max compares them with `>`: a tensor of booleans, whose truth eager refuses.
    import kiln
    from kiln.capture.break_records import CaptureError

    def f(x, y):
        return max(x, y)

    with pytest.raises(CaptureError):
        kiln.compile(f, backend="eager", fullgraph=True)(torch.randn(3), torch.randn(3))


def test_max_and_min_of_one_element_tensors_and_numbers_in_the_graph():
    import kiln

    def f(a, b):
        s, t = a.sum(), b.sum()
        return min(max(s, 0), 1), max(0, min(1, t)), max(s, t) - min(s, t), max(map(lambda v: v.sum(), [a, b]))

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    for a, b in ((torch.randn(4), torch.randn(4)), (torch.full((2,), 3.0), torch.full((2,), -3.0))):
        got, want = compiled(a, b), f(a, b)
        for g, w in zip(got, want):
            assert isinstance(g, torch.Tensor) and float(g) == float(w)  # (a tensor even where Python gives the number)


def test_operator_module_functions():
    def f(x, a, b):
        return (operator.add(x, a), operator.mul(a, b), operator.sub(a, b), operator.truediv(a, b),
                operator.floordiv(a, b), operator.mod(a, b), operator.pow(a, 2), operator.neg(a), operator.pos(b),
                operator.invert(a), operator.not_(a), operator.truth(b), operator.lt(a, b), operator.le(a, a),
                operator.eq(a, b), operator.ne(a, b), operator.gt(a, b), operator.ge(b, a), operator.and_(a, 6),
                operator.or_(a, 6), operator.xor(a, 6), operator.lshift(a, 2), operator.rshift(a, 1),
                operator.is_(a, a), operator.is_not(a, None), operator.contains([1, a], a), operator.index(a),
                operator.abs(-b), operator.iadd(a, 1), operator.getitem((a, b), 1), operator.itemgetter(1)((a, b)),
                operator.attrgetter("real")(a), operator.concat([a], [b]), operator.mul(x, x), operator.neg(x),
                operator.matmul(x, x), operator.methodcaller("upper")("abc"))

    check(f, torch.randn(3), 5, 2.0)


def test_operator_functions_as_values():
    def f(x, a):
        ops = [operator.add, operator.mul, operator.sub]
        results = [op(a, 3) for op in ops]
        tensor_results = [op(x, a) for op in ops]
        return results, tensor_results, operator.add.__name__

    check(f, torch.randn(3), 4)


def test_functools_reduce_with_operator():
    import functools

    def f(x, a):
        return functools.reduce(operator.mul, [a, 2, 3]), functools.reduce(operator.add, [x, x, x], 0)

    check(f, torch.randn(3), 4)


def test_operator_getters_on_variables():
    by_second = operator.itemgetter(1)

    def f(x, pair):
        first_two = operator.itemgetter(0, 1)
        shape_of = operator.attrgetter("shape")
        parts = operator.methodcaller("split", ",")
        scaled = operator.methodcaller("mul", 2)
        return (first_two([x, x + 1, x + 2]), by_second(pair), shape_of(x), parts("a,b"), scaled(x),
                operator.attrgetter("real", "imag")(3), sorted([(1, "b"), (0, "c")], key=by_second))

    check(f, torch.randn(3), (1, torch.ones(2)))


def test_operator_setitem_and_delitem_mutate():
    def f(x, items, table):
        operator.setitem(items, 0, x * 2)
        operator.delitem(table, "a")
        operator.setitem(table, "b", x)
        more = [1]
        operator.iconcat(more, [2])
        return x + 1, more

    check(f, torch.randn(2), [0, 1], {"a": 1})


def test_set_operators():
    def f(x, a, b):
        s, t = set(a), set(b)
        u = s
        u |= {9}
        frozen = frozenset(a)
        return (x + 1, sorted(s | t), sorted(s & t), sorted(s - t), sorted(s ^ t), s <= (s | t), s < s, t > s, s >= s,
                sorted(frozen | {8}), type(frozen | {8}).__name__, sorted(u), s == u)

    check(f, torch.randn(2), [1, 2, 3], [3, 4])


def test_set_inplace_operators_on_argument():
    def f(x, s):
        s |= {5}
        s -= {1}
        s &= {2, 5, 7}
        s ^= {7}
        return x * 2

    check(f, torch.randn(2), {1, 2, 3})


def test_dict_union_operators():
    def f(x, d):
        merged = d | {"b": x * 2, "c": 3}
        d |= {"z": x}
        return merged, d

    check(f, torch.randn(2), {"a": 1, "b": 2})


def test_string_and_exception_conversions():
    def f(x, a):
        try:
            a / 0
        except ZeroDivisionError as e:
            text, rep = str(e), repr(e)
        return x, text, rep, str([a, 2.5, "s"]), repr((a, None)), str({"k": a})

    check(f, torch.randn(2), 3)
