"""prod, any, all, argmax and argmin as Reduction nodes, with eager's dtypes, NaN and ties."""

import torch

from tests.lowering.support import check

aten = torch.ops.aten


def test_prod_any_all_and_integer_sums():
    x, i = torch.rand(3, 4, 5) + 0.5, torch.randint(-3, 4, (3, 4))
    fn = lambda x, i: (x.prod(), x.prod(1), x.prod(-1, keepdim=True), i.prod(0), (x > 1).any(), (x > 1).any(2),  # noqa: E731
                       (x > 0.6).all((0, 2)), i.any(1), i.all(), (i > 0).sum(1), (x > 1).sum(), x[0, 0, 0].sum(0))
    programs = check(fn, x, i, exact=False, lowered=[aten.prod.default, aten.prod.dim_int, aten.any.dim,
                                                     aten.any.dims, aten.any.default, aten.all.default])
    assert not programs["cpp"].externs


def test_argmax_argmin_first_of_ties_and_nan_wins():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [float("nan"), 5.0, float("nan"), -1.0], [2.0, 2.0, 2.0, 2.0]])
    fn = lambda x, i: (x.argmax(1), x.argmin(1), x.argmax(), x.argmin(0, keepdim=True), x.t().argmax(0),  # noqa: E731
                       i.argmax(0), i.argmin(), x.argmax(keepdim=True))
    programs = check(fn, x, torch.tensor([[3, 1], [3, 5], [-2, 5]]), exact=True,
                     lowered=[aten.argmax.default, aten.argmin.default])
    assert not programs["cpp"].externs
