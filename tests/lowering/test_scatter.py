"""Scatters as kiln code: index_put (and what decomposes to it), scatter, scatter_add,
scatter_reduce, index_reduce and put, with duplicate and negative indices, against eager."""

import re

import pytest
import torch
import torch.nn.functional as F

from tests.aot.opinfo import CountingBackend
from tests.kiln_backend import compiled, private_cache  # noqa: F401  (private_cache: a fixture)
from tests.lowering.support import check, extern_ops, through, through_all

aten = torch.ops.aten
SCATTERS = [aten.index_put.default, aten.scatter.src, aten.scatter.value, aten.scatter.reduce, aten.scatter_add.default,
            aten.scatter_reduce.two, aten.index_reduce.default, aten.put.default]


def test_index_put_family_with_duplicate_negative_and_broadcast_indices():
    x, v = torch.randn(6, 4), torch.randn(5, 4)
    dup = torch.tensor([1, -1, 1, 0, 5])  # 1 twice, -1 is row 5: 5 twice
    rows = torch.tensor([0, 2, -3])
    fn = lambda x, v, dup, rows, xi: (  # noqa: E731
        torch.index_put(x, (rows,), v[:3]),  # overwrite, negative index
        torch.index_put(x, (dup,), v, accumulate=True),  # every duplicate sums
        aten.index_put(x.t(), [None, dup], v[:1, 0], True),  # non-contiguous base, broadcast values
        aten.index_put(x, [rows, rows.flip(0)], torch.tensor(2.0)),  # two index tensors, one value
        x.index_add(0, dup.abs(), v, alpha=2), x.index_copy(0, rows.abs(), v[:3]), x.index_fill(1, rows, -1.5),
        torch.index_put(xi, (dup,), xi[:5] * 3, accumulate=True),  # int64
    )
    check(fn, x, v, dup, rows, torch.randint(-9, 9, (6, 4)), lowered=SCATTERS)


def test_scatter_family_with_duplicates_and_every_reduction():
    x, src = torch.randn(5, 4), torch.randn(3, 4)
    index = torch.tensor([[0, 4, 4, 1], [4, 4, 0, 1], [2, 4, 0, 1]])  # many duplicates per column
    reductions = [(r, s) for r in ("sum", "prod", "mean", "amax", "amin") for s in (True, False)]
    fn = lambda x, index, src, xi: (  # noqa: E731
        x.scatter(1, index[:2, :2] % 4, src[:2, :2]), x.scatter(0, index, 2.5),
        x.scatter(0, index, src, reduce="multiply"), x.t().scatter_add(1, index.t(), src.t()),
        *[x.scatter_reduce(0, index, src, r, include_self=s) for r, s in reductions],
        *[xi.scatter_reduce(0, index, xi[:3] * 7, r, include_self=s) for r in ("mean", "amax") for s in (True, False)],
    )
    check(fn, x, index, src, torch.randint(-9, 9, (5, 4)), lowered=SCATTERS, atol=1e-4, rtol=1e-4)


def test_index_reduce_and_put():
    x, src = torch.randn(5, 3), torch.randn(4, 3)
    rows = torch.tensor([3, 0, 3, 3])
    fn = lambda x, rows, src, flat: (  # noqa: E731
        *[x.index_reduce(0, rows, src, r, include_self=s) for r in ("prod", "mean", "amax", "amin")
          for s in (True, False)],
        x.put(flat[0], src[0]), x.put(flat, src[:2], accumulate=True),  # negative flat indices count from the end
    )
    check(fn, x, rows, src, torch.tensor([[1, -1, 7], [7, 7, -15]]), lowered=SCATTERS, atol=1e-4, rtol=1e-4)


def test_zero_dim_self_is_one_element_and_empty_indices_scatter_nothing():
    fn = lambda x, i, s, v, empty: (  # noqa: E731
        x.scatter_add(0, i, s), x.scatter(0, i[:1], 2.0), torch.gather(x, 0, i),
        torch.index_select(x, 0, i[:1]), x.index_reduce(0, i[:1], x * 3, "prod"),
        torch.gather(v, 0, empty), v.scatter_add(0, empty, v[:0]),
    )
    check(fn, torch.tensor(1.5), torch.tensor([0, 0]), torch.tensor([1.0, 2.0]), torch.randn(5),
          torch.zeros(0, dtype=torch.uint8), lowered=SCATTERS + [aten.gather.default, aten.index_select.default])


