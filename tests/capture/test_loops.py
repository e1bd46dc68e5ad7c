"""Loops inside captured code: unrolled over Python values, with break/continue/else and early return."""

import pytest
import torch

import kiln
from tests.capture.util import check, op_count


def test_for_over_range():
    def f(x):
        for i in range(3):
            x = x * 2 + i
        for i in range(5, 1, -2):
            x = x - i
        return x

    compiled = check(f, torch.randn(3))
    assert op_count(compiled) == 8


def test_for_over_list_and_tuple():
    def f(x, ws, bs):
        for w in ws:
            x = x * w
        for b in bs:
            x = x + b
        return x

    check(f, torch.randn(3), [torch.randn(3), 2.0, torch.randn(3)], (1, torch.randn(3)))


def test_for_over_dict_keys_values_items():
    def f(x, d):
        out = {}
        for k in d:
            out[k] = d[k] * x
        for k, v in d.items():
            out[k + "_b"] = v + x
        total = 0
        for v in d.values():
            total = total + v
        return out, total

    check(f, torch.randn(3), {"a": torch.randn(3), "b": 2.0})


def test_enumerate_and_zip():
    def f(xs, ys):
        out = []
        for i, (a, b) in enumerate(zip(xs, ys)):
            out.append(a * i + b)
        for i, a in enumerate(xs, start=10):
            out.append(a + i)
        for a, b, c in zip(xs, ys, range(100)):
            out.append(a - b + c)
        return out

    check(f, [torch.randn(2) for _ in range(3)], [torch.randn(2) for _ in range(4)])


def test_while_with_counter():
    def f(x):
        i = 0
        while i < 4:
            x = x + i
            i += 1
        n = 10
        while n:
            n //= 2
            x = x * 1.5
        return x, i, n

    check(f, torch.randn(3))


def test_break_and_continue():
    def f(x):
        seen = []
        for i in range(10):
            if i % 2:
                continue
            if i > 6:
                break
            x = x + i
            seen.append(i)
        j = 0
        while True:
            j += 1
            if j == 3:
                continue
            if j >= 5:
                break
            x = x * 2
        return x, seen, j

    check(f, torch.randn(3))


def test_for_else_and_while_else():
    def find(items, target):
        for i, item in enumerate(items):
            if item == target:
                break
        else:
            i = -1
        return i

    def f(x):
        found = find([3, 5, 7], 5)
        missing = find([3, 5, 7], 4)
        n = 0
        while n < 3:
            n += 1
        else:
            x = x + 100  # runs: the loop ended without break
        m = 0
        while m < 3:
            m += 1
            if m == 2:
                break
        else:
            x = x + 1000  # skipped
        return x, found, missing, n, m

    check(f, torch.randn(3))


def test_nested_loops():
    def f(x):
        rows = []
        for i in range(3):
            row = []
            for j in range(i + 1):
                if j == 2:
                    break
                row.append(x[i] * j)
            rows.append(sum(row) if row else x[i])
        return torch.stack(rows)

    check(f, torch.randn(3))


def test_loop_building_tensors_unrolled():
    def f(x, w):
        outs = []
        h = torch.zeros(2)
        for t in range(x.shape[0]):
            h = torch.tanh(x[t] @ w + h)
            outs.append(h)
        return torch.stack(outs), h

    compiled = check(f, torch.randn(4, 3), torch.randn(3, 2))
    assert op_count(compiled) >= 4 * 3


def test_loop_over_tensor_rows():
    def f(x):
        total = torch.zeros(x.shape[1])
        for row in x:
            total = total + row.relu()
        return total

    check(f, torch.randn(3, 2))


def test_early_return_from_inside_loop():
    def first_big(xs, limit):
        for i, v in enumerate(xs):
            if v > limit:
                return i, v
        return -1, None

    def f(x):
        a = first_big([1, 4, 9], 3)
        b = first_big([1, 2], 3)
        for k in range(10):
            x = x + 1
            if k == 2:
                return x, a, b
        return x * 0, a, b

    check(f, torch.randn(3))


def test_early_return_from_nested_loop_in_inlined_callee():
    def find_pair(n, target):
        for i in range(n):
            for j in range(n):
                if i * j == target:
                    return i, j
        return None

    def f(x):
        i, j = find_pair(5, 6)
        return x * i + j, find_pair(3, 100)

    check(f, torch.randn(3))


def test_comprehensions_and_generator_loops():
    def f(x):
        squares = [x * i for i in range(3) if i != 1]
        table = {i: x + i for i in range(2)}
        total = sum(t.sum() for t in squares)
        return squares, table, total

    check(f, torch.randn(3))


def test_loop_variable_after_loop_and_loop_over_mutated_list():
    def f(x):
        for i in range(4):
            pass
        queue = [x]
        for item in queue:  # appends during iteration are seen, as in Python
            if len(queue) < 4:
                queue.append(item * 2)
        return i, queue

    check(f, torch.randn(3))


def test_branch_on_tensor_value_in_loop_is_a_capture_error():
    def f(x):
        while x.sum() < 10:  # data-dependent: cannot be unrolled
            x = x + 1
        return x

    x = torch.ones(3)
    with pytest.raises(kiln.CaptureError):
        kiln.compile(f, backend="eager", fullgraph=True)(x)
    torch.testing.assert_close(kiln.compile(f, backend="eager")(x), f(x))
