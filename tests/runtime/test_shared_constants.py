"""Frozen graphs over the same weights share their constants (kiln/runtime/shared_constants.py).

A model compiled for `generate()` has a prompt graph and a one-token graph over the same weights;
their constants graphs concatenate the same sibling weights. Here two graphs of one model (two
input shapes) must hold one copy of each computed constant, stay right after the weights change,
and the memo itself must tell tensors, versions, plain values and ops apart.
"""

import operator

import torch
from torch import fx, nn

import kiln
from kiln.backend import watch
from kiln.runtime import shared_constants
from kiln.runtime.frozen import FrozenProgram
from tests.kiln_backend import private_cache  # noqa: F401  (fixture)


class Siblings(nn.Module):
    """Three products of one input: sibling_products concatenates their weights (a computed constant)."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32)

    def forward(self, x):
        return self.q(x) * torch.sigmoid(self.k(x)) + self.v(x)


def _two_programs(model):
    compiled = kiln.compile(model, dynamic=False)
    with torch.no_grad(), watch() as built:
        for rows in (2, 3):
            x = torch.randn(rows, 32)
            torch.testing.assert_close(compiled(x), model(x))
    programs = [p for p in built if isinstance(p, FrozenProgram)]
    assert len(programs) == 2, built
    return compiled, programs


def _computed(program):
    return [c for c, own in zip(program.constants, program.split.computed) if own and isinstance(c, torch.Tensor)]


def test_two_graphs_over_the_same_weights_hold_one_copy_of_their_computed_constants(private_cache):
    torch.manual_seed(0)
    model = Siblings().eval()
    _, (first, second) = _two_programs(model)
    ours, theirs = _computed(first), _computed(second)
    assert ours, "the constants graph computed nothing (sibling_products should concatenate the weights)"
    assert {id(c) for c in ours} == {id(c) for c in theirs}  # the same tensors, not equal copies


def test_shared_constants_follow_a_weight_change_in_both_graphs(private_cache):
    torch.manual_seed(0)
    model = Siblings().eval()
    compiled, (first, second) = _two_programs(model)
    before = list(_computed(first))  # held: a freed tensor's id may be given to a new one
    with torch.no_grad():
        model.k.weight.add_(0.5)  # an in-place write: the version counter moves
        for rows in (2, 3):
            x = torch.randn(rows, 32)
            torch.testing.assert_close(compiled(x), model(x))
        model.v.weight.data.mul_(-1)  # through .data: only data_watch sees it
        for rows in (3, 2):
            x = torch.randn(rows, 32)
            torch.testing.assert_close(compiled(x), model(x))
    assert first.freezes == second.freezes == 3
    after = {id(c) for c in _computed(first)}
    assert after == {id(c) for c in _computed(second)} and not after & {id(c) for c in before}


def _graph(build):
    graph = fx.Graph()
    build(graph)
    return fx.GraphModule(torch.nn.Module(), graph)


def _cat_graph(graph):
    a, b = graph.placeholder("a"), graph.placeholder("b")
    cat = graph.call_function(torch.ops.aten.cat.default, ([a, b], 0))
    scale = graph.call_function(torch.ops.aten.mul.Tensor, (cat, 2.0))
    graph.output((cat, scale))


def test_the_memo_shares_a_node_only_over_the_same_tensors_at_the_same_version():
    shared_constants.clear()
    a, b, c = torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 3)
    gm, other = _graph(_cat_graph), _graph(_cat_graph)  # two graphs of the same nodes
    cat, scaled = shared_constants.compute(gm, [a, b])
    assert shared_constants.compute(other, [a, b])[0] is cat
    assert shared_constants.compute(other, [a, b])[1] is scaled
    assert shared_constants.compute(other, [a, c])[0] is not cat  # another tensor
    assert shared_constants.compute(other, [b, a])[0] is not cat  # another order
    a.add_(1)  # another version
    recat = shared_constants.compute(other, [a, b])[0]
    assert recat is not cat
    torch.testing.assert_close(recat, torch.cat([a, b]))


def test_the_memo_keys_plain_values_by_type_and_repr_and_shares_no_random_or_mutating_op():
    shared_constants.clear()

    def scaled(by):
        def build(graph):
            a = graph.placeholder("a")
            graph.output((graph.call_function(torch.ops.aten.mul.Tensor, (a, by)),))
        return _graph(build)

    a = torch.randn(4)
    zero, negative_zero, one, one_int = (shared_constants.compute(scaled(v), [a])[0] for v in (0.0, -0.0, 1.0, 1))
    assert len({id(zero), id(negative_zero), id(one), id(one_int)}) == 4
    assert torch.equal(torch.signbit(negative_zero), ~torch.signbit(zero))  # -0.0 was not answered by 0.0

    def random(graph):
        graph.output((graph.call_function(torch.ops.aten.rand.default, ([3],), {"dtype": torch.float32}),))

    assert shared_constants.compute(_graph(random), [])[0] is not shared_constants.compute(_graph(random), [])[0]

    def mutating(graph):
        a = graph.placeholder("a")
        graph.output((graph.call_function(torch.ops.aten.add_.Tensor, (a, 1.0)),))

    x = torch.zeros(2)
    shared_constants.compute(_graph(mutating), [x])
    shared_constants.compute(_graph(mutating), [x])
    assert torch.equal(x, torch.full((2,), 2.0))  # run twice, never answered from the memo


def test_a_result_no_graph_holds_is_computed_again():
    shared_constants.clear()
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    held = shared_constants.compute(_graph(_cat_graph), [a, b])  # cat and its scaled copy
    computed = shared_constants.STATS["computed"]
    assert shared_constants.compute(_graph(_cat_graph), [a, b])[0] is held[0]
    assert shared_constants.STATS["computed"] == computed  # both nodes answered by the memo
    del held
    again = shared_constants.compute(_graph(_cat_graph), [a, b])
    assert shared_constants.STATS["computed"] == computed + 2  # both computed again, not a dead reference
    torch.testing.assert_close(again[1], 2 * torch.cat([a, b]))


def test_a_multi_output_op_is_reached_through_its_getitem_nodes():
    shared_constants.clear()

    def build(graph):
        a = graph.placeholder("a")
        parts = graph.call_function(torch.ops.aten.split.Tensor, (a, 2))
        graph.output((graph.call_function(operator.getitem, (parts, 1)),))

    a = torch.arange(4.0)
    second = shared_constants.compute(_graph(build), [a])[0]
    assert shared_constants.compute(_graph(build), [a])[0] is second
    torch.testing.assert_close(second, torch.tensor([2.0, 3.0]))