def test_boolean_mask_with_one_value_is_pointwise():
    x = torch.randn(4, 5)
    rows = torch.tensor([True, False, True, False])
    fn = lambda x, m, rows, row: (  # noqa: E731
        aten.index_put(x, [m], torch.tensor(0.0)), aten.index_put(x, [None, m[0]], torch.tensor(1.0), True),
        aten.index_put(x, [rows], row),  # one row for every selected row
    )
    programs = check(fn, x, x > 0, rows, torch.randn(5), lowered=SCATTERS)
    assert not programs["cpp"].externs
    # Values for each selected element: which one goes where depends on the data, an ATen call.
    out, program = through("cpp", lambda x, m, v: aten.index_put(x, [m], v), x, rows, torch.randn(2, 5))
    assert extern_ops(program) == {aten.index_put.default}


@pytest.mark.parametrize("fn", [
    lambda x, i: x.scatter(0, i.view(-1, 1).expand(-1, 3), 1.0),
    lambda x, i: x.scatter_add(0, i.view(-1, 1).expand(-1, 3), torch.ones(3, 3)),
    lambda x, i: x.index_reduce(0, i, torch.ones(3, 3), "amax"),
    lambda x, i: torch.index_put(x, (i * 2,), torch.ones(3)),
], ids=["scatter", "scatter_add", "index_reduce", "index_put"])
def test_out_of_range_indices_raise_index_error(fn):
    x, i = torch.randn(5, 3), torch.tensor([0, -1, 4])  # -1: out of range for scatter-style ops; 8 for index_put
    with pytest.raises((IndexError, RuntimeError)):
        fn(x, i)
    with pytest.raises(IndexError):
        through("cpp", fn, x, i)


def _scatter_loops(source: str) -> str:
    """The C++ after the initial copy: the scatter's own loops (`r` variables)."""
    return source[source.index("for (int64_t r0"):] if "for (int64_t r0" in source else ""


def test_accumulating_scatters_parallelize_only_disjoint_loops():
    # An embedding's backward: 4096 rows of 64 into 1000 rows, many duplicates. Threads split the
    # columns (disjoint writes), never the rows (duplicates would race).
    weight, ids = torch.randn(1000, 64, requires_grad=True), torch.randint(0, 50, (4096,))
    out, programs = through_all("cpp", lambda w, i: F.embedding(i, w), weight, ids)
    grad = torch.randn(4096, 64)
    out.backward(grad)
    expected = torch.zeros(1000, 64).index_add_(0, ids, grad)
    torch.testing.assert_close(weight.grad, expected, atol=1e-4, rtol=1e-4)
    backward = programs[-1]
    # One kernel: the zero fill, the padding mask and the scatter of the rows, all in the scatter's loops.
    assert len(backward.kernels) == 1 and not backward.externs

    x, flat = torch.zeros(64, 64), torch.randint(-100, 100, (200, 200))  # put: no disjoint loop at all
    (result, program) = compiled(lambda x, i: x.put(i, torch.ones(200, 200), accumulate=True), x, flat)
    torch.testing.assert_close(result, x.put(flat, torch.ones(200, 200), accumulate=True))
    put_loops = _scatter_loops(program.source)
    assert put_loops and "omp" not in put_loops, put_loops

    x, index = torch.zeros(10, 300), torch.randint(0, 10, (200, 300))
    result, program = compiled(lambda x, i, s: x.scatter_add(0, i, s), x, index, torch.ones(200, 300))
    torch.testing.assert_close(result, x.scatter_add(0, index, torch.ones(200, 300)))
    loops = _scatter_loops(program.source)
    # Rows (r0) run in every thread; the columns (r1) are shared out by an `omp for`.
    shared_columns = r"#pragma omp parallel num_threads\(kiln::team\(\)\)\s*\{\s*for \(int64_t r0.*?#pragma omp for schedule\(static\) nowait\s*for \(int64_t r1"
    assert re.search(shared_columns, program.source, re.S), loops


