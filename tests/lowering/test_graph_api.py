"""What lowerings may ask of the graph: `realize` in mid-lowering, tuples of outputs, and declining
after realizing (the extern call replaces whatever the lowering had added)."""

import pytest
import torch

from kiln.ir.nodes import Reduction
from kiln.lowering.context import realize
from kiln.lowering.creation import filled
from kiln.lowering.pointwise import pointwise
from kiln.lowering.reductions import reduce
from kiln.lowering.registry import LOWERINGS
from tests.lowering.support import check, extern_ops, through

aten = torch.ops.aten


def test_a_lowering_realizes_a_reduction_and_returns_several_values(monkeypatch):
    # aten.aminmax stands in for any multi-output op: (min, max) of the last dim.
    def aminmax(x, *, dim=None, keepdim=False):
        low = realize(reduce("min", x, [dim], keepdim))
        high = reduce("max", x, [dim], keepdim)  # a ReductionResult in the tuple: the graph realizes it
        return low, high

    monkeypatch.setitem(LOWERINGS, aten.aminmax.default, aminmax)
    x = torch.randn(4, 6)
    programs = check(lambda x: torch.aminmax(x, dim=1), x, lowered=[aten.aminmax.default])
    assert [type(s.node) for s in programs["reference"].kernels] == [Reduction, Reduction]


def test_realize_gives_later_reads_a_buffer(monkeypatch):
    def centered(x, dim):
        return pointwise("sub", [x, realize(reduce("max", x, [dim], keepdim=True))])

    monkeypatch.setitem(LOWERINGS, aten.logcumsumexp.default, centered)  # any unary op with a dim
    x = torch.randn(3, 5)
    out, program = through("reference", lambda x: torch.ops.aten.logcumsumexp(x, 1), x)
    torch.testing.assert_close(out, x - x.amax(1, keepdim=True))
    assert len(program.kernels) == 2 and not program.externs


def test_a_lowering_that_declines_after_realizing_leaves_only_the_extern(monkeypatch):
    def declines(x, dim):
        realize(pointwise("exp", [x]))
        raise NotImplementedError("not this case")

    monkeypatch.setitem(LOWERINGS, aten.logcumsumexp.default, declines)
    x = torch.randn(3, 5)
    for backend in ("reference", "cpp"):
        out, program = through(backend, lambda x: torch.logcumsumexp(x, 1), x)
        torch.testing.assert_close(out, torch.logcumsumexp(x, 1))
        assert not program.kernels and extern_ops(program) == {aten.logcumsumexp.default}


def test_realize_outside_a_graph_lowering_is_an_error():
    with pytest.raises(RuntimeError, match="outside a graph lowering"):
        realize(filled([2], 1.0, torch.float32))
