"""A table's gradient from two uses (tied embeddings) accumulates both into one buffer: the
second scatter adds its rows in place, with no zero fill, no copy and no add kernel."""

import torch
import torch.nn.functional as F
from torch import fx

from kiln import aot
from kiln.backend import Backend
from kiln.passes.scatter_accumulate import scatter_accumulate
from kiln.backend.driver import target_for
from tests.kiln_backend import private_cache  # noqa: F401  (fixture)

aten = torch.ops.aten


def _train(fn, weight, *inputs):
    """(weight's gradient, the backward CompiledGraph) of `fn(weight, *inputs).sum()` through kiln."""
    programs = []

    def compile_graph(gm, example_inputs):
        programs.append(Backend()(gm, example_inputs))
        return programs[-1]

    w = weight.detach().clone().requires_grad_()
    out = aot.compile(fx.symbolic_trace(fn), [w, *inputs], compile_graph)(w, *inputs)
    (out * torch.arange(out.numel()).view(out.shape).sin()).sum().backward()
    return w.grad, programs[-1]


def _eager_grad(fn, weight, *inputs):
    w = weight.detach().clone().requires_grad_()
    out = fn(w, *inputs)
    (out * torch.arange(out.numel()).view(out.shape).sin()).sum().backward()
    return w.grad


def two_lookups(w, ids1, ids2):
    return F.embedding(ids1, w) + 2 * F.embedding(ids2, w)


def tied_head(w, ids):
    return F.linear(F.embedding(ids, w), w)


def test_two_embedding_gradients_share_one_table():
    torch.manual_seed(0)
    w, ids1, ids2 = torch.randn(500, 16), torch.randint(0, 50, (64,)), torch.randint(0, 500, (64,))
    grad, backward = _train(two_lookups, w, ids1, ids2)
    torch.testing.assert_close(grad, _eager_grad(two_lookups, w, ids1, ids2))
    tables = [k for k in backward.schedule.kernels if k.is_scatter]
    assert len(tables) == 2, backward.artifact.report
    first, second = tables
    assert not first.overwrites and set(second.overwrites) == {second.outputs[0].name}
    # The second scatter has no loop of its own over the table: only its source loops.
    second_source = backward.source[backward.source.index(backward.functions[second.name] + "("):]
    assert "for (int64_t i0" not in second_source.split("\n}\n")[0], second_source
    assert backward.python.count("empty_strided([500, 16]") == 1, backward.python


def test_tied_output_head_accumulates_rows_into_the_matmul_gradient():
    torch.manual_seed(0)
    w, ids = torch.randn(300, 16), torch.randint(0, 300, (40,))
    grad, backward = _train(tied_head, w, ids)
    torch.testing.assert_close(grad, _eager_grad(tied_head, w, ids))
    assert not [k for k in backward.schedule.kernels if not k.is_scatter and k.outputs[0].layout.size == (300, 16)]
    assert "empty_strided([300, 16]" not in backward.python, backward.python


def test_pass_folds_only_a_zero_table_of_the_sum_s_type():
    def graph(zeros_value, other_shape):
        g = fx.Graph()
        ids, values, other = g.placeholder("ids"), g.placeholder("values"), g.placeholder("other")
        table = g.call_function(aten.full.default, ([8, 4], zeros_value), {"dtype": torch.float32})
        scattered = g.call_function(aten.index_put.default, (table, [ids], values, True))
        g.output(g.call_function(aten.add.Tensor, (other, scattered)))
        gm = fx.GraphModule({}, g)
        example = {"ids": torch.tensor([1, 1, 7]), "values": torch.randn(3, 4), "other": torch.randn(*other_shape)}
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                node.meta["val"] = example[node.name]
            elif node.op == "call_function":
                args = fx.node.map_arg(node.args, lambda n: n.meta["val"])
                node.meta["val"] = node.target(*args, **node.kwargs)
        return gm, example

    gm, example = graph(0, (8, 4))
    expected = gm(**example)
    assert scatter_accumulate(gm, target_for(gm))
    gm.recompile()
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets == [aten.index_put.default]
    torch.testing.assert_close(gm(**example), expected)
    table = graph(1.5, (8, 4))[0]
    assert not scatter_accumulate(table, target_for(table))  # not a zero table
    broadcast = graph(0, (4,))[0]
    assert not scatter_accumulate(broadcast, target_for(broadcast))  # `other` broadcasts: the sum is not its shape
