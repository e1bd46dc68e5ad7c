"""A zero pad before a convolution goes into the convolution's padding (its symmetric part; a
stride-2 "same" pad keeps its extra row and column as a pad, except before a depthwise convolution
that kiln's kernel runs, which pads each side its own), and a pad of nothing disappears."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kiln.autotune import gemm
from tests.kiln_backend import compiled, compiled_graphs
from tests.kiln_backend import kiln_wherever_offered, private_cache  # noqa: F401  (fixtures)


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


class SamePaddedBlock(nn.Module):
    """A MobileNet block as TensorFlow pads it: 1x1, then a stride-2 depthwise convolution after a
    pad of one row and one column (HuggingFace's MobileNetV1 with tf_padding)."""

    def __init__(self):
        super().__init__()
        self.expand, self.project = nn.Conv2d(8, 32, 1), nn.Conv2d(32, 8, 1)
        self.depthwise = nn.Conv2d(32, 32, 3, stride=2, groups=32)

    def forward(self, x):
        y = F.pad(F.relu6(self.expand(x)), (0, 1, 0, 1))
        return self.project(F.relu6(self.depthwise(y)))


def _depthwise_paddings(graphs):
    return [s.argument("padding") for g in graphs for s in g.schedule.externs
            if str(s.op) == "kiln.conv.default" and s.argument("groups") > 1]


@pytest.mark.parametrize("cpp_wrapper", [True, False], ids=["cpp-wrapper", "python-wrapper"])
def test_kilns_depthwise_kernel_takes_the_pad_left_over(kiln_wherever_offered, cpp_wrapper):
    torch.manual_seed(0)
    model, x = SamePaddedBlock().eval(), torch.randn(1, 8, 14, 14)
    graphs = compiled_graphs(model, x, cpp_wrapper=cpp_wrapper)
    assert _depthwise_paddings(graphs) == [[0, 0, 1, 1]]
    assert not any(g.schedule.kernels for g in graphs)  # the pad was the one kernel


def test_the_pad_left_over_stays_before_a_library_convolution(monkeypatch):
    monkeypatch.setattr(gemm, "choose", lambda op, signature, candidates, *a, **k: "onednn")
    torch.manual_seed(0)
    graphs = compiled_graphs(SamePaddedBlock().eval(), torch.randn(1, 8, 14, 14))
    assert _depthwise_paddings(graphs) == [[0, 0]] and any(g.schedule.kernels for g in graphs)


class ValidConvs(nn.Module):
    """EfficientNet's convolutions: `padding="valid"`, which reaches ATen as one padding entry for
    both spatial dimensions ([0]), a stride-2 depthwise one among them."""

    def __init__(self):
        super().__init__()
        self.full = nn.Conv2d(4, 8, 3, stride=2, padding="valid")
        self.depthwise = nn.Conv2d(8, 8, 3, padding="valid", groups=8)

    def forward(self, x):
        return self.depthwise(F.silu(self.full(x)))


@pytest.mark.parametrize("impl", ["kiln", "onednn", "aten_channels_last"])
def test_one_padding_entry_for_both_dimensions_is_each_dimensions(monkeypatch, impl):
    pick = gemm.choose
    monkeypatch.setattr(gemm, "choose", lambda op, signature, candidates, *a, **k: impl if impl in candidates
                        else pick(op, signature, candidates, *a, **k))
    torch.manual_seed(0)
    graphs = compiled_graphs(ValidConvs().eval(), torch.randn(1, 4, 15, 15))
    convs = [s for g in graphs for s in g.schedule.externs if str(s.op) == "kiln.conv.default"]
    assert convs and all(len(s.argument(k)) == 2 for s in convs for k in ("stride", "padding", "dilation"))
