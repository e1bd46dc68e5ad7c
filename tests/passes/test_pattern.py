"""The pattern matcher on small ATen graphs: arguments in schema order, defaults, commutative
ops, repeated names, single-use inner nodes, and rewriting while iterating."""

import operator

import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.passes.pattern import Op, Var, arguments, match, matches, replace

aten = torch.ops.aten


def _aten(fn, *inputs):
    gm = make_fx(fn, tracing_mode="fake")(*inputs)
    gm.graph.eliminate_dead_code()  # as the AOT layer does: unused getitems go
    return gm


def _calls(gm, target):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is target]


def test_arguments_fill_keywords_and_defaults():
    gm = _aten(lambda x, y: torch.add(x, y, alpha=2), torch.randn(3), torch.randn(3))
    (add,) = _calls(gm, aten.add.Tensor)
    assert arguments(add)[2] == 2
    gm = _aten(lambda x, y: x + y, torch.randn(3), torch.randn(3))
    (add,) = _calls(gm, aten.add.Tensor)
    assert arguments(add)[2] == 1


def test_left_out_arguments_must_hold_their_defaults():
    pattern = Op(aten.add.Tensor, Var("a"), Var("b"))
    plain = _aten(lambda x, y: x + y, torch.randn(3), torch.randn(3))
    scaled = _aten(lambda x, y: torch.add(x, y, alpha=2), torch.randn(3), torch.randn(3))
    assert match(pattern, _calls(plain, aten.add.Tensor)[0]) is not None
    assert match(pattern, _calls(scaled, aten.add.Tensor)[0]) is None
    assert match(Op(aten.add.Tensor, Var("a"), ...), _calls(scaled, aten.add.Tensor)[0]) is not None


def test_nested_pattern_binds_names_and_covers_nodes():
    gm = _aten(lambda x, y: torch.relu(x + y), torch.randn(3), torch.randn(3))
    pattern = Op(aten.relu.default, Op(aten.add.Tensor, Var("a"), Var("b"), name="add"))
    (root, found), = list(matches(gm, pattern))
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert found["a"] is placeholders[0] and found["b"] is placeholders[1]
    assert found.nodes == [root, found["add"]]


def test_commutative_tries_both_orders():
    gm = _aten(lambda x, y: torch.relu(x) + y, torch.randn(3), torch.randn(3))
    relu_first = Op(aten.add.Tensor, Op(aten.relu.default, Var("x")), Var("y"))
    relu_second = Op(aten.add.Tensor, Var("y"), Op(aten.relu.default, Var("x")))
    (add,) = _calls(gm, aten.add.Tensor)
    assert match(relu_first, add) is not None
    assert match(relu_second, add) is None
    assert match(Op(aten.add.Tensor, Var("y"), Op(aten.relu.default, Var("x")), commutative=True), add) is not None


def test_an_inner_node_used_elsewhere_does_not_match():
    gm = _aten(lambda x: torch.relu(x.sin()) + x.sin().sum(), torch.randn(3))
    (relu,) = _calls(gm, aten.relu.default)
    assert len(_calls(gm, aten.sin.default)) == 2  # make_fx keeps both: each has one user
    shared = _aten(lambda x: (lambda s: torch.relu(s) + s)(x.sin()), torch.randn(3))
    (relu,) = _calls(shared, aten.relu.default)
    assert match(Op(aten.relu.default, Op(aten.sin.default, Var("x"))), relu) is None


def test_same_name_twice_must_bind_the_same_node():
    pattern = Op(aten.mul.Tensor, Var("a"), Var("a"))
    square = _aten(lambda x: x * x, torch.randn(3))
    product = _aten(lambda x, y: x * y, torch.randn(3), torch.randn(3))
    assert match(pattern, _calls(square, aten.mul.Tensor)[0]) is not None
    assert match(pattern, _calls(product, aten.mul.Tensor)[0]) is None


def test_where_filters_bindings_and_literals_compare_by_value():
    gm = _aten(lambda x: torch.sum(x, [0]), torch.randn(3, 4))
    (node,) = _calls(gm, aten.sum.dim_IntList)
    assert match(Op(aten.sum.dim_IntList, Var("x"), [0], ...), node) is not None
    assert match(Op(aten.sum.dim_IntList, Var("x"), [1], ...), node) is None
    assert match(Op(aten.sum.dim_IntList, Var("x", lambda n: n.meta["val"].dim() == 3), ...), node) is None


def test_replace_while_iterating_rewrites_every_match():
    gm = _aten(lambda x: torch.relu(torch.relu(x).sin()).cos(), torch.randn(3))
    for node, found in matches(gm, Op(aten.relu.default, Var("x"))):
        replace(gm, node, aten.abs.default, found["x"])
    gm.recompile()
    assert not _calls(gm, aten.relu.default) and len(_calls(gm, aten.abs.default)) == 2
    x = torch.randn(3)
    torch.testing.assert_close(gm(x), torch.abs(torch.abs(x).sin()).cos())


def test_getitem_patterns_match_multi_output_ops():
    gm = _aten(lambda x: torch.max(x, 0)[0], torch.randn(3, 4))
    getitems = _calls(gm, operator.getitem)
    assert match(Op(operator.getitem, Op(aten.max.dim, Var("x"), 0, ...), 0), getitems[0]) is not None
