"""NumPy arrays inside compiled functions: traced as the tensors of their data, NumPy's functions
and operators run as torch._numpy runs them, arrays handed back as ndarrays."""

import warnings

import numpy as np
import pytest
import torch

import kiln
from tests.capture.util import check


def compiled(fn, backend="eager", fullgraph=True):
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return kiln.compile(fn, backend=counting if backend == "eager" else backend, fullgraph=fullgraph), graphs


def assert_array(actual, expected):
    assert type(actual) is np.ndarray, type(actual)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=1e-6)


def sine_scaled(x):
    return np.sin(x) * 2 + x.size


@pytest.mark.parametrize("backend", ["eager", "kiln"])
def test_a_function_of_arrays_compiles_to_one_graph_and_returns_an_ndarray(backend):
    fn, graphs = compiled(sine_scaled, backend)
    x = np.arange(6.0).reshape(2, 3)
    assert_array(fn(x), sine_scaled(x))
    assert_array(fn(x + 1), sine_scaled(x + 1))  # same dtype and shape: no new graph
    assert len(fn.kiln_cache.entries) == 1 and len(graphs) == (1 if backend == "eager" else 0)


def test_numpy_type_promotion_and_dtypes_are_numpys():
    def fn(x):
        return (x * 5).astype(bool).astype(float).astype(int) + 8, np.arange(5, dtype=np.float32), x // 2

    c, _ = compiled(fn)
    x = np.random.default_rng(0).random(5)
    for actual, expected in zip(c(x), fn(x)):
        assert_array(actual, expected)
    ints = np.arange(5)  # another dtype: another graph
    for actual, expected in zip(c(ints), fn(ints)):
        assert_array(actual, expected)
    assert len(c.kiln_cache.entries) == 2


def test_tensor_numpy_shares_the_tensors_memory():
    def fn(t):
        a = t.numpy()
        a += 1
        return a

    c, _ = compiled(fn)
    t = torch.zeros(3)
    result = c(t)
    assert_array(result, np.ones(3, dtype=np.float32))
    assert torch.equal(t, torch.ones(3))  # written through the array, as in eager


def test_tensor_numpy_of_a_tensor_that_requires_grad_raises_as_in_eager_unless_forced():
    def plain(t):
        return t.numpy()

    def forced(t):
        return t.numpy(force=True) * 2

    t = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="requires grad"):
        compiled(plain)[0](t)
    c, _ = compiled(forced)
    assert_array(c(t), t.detach().numpy() * 2)


def test_constant_arguments_fold_unless_the_result_is_an_array():
    def fn(x, n):
        return np.issubdtype(type(n), np.integer) + x, np.zeros((2, n))

    c, graphs = compiled(fn)
    x = torch.randn(4)
    flag, zeros = c(x, 3)
    torch.testing.assert_close(flag, x + 1)
    assert_array(zeros, np.zeros((2, 3)))
    assert "issubdtype" not in graphs[0].code and "numpy_zeros" in graphs[0].code


def test_iterating_an_array_gives_arrays():
    def fn(x):
        return [row for row in x]

    c, _ = compiled(fn)
    rows = c(np.arange(3)[:, None])
    assert len(rows) == 3
    for i, row in enumerate(rows):
        assert_array(row, np.array([i]))


def test_an_array_of_arrays_is_their_stack():
    def fn(x, y):
        return np.array([x, y]), np.asarray((x, y), dtype=np.float32)

    c, _ = compiled(fn)
    x, y = np.arange(2), np.arange(2) + 2
    stacked, converted = c(x, y)
    assert_array(stacked, np.array([[0, 1], [2, 3]]))
    assert_array(converted, np.array([[0, 1], [2, 3]], dtype=np.float32))


def test_tensors_made_from_arrays():
    def fn(x, t):
        shared = torch.from_numpy(x)
        copied = torch.tensor(x, dtype=torch.float32)
        shared.mul_(2)  # (writes x: from_numpy shares its memory)
        return copied + t, x * t

    c, _ = compiled(fn)
    x, t = np.arange(3.0), torch.ones(3)
    ref_x = x.copy()
    copied, mixed = c(x, t)
    torch.testing.assert_close(copied, torch.from_numpy(ref_x).float() + 1)
    assert isinstance(mixed, torch.Tensor)  # a tensor's operator wins over an array's
    np.testing.assert_allclose(x, ref_x * 2)


def test_arrays_are_guarded_by_type_dtype_and_shape():
    def fn(x):
        return x + 1

    c, _ = compiled(fn, fullgraph=False)
    c(np.zeros(3))
    c(np.zeros(3))
    c(np.zeros(4))  # another shape
    c(np.zeros(3, dtype=np.int32))  # another dtype
    with pytest.raises(TypeError):
        c([1])  # list + 1: Python's error, raised by the user's code as in eager
    assert len(c.kiln_cache.entries) >= 3


def test_reading_an_arrays_data_in_python_breaks_the_graph():
    def fn(x):
        y = x * 2
        values = y.tolist()
        return np.asarray(values) + 1

    c, _ = compiled(fn, fullgraph=False)
    x = np.arange(3.0)
    assert_array(c(x), fn(x))
    # One graph: tolist() is kept in it (numbers read when it runs), but NumPy cannot make an
    # array of numbers it does not know.
    with pytest.raises(kiln.CaptureError, match="asarray"):
        compiled(fn)[0](x)


@pytest.mark.parametrize("marker", ["kiln", "dynamo"])
def test_graph_break_splits_the_graph_and_is_an_error_under_fullgraph(marker):
    graph_break = kiln.graph_break if marker == "kiln" else __import__("torch._dynamo", fromlist=["graph_break"]).graph_break

    def fn(x):
        y = x.sin()
        graph_break()
        return y.cos()

    c, graphs = compiled(fn, fullgraph=False)
    x = torch.randn(4)
    torch.testing.assert_close(c(x), fn(x))
    assert len(graphs) == 2
    with pytest.raises(kiln.CaptureError, match=r"test_numpy_arrays.py:\d+ in fn: .*graph_break\(\) asks for a graph break"):
        compiled(fn)[0](x)


def test_an_array_alive_at_a_break_crosses_it_as_an_ndarray():
    def fn(t):
        a = t.numpy().real
        kiln.graph_break()
        return np.multiply(a, 2.0)

    c, graphs = compiled(fn, fullgraph=False)
    t = torch.randn(3)
    assert_array(c(t), fn(t))
    assert len(graphs) == 2


def test_numpys_random_stream_stays_numpys():
    def fn(x):
        return x + np.random.rand(3)

    c, _ = compiled(fn, fullgraph=False)
    np.random.seed(0)
    actual = c(np.zeros(3))
    np.random.seed(0)
    assert_array(actual, fn(np.zeros(3)))  # the same draws: np.random ran as NumPy
    with pytest.raises(kiln.CaptureError, match=r"numpy_arrays.py:\d+ in fn: calling"):
        compiled(fn)[0](np.zeros(3))


def test_a_read_only_array_is_read_without_a_warning():
    def fn(x):
        return x * 2

    c, _ = compiled(fn)
    x = np.broadcast_to(np.arange(3.0), (2, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert_array(c(x), x * 2)


def test_numpy_dtypes_and_limits_built_from_constants_are_constants():
    def f(x):
        dt = np.dtype("float")
        return torch.as_tensor(np.full_like(x.numpy(), 2.4, dtype=dt)), x + np.iinfo(np.int16).max + np.finfo(np.float32).eps

    check(f, torch.randn(3))
