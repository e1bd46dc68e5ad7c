"""The memory plan: kernels' buffers reuse dead ones of the same layout, write over inputs that
die at them, and every intermediate, an extern's result included, is dropped right after its
last reader, as eager drops it."""

import pytest
import sympy
import torch

import kiln
from kiln.backend.driver import watch
from tests.kiln_backend import compiled, private_cache  # noqa: F401  (fixture)


def mlp(x, w1, w2, w3):
    h = torch.relu(torch.mm(x, w1))  # mm's result dies in the relu kernel
    g = torch.relu(torch.mm(h, w2))
    return torch.mm(g, w3)


def sliced_chain(x, y):
    a = torch.relu(x) * 2
    b = torch.mm(a, y)  # a dies here
    c = torch.sigmoid(b[:, :16])  # b is laid out otherwise: c cannot overwrite it, takes a's memory
    return torch.mm(c, y)


def _line(lines, text):
    return next(k for k, line in enumerate(lines) if text in line)


def test_extern_results_are_dropped_after_their_last_reader():
    torch.manual_seed(0)
    inputs = [torch.randn(32, 16), torch.randn(16, 32)]
    out, program = compiled(sliced_chain, *inputs)
    torch.testing.assert_close(out, sliced_chain(*inputs))
    lines = program.python.splitlines()
    b = lines[_line(lines, "= op")].split("=")[0].strip()
    made, read = _line(lines, f"{b} = op"), _line(lines, f"{b}.data_ptr()")
    freed = [k for k, line in enumerate(lines) if line.strip().startswith("del ") and b in line.replace(",", " ").split()]
    assert freed and made < read < freed[0], program.python


def test_same_layout_buffers_are_reused_not_reallocated():
    torch.manual_seed(0)
    inputs = [torch.randn(32, 16), torch.randn(16, 32)]
    _, program = compiled(sliced_chain, *inputs)
    assert len(program.schedule.memory.reuses) == 1 and not program.schedule.memory.inplace
    assert program.python.count("empty_strided(") == 1, program.python
    (new, dead), = program.schedule.memory.reuses.items()
    assert f"{new} = {dead}; del {dead}" in program.python  # the dead name does not hold the memory


def test_pointwise_kernel_writes_over_a_dying_extern_result():
    torch.manual_seed(0)
    inputs = [torch.randn(16, 32), torch.randn(32, 32), torch.randn(32, 32), torch.randn(32, 8)]
    out, program = compiled(mlp, *inputs)
    torch.testing.assert_close(out, mlp(*inputs))
    inplace = program.schedule.memory.inplace
    assert len(inplace) == 2 and "empty_strided(" not in program.python, program.python
    for kernel in program.schedule.kernels:
        (out_name, taken), = kernel.overwrites.items()
        assert inplace[out_name] == taken.name and taken not in kernel.inputs
        assert program.source.count("const float* __restrict__") == 0  # one pointer: read and written


def test_input_read_at_another_element_is_not_overwritten():
    torch.manual_seed(0)
    x, w = torch.randn(8, 8), torch.randn(8, 8)

    def f(x, w):
        y = torch.mm(x, w)
        return torch.relu(y + y.t()) + 1

    out, program = compiled(f, x, w)
    torch.testing.assert_close(out, f(x, w))
    assert not program.schedule.memory.inplace


def test_an_input_another_input_views_is_not_overwritten():
    # y = x + x.t(), the transpose an ATen view of x: writing y over x would change what the
    # view reads. (Scheduled only; nothing is compiled.)
    from kiln.ir.nodes import Buffer, Layout, Pointwise
    from kiln.ir.ops import ops
    from kiln.ir.program import ComputeStep, ExternStep, Program
    from kiln.schedule import schedule

    a = Buffer("a", Layout.contiguous((4, 4), torch.float32))
    x = Buffer("x", Layout.contiguous((4, 4), torch.float32))
    v = Buffer("v", Layout((4, 4), (1, 4), torch.float32))
    y = Buffer("y", Layout.contiguous((4, 4), torch.float32))
    plus_one = Pointwise(torch.float32, (4, 4), lambda i: ops.add(ops.load("a", 4 * i[0] + i[1]),
                                                                  ops.constant(1.0, torch.float32)), name="x")
    total = Pointwise(torch.float32, (4, 4), lambda i: ops.add(ops.load("x", 4 * i[0] + i[1]),
                                                               ops.load("v", i[0] + 4 * i[1])), name="y")
    program = Program([a], [ComputeStep(x, plus_one), ExternStep([v], torch.ops.aten.t.default, (x,), {}),
                            ComputeStep(y, total)], [y])
    assert not schedule(program).memory.inplace


