"""The loop IR without compiling anything: bodies under analysis handlers and the reference executor."""

import pytest
import sympy
import torch

from kiln.ir.analysis import IRPrinter, OpCounter, ReadsWrites, format_node, run
from kiln.ir.evaluate import evaluate
from kiln.ir.nodes import Buffer, Layout, Pointwise, Reduction, Scatter
from kiln.ir.ops import ALL_OPS, missing_ops, ops, use_handler
from kiln.ir.verify import IRError, verify

X = Buffer("x", Layout.contiguous([4, 6], torch.float32))


def softmax_nodes(buf: Buffer):
    """softmax over the last dim as three nodes: max, sum of exp, normalize."""
    n, m = buf.layout.size
    row_max = Reduction(torch.float32, [n], [m], "max", lambda i, r: buf.load([i[0], r[0]]), name="amax")
    amax = Buffer("amax", Layout.contiguous([n], torch.float32))

    def shifted_exp(i, r):
        return ops.exp(ops.sub(buf.load([i[0], r[0]]), amax.load([i[0]])))

    total = Reduction(torch.float32, [n], [m], "sum", shifted_exp, name="denom")
    denom = Buffer("denom", Layout.contiguous([n], torch.float32))
    out = Pointwise(
        torch.float32, [n, m],
        lambda i: ops.truediv(ops.exp(ops.sub(buf.load(i), amax.load([i[0]]))), denom.load([i[0]])),
        name="softmax",
    )  # fmt: skip
    return row_max, total, out


def test_softmax_from_nodes_matches_torch():
    x = torch.randn(4, 6)
    row_max, total, out = softmax_nodes(X)
    amax = evaluate(row_max, {"x": x})
    denom = evaluate(total, {"x": x, "amax": amax})
    result = evaluate(out, {"x": x, "amax": amax, "denom": denom})
    torch.testing.assert_close(result, torch.softmax(x, -1))


def test_strided_layout_is_an_index_map():
    # A transposed view copies nothing: the same storage read with swapped strides.
    x = torch.randn(4, 6)
    xt = Buffer("x", Layout((sympy.Integer(6), sympy.Integer(4)), (sympy.Integer(1), sympy.Integer(6)), torch.float32))
    node = Pointwise(torch.float32, [6, 4], lambda i: ops.mul(xt.load(i), ops.constant(2.0, torch.float32)))
    torch.testing.assert_close(evaluate(node, {"x": x}), x.t() * 2)


@pytest.mark.parametrize("kind, fn", [("sum", torch.sum), ("prod", torch.prod), ("max", torch.amax), ("min", torch.amin)])
def test_reductions(kind, fn):
    x = torch.rand(3, 5) + 0.5
    node = Reduction(torch.float32, [3], [5], kind, lambda i, r: X_35.load([i[0], r[0]]))
    torch.testing.assert_close(evaluate(node, {"x": x}), fn(x, -1))


X_35 = Buffer("x", Layout.contiguous([3, 5], torch.float32))


