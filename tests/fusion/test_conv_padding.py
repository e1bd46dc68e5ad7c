"""A zero pad before a convolution goes into the convolution's padding (its symmetric part; a
stride-2 "same" pad keeps its extra row and column as a pad), and a pad of nothing disappears."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.kiln_backend import compiled, private_cache  # noqa: F401  (fixture)


class PadConv(nn.Module):
    def __init__(self, pads, stride=1, padding=0, groups=1, value=0.0, returned=False):
        super().__init__()
        self.pads, self.value, self.returned = pads, value, returned
        self.conv = nn.Conv2d(4, 8 if groups == 1 else 4, 3, stride=stride, padding=padding, groups=groups)

    def forward(self, x):
        p = F.pad(x, self.pads, value=self.value)
        y = self.conv(p)
        return (y, p) if self.returned else y


def _convs(program):
    return [s for s in program.schedule.externs if "convolution" in str(s.op)]


def _conv_paddings(program):
    return [list(s.args[4]) for s in _convs(program)]


@pytest.mark.parametrize("pads, padding, expected", [
    ([1, 1, 1, 1], 0, [1, 1]),         # symmetric: all of it into the convolution
    ([2, 2, 1, 1], 1, [2, 3]),         # added to the convolution's own padding, per dimension
    ([0, 1, 0, 1], 0, [0, 0]),         # stride-2 "same": nothing symmetric, the pad stays
    ([1, 2, 1, 2], 0, [1, 1]),         # the symmetric part folded, one row and column left
    ([0, 0, 0, 0], 0, [0, 0]),         # a pad of nothing is gone
])
def test_zero_pad_goes_into_the_convolution(pads, padding, expected):
    torch.manual_seed(0)
    model, x = PadConv(pads, stride=2 if pads[1] != pads[0] else 1, padding=padding).eval(), torch.randn(2, 4, 10, 10)
    out, program = compiled(model, x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    assert _conv_paddings(program) == [expected]
    left = [a - min(a, b) for a, b in zip(pads[::2], pads[1::2])] + [b - min(a, b) for a, b in zip(pads[::2], pads[1::2])]
    assert (len(program.schedule.kernels) > 0) == any(left)  # a pad left over is a kernel; none otherwise


def test_depthwise_convolution_takes_the_pad_too():
    torch.manual_seed(0)
    model, x = PadConv([1, 1, 1, 1], groups=4).eval(), torch.randn(1, 4, 9, 9)
    out, program = compiled(model, x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    assert _conv_paddings(program) == [[1, 1]] and not program.schedule.kernels


@pytest.mark.parametrize("kwargs", [dict(value=1.0), dict(returned=True)])
def test_pad_of_another_value_or_also_returned_stays(kwargs):
    torch.manual_seed(0)
    model, x = PadConv([1, 1, 1, 1], **kwargs).eval(), torch.randn(1, 4, 8, 8)
    out, program = compiled(model, x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    assert _conv_paddings(program) == [[0, 0]] and program.schedule.kernels
