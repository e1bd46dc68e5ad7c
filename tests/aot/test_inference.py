"""The AOT layer's inference path: functional ATen graphs with eager's mutation and aliasing."""

import pytest
import torch
from torch import fx, nn

import kiln
from kiln import aot
from kiln.backend import kiln_aot_eager, run_as_is
from kiln.runtime import fallback

aten = torch.ops.aten


def _capture(graphs):
    def compile_graph(gm, example_inputs):
        graphs.append(gm)
        return gm

    return compile_graph


def _ops(gm):
    return {n.target for n in gm.graph.nodes if n.op == "call_function"}


def test_graph_is_functional_core_aten():
    def f(x, y):
        z = torch.nn.functional.gelu(x @ y)
        z.add_(1)
        return z.softmax(-1)

    graphs = []
    gm = fx.symbolic_trace(f)
    x, y = torch.randn(4, 8), torch.randn(8, 3)
    compiled = aot.compile(gm, [x, y], _capture(graphs))
    torch.testing.assert_close(compiled(x, y), f(x, y))
    (graph,) = graphs
    for op in _ops(graph):
        assert isinstance(op, torch._ops.OpOverload) and not op._schema.is_mutable, op
    assert aten.mm.default in _ops(graph)
    assert all(n.meta.get("val") is not None for n in graph.graph.nodes if n.op != "output")


def test_input_mutation_is_copied_back():
    def f(x, y):
        x.mul_(2)
        y.clamp_(max=0.5)
        return x + y

    x, y = torch.randn(3), torch.randn(3)
    ex, ey = x.clone(), y.clone()
    out = aot.compile(fx.symbolic_trace(f), [x.clone(), y.clone()], run_as_is)(x, y)
    expected = f(ex, ey)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x, ex)
    torch.testing.assert_close(y, ey)


def test_batch_norm_running_statistics_update_in_training_mode():
    bn = nn.BatchNorm1d(4).train()
    twin = nn.BatchNorm1d(4).train()
    x = torch.randn(8, 4)
    gm = fx.symbolic_trace(nn.Sequential(bn))  # BatchNorm stays one call_module node
    with torch.no_grad():
        out = aot.compile(gm, [x], run_as_is)(x)
        expected = twin(x)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(bn.running_mean, twin.running_mean)
    torch.testing.assert_close(bn.running_var, twin.running_var)
    assert bn.num_batches_tracked.item() == 1


def test_outputs_alias_inputs_and_each_other_as_in_eager():
    def f(x):
        y = x * 2
        return x.view(-1), x.t(), y, y[1:], x

    x = torch.randn(3, 4)
    a, b, y, y_tail, same = aot.compile(fx.symbolic_trace(f), [x], run_as_is)(x)
    assert same is x
    assert a._base is x or a.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert b.stride() == (1, 4) and b.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert y_tail.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    y_tail.zero_()
    assert (y[1:] == 0).all()  # a view of y, not a copy


def test_aliasing_survives_a_backend_that_copies_outputs():
    # A real backend may return fresh tensors; the runtime must hand back views anyway.
    def copying(gm, example_inputs):
        return lambda *args: tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in gm(*args))

    def f(x):
        x.add_(1)
        return x.view(-1), x[0]

    x = torch.zeros(2, 3)
    flat, row = aot.compile(fx.symbolic_trace(f), [x.clone()], copying)(x)
    assert (x == 1).all()
    x.fill_(7)
    assert (flat == 7).all() and (row == 7).all()


def test_torch_compile_backend_is_registered_and_correct():
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4)).eval()
    x = torch.randn(5, 8)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="kiln_aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


def test_unsupported_graph_falls_back_and_is_recorded():
    def f(x):
        x.t_()  # changes the input's strides in place: not handled by the AOT layer
        return x + 1

    x = torch.randn(2, 3)
    expected = f(x.clone())
    # Dynamo keeps t_ out of its graphs, so the backend is handed such a graph directly.
    out = kiln_aot_eager(fx.symbolic_trace(f), [x.clone()])(x)
    torch.testing.assert_close(out, expected)
    assert len(fallback.FALLBACKS) == 1 and "in place" in fallback.FALLBACKS[0].reason
    fallback.reset()


def test_dumps_the_aten_graph(tmp_path):
    with kiln.config.patch({"debug.dump_dir": str(tmp_path)}):
        aot.compile(fx.symbolic_trace(lambda x: x.sin() + 1), [torch.randn(3)], run_as_is,
                    options=aot.AotOptions(label="sine"))
    (folder,) = tmp_path.glob("run_*/000_sine")
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["00_aot_signature.txt", "01_aten_inference.py"]
    assert "torch.ops.aten.sin.default" in (folder / "01_aten_inference.py").read_text()


@pytest.mark.parametrize("bad", [dict(gm=lambda x: x), dict(compile_graph=3), dict(options={"recompute": False})])
def test_bad_arguments_are_named(bad):
    args = dict(gm=fx.symbolic_trace(lambda x: x + 1), example_inputs=[torch.ones(1)], compile_graph=run_as_is)
    options = bad.pop("options", None)
    args.update(bad)
    with pytest.raises(TypeError, match=next(iter(bad), "options")):
        aot.compile(**args, options=options)


def test_symbolic_sizes_pass_through():
    graphs = []

    def backend(gm, example_inputs):
        return aot.compile(gm, example_inputs, _capture(graphs))

    def f(x):
        return torch.nn.functional.softmax(x * 2, dim=-1).sum(0)

    torch._dynamo.reset()
    compiled = torch.compile(f, backend=backend, dynamic=True)
    for n in (3, 5, 9):
        x = torch.randn(n, n + 1)
        torch.testing.assert_close(compiled(x), f(x))
    assert len(graphs) == 1  # one graph serves every size
    sizes = [n.meta["val"].shape for n in graphs[0].graph.nodes if n.op == "placeholder" and isinstance(n.meta["val"], torch.Tensor)]
    assert any(not isinstance(s, int) for shape in sizes for s in shape)


