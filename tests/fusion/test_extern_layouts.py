"""Layouts around extern calls: a value computed for a convolution is written in eager's layout of
that argument, and the extern's output layout is the one the CPU kernel really returns, so the
wrapper copies nothing at run time."""

import torch
from torch import fx

import kiln
from kiln import aot
from kiln.backend import Backend
from tests.kiln_backend import private_cache  # noqa: F401  (fixture)


class ChannelsLastBlock(torch.nn.Module):
    """A depthwise convolution of channels-last data (a linear layer's output over the channels),
    as in ConvNeXt's blocks."""

    def __init__(self):
        super().__init__()
        self.pointwise = torch.nn.Linear(8, 8)
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)

    def forward(self, x):
        y = self.pointwise(x.permute(0, 2, 3, 1)) * 2.0
        return self.conv(y.permute(0, 3, 1, 2)).permute(0, 2, 3, 1) + 1.0


def test_channels_last_depthwise_convolution_copies_nothing_at_run_time():
    torch.manual_seed(0)
    block, x = ChannelsLastBlock().eval(), torch.randn(1, 8, 6, 6)
    programs, copied = [], []

    def compile_graph(gm, example_inputs):
        programs.append(Backend()(gm, example_inputs))
        return programs[-1]

    # Unfrozen: the convolution is ATen's, on the layout eager gives it (tests/fusion/test_freezing.py
    # covers frozen convolutions). The Python wrapper, whose layout checks this watches.
    with torch.no_grad(), kiln.config.patch({"backend.freezing": False, "backend.cpp_wrapper": False}):
        fn = aot.compile(fx.symbolic_trace(block), [x], compile_graph)
        globals_ = programs[0].call.__globals__
        original = globals_["_in_layout"]

        def in_layout(t, layout):  # records whether the wrapper had to copy `t`
            out = original(t, layout)
            copied.append(out is not t)
            return out

        globals_["_in_layout"] = in_layout
        torch.testing.assert_close(fn(x), block(x))
    (conv,) = [s for s in programs[0].schedule.externs if "convolution" in str(s.op)]
    assert conv.args[0].layout.stride[1] == 1  # the computed input is channels-last, as in eager
    assert copied and not any(copied)  # every tensor arrived in the layout its kernels expect