def test_writes_of_one_run_of_memory_are_vectorized_with_their_tail_and_threads():
    # A KV cache written at one position (rows of 67: vector blocks and a scalar tail), rows
    # accumulated with duplicates in float32 and bfloat16 (each lane its own element, combined in
    # the scalar loops' order), index_reduce's every reduction, booleans and float16 rows; and an embedding's gradient large
    # enough that its threads share out the vector blocks of the columns.
    cache, k, pos = torch.zeros(1, 2, 37, 67), torch.randn(1, 2, 1, 67), torch.tensor([5])
    x, rows, src = torch.randn(6, 67), torch.tensor([1, -1, 1, 0, 5]), torch.randn(5, 67)
    fn = lambda cache, k, pos, x, rows, src: (  # noqa: E731
        cache.index_copy(2, pos, k * 2),
        torch.index_put(x, (rows,), src, accumulate=True),
        torch.index_put(x.bfloat16(), (rows,), src.bfloat16(), accumulate=True),
        *[x.index_reduce(0, rows.abs(), src, r, include_self=False) for r in ("prod", "amax", "amin")],
        torch.index_put(x > 0, (rows[2:],), src[:3] > 0), x.half().index_copy(0, rows[2:], src[:3].half() * 3),
    )
    inputs = (cache, k, pos, x, rows, src)
    result, program = compiled(fn, *inputs)
    torch.testing.assert_close(result, fn(*inputs), atol=1e-4, rtol=1e-4)
    blocks = re.findall(r"for \(int64_t (r\d)_block = 0; \1_block < 67L; \1_block \+= kiln::L\)", program.source)
    assert len(blocks) >= 8, program.source
    assert all(f"kiln::{op}(" in program.source for op in ("store_bf16", "store_fp16", "vmax", "vmin")), program.source

    gradient, ids = torch.randn(4096, 67), torch.randint(0, 50, (4096,))
    rows_added = lambda g, i: torch.index_put(torch.zeros(1000, 67), (i,), g, accumulate=True)  # noqa: E731
    result, program = compiled(rows_added, gradient, ids)
    torch.testing.assert_close(result, torch.zeros(1000, 67).index_add_(0, ids, gradient), atol=1e-4, rtol=1e-4)
    shared_blocks = r"#pragma omp for schedule\(static\) nowait\s*for \(int64_t r1_block = 0;.*?kiln::store\("
    assert re.search(shared_blocks, program.source, re.S), program.source

    # Lanes whose targets come from a per-lane index (scatter's index tensor) stay scalar writes.
    index = torch.tensor([[0, 4, 4, 1], [4, 4, 0, 1]])
    _, program = compiled(lambda x, i, s: x.scatter_add(0, i, s), torch.randn(5, 4), index, torch.randn(2, 4))
    assert "for (int64_t r0" in program.source and "_block" not in _scatter_loops(program.source)


def test_data_dependent_sizes_run_without_endless_specialization():
    # index_fill's autograd saves unique(index) (a data-dependent size) for its backward; a mask's
    # gradient selects masked rows. Such graphs used to re-trace themselves forever; now ops over
    # data-dependent sizes are ATen calls and the rest of the graph is kiln's.
    x, value = torch.randn(4, 3), torch.tensor(2.0, requires_grad=True)
    backend = CountingBackend("kiln")
    out = torch.compile(lambda x, i, v: x.index_fill(0, i, v), backend=backend)(x, torch.tensor([1, 1, 3]), value)
    out.sum().backward()
    torch.testing.assert_close(out, x.index_fill(0, torch.tensor([1, 3]), 2.0))
    assert value.grad.item() == 6.0  # two filled rows of three, duplicates counted once
    assert len(backend.programs) == 2 and not any(aten.index_put.default in extern_ops(p) for p in backend.programs)

    v = torch.randn(3, requires_grad=True)
    backend = CountingBackend("kiln")
    compiled_fn = torch.compile(lambda x, m, v: aten.index_put(x, [m], v), backend=backend)
    mask = torch.tensor([True, False, True, True])
    compiled_fn(x, mask, v).sum().backward()
    torch.testing.assert_close(v.grad, torch.full((3,), 3.0))
    # The gradient's masked rows (a data-dependent count) and their sum are ATen calls; the rest is kiln's.
    forward, backward = backend.programs
    assert forward.kernels and not forward.externs
    assert {str(op) for op in extern_ops(backward)} <= {"aten.index.Tensor", "aten.sum.dim_IntList"}

    out, program = through("cpp", lambda x, m: (x[m] * 2, x.exp() + 1), x, mask)
    torch.testing.assert_close(out, (x[mask] * 2, x.exp() + 1))
    assert program.kernels and aten.index.Tensor in extern_ops(program)


def test_put_backward_with_a_zero_dim_index():
    # put's gradient takes (`take`) at the index; a 0-d index used to stop the trace on its value.
    x, v = torch.randn(2, 3, requires_grad=True), torch.tensor(4.0, requires_grad=True)
    out, programs = through_all("cpp", lambda x, i, v: x.put(i, v), x, torch.tensor(-2), v)
    out.backward(torch.arange(6.0).view(2, 3))
    assert v.grad.item() == 4.0 and x.grad.view(-1)[4] == 0
    assert not any(extern_ops(p) & set(SCATTERS) for p in programs)