def test_index_expr_and_where():
    # iota and a causal mask, as lowerings of arange / triu will write them.
    node = Pointwise(
        torch.float32, [3, 3],
        lambda i: ops.where(ops.le(ops.index_expr(i[1], torch.int64), ops.index_expr(i[0], torch.int64)),
                            ops.constant(0.0, torch.float32), ops.constant(float("-inf"), torch.float32)),
    )  # fmt: skip
    expected = torch.zeros(3, 3).masked_fill(torch.ones(3, 3, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(evaluate(node, {}), expected)


def test_op_counts_and_dependencies():
    _, _, out = softmax_nodes(X)
    counts = run(OpCounter(), out).counts
    assert counts == {"load": 3, "sub": 1, "exp": 1, "truediv": 1}
    deps = run(ReadsWrites(), out)
    assert deps.buffers_read == ["x", "amax", "denom"]
    i0, i1 = out.index_vars()
    assert ("x", 6 * i0 + i1) in deps.reads and ("amax", i0) in deps.reads


def test_printer_lists_the_body():
    text = format_node(softmax_nodes(X)[1])
    assert text.splitlines()[0] == "denom: Reduction(float32, ranges=[4], reduction_ranges=[6], sum)"
    assert "  tmp2 = sub(tmp0, tmp1)" in text and "reduction('sum', float32, tmp3)" in text


def test_every_handler_implements_the_whole_protocol():
    from kiln.ir.evaluate import TorchEvaluator

    assert missing_ops(TorchEvaluator({}, {}, ())) == []
    assert missing_ops(IRPrinter()) == []
    assert "load" in ALL_OPS and "reduction" in ALL_OPS


def test_ops_outside_a_handler_and_unknown_ops_are_errors():
    with pytest.raises(RuntimeError, match="outside"):
        ops.exp(1)
    with use_handler(OpCounter()), pytest.raises(AttributeError, match="not an op of the protocol"):
        ops.frobnicate(1)


def test_verifier_accepts_good_nodes_and_names_broken_ones():
    for node in softmax_nodes(X):
        verify(node, known_buffers=["x", "amax", "denom"])
    stray = sympy.Symbol("i7", integer=True, nonnegative=True)
    with pytest.raises(IRError, match="does not own"):
        verify(Pointwise(torch.float32, [4], lambda i: X.load([i[0], stray])))
    with pytest.raises(IRError, match="unknown buffers"):
        verify(softmax_nodes(X)[2], known_buffers=["x"])
    with pytest.raises(IRError, match="dtype"):
        verify(Pointwise("float32", [4], lambda i: ops.constant(1.0, torch.float32)))
    with pytest.raises(IRError, match="body fails"):
        verify(Pointwise(torch.float32, [4], lambda i: X.load([i[0]])))  # rank mismatch
    with pytest.raises(ValueError, match="reduction_type"):
        Reduction(torch.float32, [4], [6], "mean", lambda i, r: X.load([i[0], r[0]]))


def test_symbolic_sizes_are_plain_expressions():
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    buf = Buffer("x", Layout.contiguous([s0, 8], torch.float32))
    node = Pointwise(torch.float32, [s0, 8], lambda i: ops.neg(buf.load(i)))
    verify(node)  # s0 is a size, not a loop variable
    (name, index), = run(ReadsWrites(), node).reads
    assert index == 8 * node.index_vars()[0] + node.index_vars()[1]


IDS = Buffer("ids", Layout.contiguous([5], torch.int64))
ROWS = Buffer("rows", Layout.contiguous([5, 6], torch.float32))


def row_scatter(mode, target_rank: int = 2) -> Scatter:
    """X (4x6) with the 5 rows of ROWS combined into the rows `ids` names."""
    def scattered(r):
        row = ops.indirect_indexing(IDS.load([r[0]]), 4)
        return [row, r[1]][:target_rank], ROWS.load(r)

    return Scatter(torch.float32, [4, 6], X.load, [5, 6], scattered, mode, name="out")


@pytest.mark.parametrize("mode, reduce", [(None, None), ("sum", "sum"), ("prod", "prod"), ("max", "amax"), ("min", "amin")])
def test_scatter_node_under_every_handler(mode, reduce):
    x, ids, rows = torch.randn(4, 6), torch.tensor([3, 0, 3, -1, 1]), torch.randn(5, 6)
    node = row_scatter(mode)
    result = evaluate(node, {"x": x, "ids": ids, "rows": rows})
    index = (ids % 4).view(-1, 1).expand(5, 6)
    if mode is None:  # duplicates: any of their values
        expected = x.scatter(0, index[[1, 2, 3, 4]], rows[[1, 2, 3, 4]])
    else:
        expected = x.scatter_reduce(0, index, rows, reduce)
    torch.testing.assert_close(result, expected)
    deps = run(ReadsWrites(), node)
    assert deps.buffers_read == ["x", "ids", "rows"] and len(deps.writes) == 1
    assert run(OpCounter(), node).counts["indirect_indexing"] == 1
    verify(node, known_buffers=["x", "ids", "rows"])
    assert "source_ranges=[5, 6]" in format_node(node)


def test_verifier_names_a_scatter_target_of_the_wrong_rank():
    with pytest.raises(IRError, match="rank"):
        verify(row_scatter("sum", target_rank=1))
    with pytest.raises(ValueError, match="mode"):
        Scatter(torch.float32, [4], X.load, [4], lambda r: ([r[0]], X.load(r)), "mean")
