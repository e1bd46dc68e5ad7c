"""Dynamic ints: an int argument whose value changes is captured again as a symbolic int (a graph
input), so later values reuse that capture; `dynamic=True` does so from the first call; the
setting `capture.dynamic_sources` names inputs symbolic from the start."""

import pytest
import torch

import kiln
from tests.capture.test_graph_breaks import Counting
from tests.kiln_backend import private_cache  # noqa: F401  (each test compiles in an empty cache)

STEP = 3  # a global int: stays a constant, as in Dynamo


def scale(x, n):
    return x * n + 1


def _int_inputs(gm):
    return [n for n in gm.graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("example_value"), torch.SymInt)]


def test_an_int_that_changes_is_captured_again_as_a_symbolic_int():
    backend = Counting()
    compiled = kiln.compile(scale, backend=backend)
    x = torch.randn(4)
    for n in [2, 3, 4, 5, -7, 0, 1]:
        torch.testing.assert_close(compiled(x, n), scale(x, n))
    assert len(backend.graphs) == 2  # n == 2, then every n
    assert not _int_inputs(backend.graphs[0]) and len(_int_inputs(backend.graphs[1])) == 1


def test_dynamic_true_makes_int_arguments_symbolic_from_the_first_call_and_guards_branches():
    backend = Counting()

    def fn(x, n):
        return x.sum() + n if n > 2 else x - n

    compiled = kiln.compile(fn, backend=backend, dynamic=True)
    x = torch.randn(4)
    for n in [3, 4, 9, 1, 0, 2]:
        torch.testing.assert_close(compiled(x, n), fn(x, n))
    assert len(backend.graphs) == 2  # n > 2, then n <= 2
    assert all(len(_int_inputs(gm)) == 1 for gm in backend.graphs)


@pytest.mark.parametrize("how", ["dynamic=False", "setting off"])
def test_ints_stay_constants_with_dynamic_false_or_the_setting_off(how):
    backend = Counting()
    x = torch.randn(4)
    with kiln.config.patch({"capture.dynamic_ints": how != "setting off"}):
        compiled = kiln.compile(scale, backend=backend, dynamic=False if how == "dynamic=False" else None)
        for n in [2, 3, 4]:
            torch.testing.assert_close(compiled(x, n), scale(x, n))
    assert len(backend.graphs) == 3 and not any(_int_inputs(gm) for gm in backend.graphs)


def test_items_of_an_int_list_argument_become_symbolic():
    backend = Counting()

    def fn(x, y):
        return torch.sin(x + y[1] % 2)

    compiled = kiln.compile(fn, backend=backend)
    x = torch.randn(6)
    for i in range(10, 25, 3):
        torch.testing.assert_close(compiled(x, [i, i + 1, i + 2]), fn(x, [i, i + 1, i + 2]))
    assert len(backend.graphs) == 2


def test_a_global_int_stays_a_constant():
    backend = Counting()
    compiled = kiln.compile(lambda x: x * STEP, backend=backend)
    x = torch.randn(3)
    global STEP
    for value in [3, 4, 5]:
        STEP = value
        torch.testing.assert_close(compiled(x), x * value)
    STEP = 3
    assert len(backend.graphs) == 3 and not any(_int_inputs(gm) for gm in backend.graphs)


def test_where_python_needs_the_number_it_is_specialized_and_guarded():
    backend = Counting()

    def fn(x, n):
        for i in range(n):
            x = x + i
        return x

    compiled = kiln.compile(fn, backend=backend)
    x = torch.randn(3)
    for n in [2, 3, 4, 3, 4]:
        torch.testing.assert_close(compiled(x, n), fn(x, n))
    assert len(backend.graphs) == 3  # 2, then 3 (symbolic, specialized by range), then 4


def test_another_type_at_a_symbolic_int_captures_again():
    compiled = kiln.compile(scale, backend=Counting())
    x = torch.randn(4)
    for n in [2, 3, 2.5, True, 4]:
        torch.testing.assert_close(compiled(x, n), scale(x, n))


