"""kiln's depthwise convolution (kiln/native/include/kiln_depthwise.h): against torch's
convolution on shapes with ragged channel vectors, strides, paddings, dilations, odd output heights and
inputs too small for an unchecked block, with every epilogue (bias, an added tensor, the unary ops); offered
to the autotuner for depthwise convolutions only; run by compiled models through both wrappers."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from kiln.autotune import gemm
from benchmarks import kernels
from kiln.externs import kiln_depthwise, native_ops, prepacked
from tests.kiln_backend import compiled_graphs
from tests.kiln_backend import kiln_wherever_offered, private_cache  # noqa: F401  (fixtures)

UNARY = {"none": lambda y: y, "relu": F.relu, "gelu": F.gelu, "swish": F.silu, "hardswish": F.hardswish,
         "sigmoid": torch.sigmoid, "tanh": torch.tanh, "hardtanh": lambda y: F.hardtanh(y, -0.5, 0.5)}
SCALARS = {"hardtanh": [-0.5, 0.5]}

# (batch, channels, height, width, kernel, stride, padding, dilation)
SHAPES = [(1, 32, 17, 19, 3, 1, 1, 1), (2, 40, 9, 11, 5, 2, 2, 1), (1, 19, 8, 8, 7, 1, 3, 1), (1, 24, 10, 13, 3, 2, 0, 1),
          (1, 16, 12, 12, 3, 1, 2, 2), (1, 64, 5, 5, 7, 1, 3, 1), (1, 7, 4, 3, 3, 1, 1, 1), (1, 33, 20, 21, 3, 1, 1, 1),
          # 3 x 3, 5 x 5 and 7 x 7 kernels run two output rows at a time: odd output heights, one-row images, stride 2
          # with and without padding, two images, rows of 8 + 8 + 8 + 4 + 2 pixels
          (2, 48, 13, 15, 3, 2, 1, 1), (1, 17, 1, 9, 3, 1, 1, 1), (2, 20, 30, 30, 3, 1, 1, 1), (1, 36, 17, 17, 3, 2, 0, 1),
          (1, 32, 14, 14, 7, 1, 3, 1), (1, 48, 23, 9, 5, 1, 2, 1), (1, 16, 3, 3, 7, 1, 3, 1)]


def _reference(x, w, b, s, p, d, other, unary):
    y = F.conv2d(x, w, b, s, p, d, x.shape[1])
    return UNARY[unary](y + other if other is not None else y)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_kiln_depthwise_matches_torch(shape):
    n, c, h, w, k, s, p, d = shape
    torch.manual_seed(c * h + k)
    x, wt, b = torch.randn(n, c, h, w), torch.randn(c, 1, k, k), torch.randn(c)
    packed = kernels.depthwise_pack(wt)
    for unary, bias, with_other in itertools.product(UNARY, (b, None), (False, True)):
        other = torch.randn_like(F.conv2d(x, wt, None, s, p, d, c)) if with_other else None
        out = kernels.depthwise_conv(x, packed, (k, k), bias, (s, s), (p, p), (d, d), unary, SCALARS.get(unary, ()),
                                  None, other)
        assert out.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(out, _reference(x, wt, bias, s, p, d, other, unary), rtol=1e-5, atol=1e-5)


def test_only_float32_depthwise_convolutions_apply():
    x = torch.randn(1, 8, 6, 6)
    assert kiln_depthwise.applies(x, torch.randn(8, 1, 3, 3), 8)
    assert not kiln_depthwise.applies(x, torch.randn(16, 1, 3, 3), 8)  # two filters a channel
    assert not kiln_depthwise.applies(x, torch.randn(8, 2, 3, 3), 4)  # grouped, not depthwise
    assert not kiln_depthwise.applies(x.bfloat16(), torch.randn(8, 1, 3, 3).bfloat16(), 8)
    with pytest.raises(RuntimeError, match="depthwise"):
        native_ops.direct("conv")(x, torch.randn(8, 2, 3, 3), None, [1, 1], [1, 1], [1, 1], 4, "none", [], None,
                                  None, "kiln")


def test_the_autotuner_offers_kiln_for_depthwise_convolutions_only(monkeypatch):
    offered = []
    monkeypatch.setattr(gemm, "choose", lambda op, signature, candidates, *a, **k: offered.append(list(candidates))
                        or "onednn")
    x, args = torch.randn(1, 8, 6, 6), ([1, 1], [1, 1], [1, 1])
    gemm.choose_conv(x, False, torch.randn(8, 1, 3, 3), None, (*args, 8), "relu", [], None, None)
    gemm.choose_conv(x, False, torch.randn(8, 8, 3, 3), None, (*args, 1), "relu", [], None, None)
    assert "kiln" in offered[0] and "kiln" not in offered[1]
    assert set(offered[0]) == set(prepacked.CONV_IMPLS)


def test_the_operator_and_the_kernel_called_directly_agree():
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 24, 9, 9), torch.randn(24, 1, 3, 3), torch.randn(24)
    other = torch.randn(2, 24, 5, 5).contiguous(memory_format=torch.channels_last)
    for unary, with_other in itertools.product(("none", "relu", "hardswish"), (False, True)):
        args = (x, w, b, [2, 2], [1, 1], [1, 1], 24, unary, [], None)
        want = kernels.depthwise_conv(x, kernels.depthwise_pack(w), (3, 3), b, (2, 2), (1, 1), (1, 1), unary, [], None,
                                      other if with_other else None)
        got = native_ops.direct("conv")(*args, other if with_other else None, "kiln")
        torch.testing.assert_close(got, want, rtol=0, atol=0)


# [top, left, bottom, right]: a stride-2 "same" pad folded in (one more row and column after), and others.
FOUR_PADDINGS = [(3, 2, [0, 0, 1, 1]), (3, 1, [1, 0, 2, 1]), (5, 2, [1, 2, 2, 1]), (3, 2, [0, 1, 0, 0])]


@pytest.mark.parametrize("kernel, stride, padding", FOUR_PADDINGS, ids=lambda v: str(v))
def test_a_padding_of_four_entries_pads_each_side_its_own(kernel, stride, padding):
    torch.manual_seed(kernel + stride)
    x, w, b = torch.randn(2, 24, 11, 10), torch.randn(24, 1, kernel, kernel), torch.randn(24)
    top, left, bottom, right = padding
    want = F.relu(F.conv2d(F.pad(x, (left, right, top, bottom)), w, b, stride, 0, 1, 24))
    args = (x, w, b, [stride, stride], padding, [1, 1], 24, "relu", [], None, None)
    for impl in prepacked.CONV_IMPLS:  # kiln's kernel pads inside; the others pad x first
        torch.testing.assert_close(native_ops.direct("conv")(*args, impl), want, rtol=1e-5, atol=1e-5, msg=impl)
    assert native_ops.FAKES["conv"](*args, "kiln").shape == want.shape


class _InvertedResidual(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.expand = torch.nn.Conv2d(8, 32, 1)
        self.depthwise = torch.nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.project = torch.nn.Conv2d(32, 8, 1)

    def forward(self, x):
        return self.project(F.hardswish(self.depthwise(F.relu(self.expand(x))))) + x


@pytest.mark.parametrize("cpp_wrapper", [True, False], ids=["cpp-wrapper", "python-wrapper"])
def test_a_depthwise_block_runs_kilns_kernel(kiln_wherever_offered, cpp_wrapper):
    torch.manual_seed(0)
    model, x = _InvertedResidual().eval(), torch.randn(1, 8, 14, 14)
    graphs = compiled_graphs(model, x, cpp_wrapper=cpp_wrapper)
    impls = [step.argument("impl") for g in graphs for step in g.schedule.externs if str(step.op) == "kiln.conv.default"]
    assert impls and "kiln" in impls