def _cache_write(cache, position, row):
    # A KV cache's update as HF's StaticCache makes it: one row written into a mutated input.
    cache.index_copy_(1, position, row)
    return (cache * 2).sum(-1)


def _cache_write_reading_the_old_values(cache, position, row):
    before = cache * 3  # the old values are read after the write: the cache cannot be written over
    cache.index_copy_(1, position, row)
    return before + cache


@pytest.mark.parametrize("fn,in_place", [(_cache_write, True), (_cache_write_reading_the_old_values, False)])
def test_a_mutated_input_is_written_where_it_lies(fn, in_place):
    """The new value of a mutated input is computed in its own memory when nothing reads the old
    values afterwards: the scatter writes only its row, and the copy back is of the cache onto
    itself (skipped by copy_). Eager's values, call after call, either way."""
    torch.manual_seed(0)
    kiln.reset()
    cache, twin = torch.zeros(2, 64, 8), torch.zeros(2, 64, 8)
    compiled_fn = kiln.compile(fn)
    with torch.no_grad(), watch() as built:
        for step in range(5):
            position, row = torch.tensor([step]), torch.randn(2, 1, 8)
            torch.testing.assert_close(compiled_fn(cache, position, row), fn(twin, position, row))
            torch.testing.assert_close(cache, twin)
    (graph,) = [getattr(b, "runtime", b) for b in built]
    cache_input = graph.stages.program.inputs[0].name
    written_over = set(graph.stages.schedule.memory.inplace.values())
    assert (cache_input in written_over) == in_place, graph.stages.schedule.memory.inplace
    if in_place:
        scatter = next(k for k in graph.stages.schedule.kernels if k.is_scatter)
        assert scatter.scatter_init is None  # only the row is written, not the whole cache again


def _append_to_a_growing_cache(cache, room, row, query):
    # A KV cache with room to grow (kiln/capture/hf_kv_cache.py): `cache` views the first rows of
    # `room`, its length read from its size alone; the new row is written into the room. (The view
    # comes first, as HF's layers are read: it is faked before its base is.)
    length = cache.shape[1]
    room.narrow(1, length, 1).copy_(row)
    cache = room.narrow(1, 0, length + 1)
    return cache, query @ cache.transpose(1, 2)


def test_a_growing_caches_new_row_is_written_where_it_lies_and_read_there():
    """Each call writes one row into the room (a Scatter in the room's own memory), the product
    reads the cache where it lies (a view of symbolic length, not a copy), and the cache handed
    back is a view of the room, made from it rather than computed: no kernel but the row's write.
    One graph for every length, eager's values."""
    torch.manual_seed(0)
    kiln.reset()
    room, twin = torch.zeros(2, 32, 8), torch.zeros(2, 32, 8)
    cache, twin_cache = room.narrow(1, 0, 3), twin.narrow(1, 0, 3)
    compiled_fn = kiln.compile(_append_to_a_growing_cache)
    with torch.no_grad(), watch() as built:
        for _ in range(6):
            row, query = torch.randn(2, 1, 8), torch.randn(2, 1, 8)
            cache, scores = compiled_fn(cache, room, row, query)
            twin_cache, twin_scores = _append_to_a_growing_cache(twin_cache, twin, row, query)
            torch.testing.assert_close(scores, twin_scores)
            torch.testing.assert_close(room, twin)
            assert cache.untyped_storage().data_ptr() == room.untyped_storage().data_ptr()
            assert cache.shape == twin_cache.shape
    assert compiled_fn.kiln_cache.eager_calls == 0 and kiln.capture.BREAKS == []
    graphs = [getattr(b, "runtime", b) for b in built]
    symbolic = graphs[-1]  # (the first lengths' graphs, then one with the length symbolic)
    assert len(graphs) <= 3
    assert any(not sympy.sympify(size).is_Integer for b in symbolic.stages.program.inputs if b for size in b.layout.size)
    program, schedule = symbolic.stages.program, symbolic.stages.schedule
    room_input = program.inputs[1].name
    assert room_input in schedule.memory.inplace.values(), schedule.memory.inplace
    (kernel,) = schedule.kernels
    assert kernel.is_scatter and kernel.scatter_init is None  # the new row alone is written
