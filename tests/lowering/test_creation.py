"""Ranges and constants computed where they are read: arange, iota, full, full_like."""

import torch

from tests.lowering.support import check

aten, prims = torch.ops.aten, torch.ops.prims


def test_arange_int_and_float_steps_match_eager_exactly():
    # Float ranges are computed as start + i * step in double and rounded once, as eager does.
    fn = lambda x: (torch.arange(5) + x[0], torch.arange(3, -7, -2) * x[1], torch.arange(0.0, 1.0, 0.1) + x[2],  # noqa: E731
                    torch.arange(-1.5, 2.0, 0.3, dtype=torch.float64) + x[3])
    check(fn, torch.tensor([0, 1, 0, 0]), exact=True, lowered=[aten.arange.start_step])


def test_iota_full_and_full_like():
    x = torch.randn(3, 4).t()
    fn = lambda x: (prims.iota(6, start=-2, step=3, dtype=torch.int64, device="cpu", requires_grad=False) * 2,  # noqa: E731
                    torch.full_like(x, 2.5), torch.full_like(x, 7, dtype=torch.int32), torch.zeros(2, 3) + x[0, 0],
                    torch.ones_like(x, dtype=torch.bool), torch.full((2,), float("-inf")) + x[0, :2])
    programs = check(fn, x, exact=True, lowered=[prims.iota.default, aten.full_like.default, aten.full.default])
    assert not programs["cpp"].externs