def test_entry_point_names_the_backend():
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="torch_dynamo_backends") if e.name == "kiln_aot_eager"]
    assert ep.load() is kiln_aot_eager


def test_linalg_error_checks_stay_in_the_graph_and_raise():
    # inv's error check is an effectful op: kept in order by a token, never dead-code eliminated.
    fallback.reset()
    fn = torch.compile(lambda a: torch.linalg.inv(a) * 2, backend="kiln")
    a = torch.randn(3, 4, 4)
    torch.testing.assert_close(fn(a), torch.linalg.inv(a) * 2)
    with pytest.raises(torch.linalg.LinAlgError):
        fn(torch.zeros(3, 4, 4))
    assert not fallback.FALLBACKS


def test_values_read_from_inputs_specialize_the_graph():
    fallback.reset()
    fn = lambda x, start, i: (torch.narrow(x, 1, start, 2) * 2, torch.take(x, i))  # noqa: E731
    compiled = torch.compile(fn, backend="kiln")
    x = torch.randn(5, 5, 5)
    for start, i in [(2, 7), (-3, -1), (2, 0)]:
        got, want = compiled(x, torch.tensor(start), torch.tensor(i)), fn(x, torch.tensor(start), torch.tensor(i))
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert not fallback.FALLBACKS


def test_outputs_viewing_an_intermediate_that_is_not_returned_stay_separate():
    # Found by the graph fuzzer: y[:1] became the base of y.expand(...), read past its own buffer
    # (an error, or wrong values where it stayed in bounds). Only an output holding y's whole
    # storage can be another output's base.
    def f(x):
        y = x.clamp(-0.5, 0.75)
        return y.chunk(2, 0)[0], y.expand(2, 2, 2), y[1:]

    x = torch.randn(2, 2)
    for backend in (run_as_is, kiln.backend.kiln):
        outs = aot.compile(fx.symbolic_trace(f), [x], backend)(x)
        for got, want in zip(outs, f(x)):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


COPIES = {"clone": lambda x: x.clone(), "clone then add_": lambda x: x.clone().add_(1),
          "transposed clone": lambda x: x.t().clone(), "contiguous copy": lambda x: x.t().contiguous()}
VIEWS = {"itself": lambda x: x, "transpose": lambda x: x.t(), "row": lambda x: x[1]}


@pytest.mark.parametrize("door", ["kiln.compile", "torch.compile"])
@pytest.mark.parametrize("dynamic", [None, True])
def test_copies_of_an_input_are_fresh_and_views_of_it_stay_views(door, dynamic):
    # clone lowers to its operand; a graph output that is an input's elements is still a new tensor.
    for name, fn in {**COPIES, **VIEWS}.items():
        kiln.reset()
        compiled = kiln.compile(fn, dynamic=dynamic) if door == "kiln.compile" else \
            torch.compile(fn, backend="kiln", dynamic=dynamic)
        x = torch.randn(5, 5)
        out, want = compiled(x), fn(x.clone())
        torch.testing.assert_close(out, want)
        shares = out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert shares == (name in VIEWS), name


RETYPED_VIEWS = {
    "bytes as float32, at an offset": (lambda b: b[4:20].view(torch.float32), lambda: torch.arange(64, dtype=torch.uint8)),
    "float32 as bytes": (lambda x: x[1:].view(torch.uint8), lambda: torch.randn(5)),
    "float32 as int32, transposed": (lambda x: x.t().view(torch.int32), lambda: torch.randn(4, 6)),
    "view_as_real": (lambda z: torch.view_as_real(z[1:]), lambda: torch.randn(4, dtype=torch.complex64)),
}


@pytest.mark.parametrize("door", ["kiln.compile", "torch.compile"])
@pytest.mark.parametrize("dynamic", [None, True])
def test_views_that_reinterpret_an_inputs_dtype_keep_their_dtype(door, dynamic):
    # An output's layout counts elements of its own dtype: made again from a base of another dtype
    # it must be that dtype's view (HF's static KV cache placed in a byte buffer came back as bytes).
    for name, (fn, make) in RETYPED_VIEWS.items():
        kiln.reset()
        compiled = kiln.compile(fn, dynamic=dynamic) if door == "kiln.compile" else \
            torch.compile(fn, backend="kiln", dynamic=dynamic)
        x = make()
        out, want = compiled(x), fn(x.clone())
        assert out.dtype == want.dtype and out.shape == want.shape and out.stride() == want.stride(), name
        assert torch.equal(out, want), name
        assert out.data_ptr() == fn(x).data_ptr(), name  # the input's memory, at the same place
        out.zero_()
        assert not fn(x).any(), name  # written through the view


def test_a_retyped_view_of_a_buffer_assigned_to_an_attribute_stays_a_view_of_the_buffer():
    buffer = torch.zeros(256, dtype=torch.uint8)

    class Layer:
        keys = None

    layer = Layer()

    def place(x):
        layer.keys = buffer[64:96].view(torch.float32).view(2, 4)
        layer.keys.copy_(x)
        return x + 1

    kiln.compile(place)(torch.arange(8.0).view(2, 4))
    assert layer.keys.dtype == torch.float32 and layer.keys.data_ptr() == buffer.data_ptr() + 64
    assert torch.equal(layer.keys, torch.arange(8.0).view(2, 4))
    layer.keys.fill_(1.0)
    assert torch.equal(buffer[64:96].view(torch.float32), torch.ones(8))