def test_a_symbolic_int_alive_at_a_graph_break_and_returned(capsys):
    def fn(x, n):
        y = x * n
        print("break")
        return y + n, n + 1, n

    compiled = kiln.compile(fn, backend=Counting())
    x = torch.randn(3)
    for n in [2, 3, 4, 5]:
        got, want = compiled(x, n), fn(x, n)
        torch.testing.assert_close(got[0], want[0])
        assert got[1:] == want[1:] and type(got[1]) is int


def test_kilns_backend_compiles_a_symbolic_int_once_forward_and_backward():
    compiled = kiln.compile(lambda x, n: (x * n).sin().sum())
    x = torch.randn(4, 3, requires_grad=True)
    for n in [2, 3, 4, 7]:
        (got,) = torch.autograd.grad(compiled(x, n), x)
        (want,) = torch.autograd.grad((x * n).sin().sum(), x)
        torch.testing.assert_close(got, want)
    with torch.no_grad():
        for n in [5, 6]:
            torch.testing.assert_close(compiled(x, n), (x * n).sin().sum())
    assert len(compiled.kiln_cache.entries) == 3  # n == 2; every n; every n without grad


def test_kilns_backend_with_a_symbolic_int_in_a_size():
    compiled = kiln.compile(lambda x, n: x.reshape(n, -1).sum(0))
    x = torch.randn(12)
    for n in [2, 3, 4, 6, 12]:
        torch.testing.assert_close(compiled(x, n), x.reshape(n, -1).sum(0))


def test_dynamic_sources_name_inputs_symbolic_from_the_first_call():
    backend = Counting()

    def fn(x, n, w):
        return (x * n).sum(0) + w

    with kiln.config.patch({"capture.dynamic_sources": ("L['n']", "L\\['x.*'\\]:0")}):
        compiled = kiln.compile(fn, backend=backend, dynamic=False)  # (the names win over dynamic=False)
        w = torch.randn(5)
        for rows, n in [(2, 3), (3, 4), (7, 0)]:
            x = torch.randn(rows, 5)
            torch.testing.assert_close(compiled(x, n, w), fn(x, n, w))
        x, w = torch.randn(2, 6), torch.randn(6)  # dimension 1 of x and w's are not named: static
        torch.testing.assert_close(compiled(x, 1, w), fn(x, 1, w))
    graph = backend.graphs[0]
    x_meta, n_meta, w_meta = [n.meta["example_value"] for n in graph.graph.nodes if n.op == "placeholder"][:3]
    assert isinstance(n_meta, torch.SymInt) and isinstance(x_meta.shape[0], torch.SymInt)
    assert isinstance(x_meta.shape[1], int) and all(isinstance(s, int) for s in w_meta.shape)
    assert len(backend.graphs) == 2  # the three calls, then the new width



def test_where_python_uses_a_symbolic_int_as_a_number_it_is_specialized():
    backend = Counting()

    def fn(a, x):
        sizes = [1, 2, 3]
        sizes[a] = 5  # an index
        return torch.ones(sizes).sum() * a.bit_length() + x[a:].sum() + [7, 8, 9][a:][0]  # a method, a slice

    compiled = kiln.compile(fn, backend=backend, dynamic=True, fullgraph=True)
    x = torch.randn(3)
    for a in [0, 1, 2, 1]:
        torch.testing.assert_close(compiled(a, x), fn(a, x))
    assert len(backend.graphs) == 3


def test_a_symbolic_int_with_a_numpy_integer():
    np = pytest.importorskip("numpy")
    compiled = kiln.compile(lambda x, a, b: x + (a % b), backend=Counting(), dynamic=True, fullgraph=True)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x, 4097, np.int64(8)), x + 1)


def test_math_floor_ceil_trunc_of_symbolic_numbers_stay_symbolic():
    import math

    backend = Counting()

    def fn(x, n):
        return x.sum() * math.floor(n / 2) + math.ceil((x.size(0) | 3) * 1.5) + math.trunc(n)

    compiled = kiln.compile(fn, backend=backend, dynamic=True, fullgraph=True)
    for size, n in [(2, 5), (3, 7), (5, 8)]:
        x = torch.randn(size)
        torch.testing.assert_close(compiled(x, n), fn(x, n))
    assert len(backend.graphs) == 1
