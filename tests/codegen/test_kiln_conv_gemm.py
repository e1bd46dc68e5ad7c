"""Convolutions of non-overlapping windows through kiln's GEMM (kiln/externs/kiln_conv_gemm.py): 1x1
ones of stride 1 and 2, and patch embeddings (stride = kernel, images that do not divide), against
torch's convolution with ragged channel counts (K not a multiple of a panel, C not of a vector),
pixel counts below and past a register block, every epilogue (bias, the added tensor before the
unary op, the unary ops), float32 and bfloat16; offered to the autotuner for these convolutions
only; the operator bit-equal to the kernel called directly; run by a compiled bottleneck block and a patch
embedding through both wrappers."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from kiln.autotune import gemm
from benchmarks import kernels
from kiln.externs import kiln_conv_gemm, native_ops, prepacked
from tests.codegen.test_kiln_depthwise import SCALARS, UNARY
from tests.kiln_backend import compiled_graphs
from tests.kiln_backend import kiln_wherever_offered, private_cache  # noqa: F401  (fixtures)

# (batch, in channels, out channels, height, width, kernel, stride)
SHAPES = [(1, 19, 29, 7, 5, 1, 1), (2, 64, 100, 3, 3, 1, 1), (1, 8, 48, 1, 1, 1, 1), (1, 3, 5, 2, 7, 1, 1),
          (1, 96, 130, 14, 14, 1, 1), (1, 40, 24, 7, 9, 1, 2), (2, 3, 50, 16, 16, 4, 4), (1, 19, 33, 9, 11, 2, 2),
          (1, 3, 20, 10, 7, 3, 3)]
ONE = ([1, 1], [0, 0], [1, 1])  # stride, padding, dilation


def _reference(x, w, b, other, unary, stride=1):
    y = F.conv2d(x.double(), w.double(), None if b is None else b.double(), stride)
    return UNARY[unary](y + other.double() if other is not None else y)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_kiln_conv_gemm_matches_torch(shape, dtype):
    n, c, k, h, w, kernel, stride = shape
    torch.manual_seed(c * k + h)
    x = torch.randn(n, c, h, w, dtype=dtype)
    wt, b = (torch.randn(k, c, kernel, kernel) / (c * kernel * kernel) ** 0.5).to(dtype), torch.randn(k, dtype=dtype)
    assert kiln_conv_gemm.applies(x, wt, [stride] * 2, [0, 0], [1, 1], 1)
    packed = kernels.conv_gemm_pack(wt)
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    oh, ow = (h - kernel) // stride + 1, (w - kernel) // stride + 1
    for unary, bias, with_other in itertools.product(UNARY, (b, None), (False, True)):
        other = torch.randn(n, k, oh, ow, dtype=dtype) if with_other else None
        out = kernels.conv_gemm(x, packed, k, bias, unary, SCALARS.get(unary, ()), None, other, (kernel, kernel),
                                  (stride, stride))
        assert out.dtype == dtype and out.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(out.double(), _reference(x, wt, bias, other, unary, stride), **tolerance)


def test_only_convolutions_of_non_overlapping_windows_apply():
    x, w, w2 = torch.randn(1, 8, 6, 6), torch.randn(16, 8, 1, 1), torch.randn(16, 8, 2, 2)
    assert kiln_conv_gemm.applies(x, w, *ONE, 1)
    assert kiln_conv_gemm.applies(x.bfloat16(), w.bfloat16(), *ONE, 1)
    assert kiln_conv_gemm.applies(x, w, [2, 2], [0, 0], [1, 1], 1)  # 1x1, strided: every other pixel
    assert kiln_conv_gemm.applies(x, w2, [2, 2], [0, 0], [1, 1], 1)  # patches
    assert not kiln_conv_gemm.applies(x, w2, [1, 1], [0, 0], [1, 1], 1)  # overlapping windows
    assert not kiln_conv_gemm.applies(x, w2, [2, 2], [0, 0], [2, 2], 1)  # dilated patches
    assert not kiln_conv_gemm.applies(x, w, [1, 1], [1, 1], [1, 1], 1)  # padded: a border of bias
    assert not kiln_conv_gemm.applies(x, w2, [2, 2], [1, 1], [1, 1], 1)
    assert not kiln_conv_gemm.applies(x, torch.randn(16, 4, 1, 1), *ONE, 2)  # grouped
    assert not kiln_conv_gemm.applies(x, torch.randn(16, 8, 3, 3), *ONE, 1)
    assert not kiln_conv_gemm.applies(x.double(), w.double(), *ONE, 1)
    with pytest.raises(RuntimeError, match="non-overlapping windows"):
        native_ops.direct("conv")(x, torch.randn(16, 8, 3, 3), None, [1, 1], [0, 0], [1, 1], 1, "none", [], None,
                                  None, "kiln")


def test_the_autotuner_offers_kiln_for_convolutions_of_non_overlapping_windows_only():
    offered = []
    pick = lambda op, signature, candidates, *a, **k: offered.append(list(candidates)) or "onednn"  # noqa: E731
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gemm, "choose", pick)
        x = torch.randn(1, 8, 6, 6)
        gemm.choose_conv(x, False, torch.randn(16, 8, 1, 1), None, (*ONE, 1), "relu", [], None, None)
        gemm.choose_conv(x, False, torch.randn(16, 8, 2, 2), None, ([2, 2], [0, 0], [1, 1], 1), "relu", [], None, None)
        gemm.choose_conv(x, False, torch.randn(16, 8, 3, 3), None, ([2, 2], [0, 0], [1, 1], 1), "relu", [], None, None)
    assert set(offered[0]) == set(offered[1]) == set(prepacked.CONV_IMPLS) and "kiln" not in offered[2]


@pytest.mark.parametrize("kernel, stride", [(1, 1), (1, 2), (3, 3)], ids=["1x1", "1x1-stride-2", "3x3-patches"])
def test_the_operator_and_the_kernel_called_directly_agree(kernel, stride):
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        x, w, b = torch.randn(2, 24, 9, 9, dtype=dtype), torch.randn(40, 24, kernel, kernel, dtype=dtype), torch.randn(40, dtype=dtype)
        out = (9 - kernel) // stride + 1
        other = torch.randn(2, 40, out, out, dtype=dtype).contiguous(memory_format=torch.channels_last)
        for unary, with_other in itertools.product(("none", "relu", "hardswish"), (False, True)):
            args = (x, w, b, [stride] * 2, [0, 0], [1, 1], 1, unary, [], None)
            want = kernels.conv_gemm(x, kernels.conv_gemm_pack(w), 40, b, unary, [], None, other if with_other else None,
                                     (kernel, kernel), (stride, stride))
            got = native_ops.direct("conv")(*args, other if with_other else None, "kiln")
            assert got.is_contiguous(memory_format=torch.channels_last)
            torch.testing.assert_close(got, want, rtol=0, atol=0)


class _Bottleneck(torch.nn.Module):
    """ResNet's block: 1x1 down, 3x3, 1x1 up, the identity added before the last ReLU."""

    def __init__(self):
        super().__init__()
        self.reduce = torch.nn.Conv2d(32, 8, 1)
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.expand = torch.nn.Conv2d(8, 32, 1)

    def forward(self, x):
        return F.relu(self.expand(F.relu(self.conv(F.relu(self.reduce(x))))) + x)


@pytest.mark.parametrize("cpp_wrapper", [True, False], ids=["cpp-wrapper", "python-wrapper"])
def test_a_bottleneck_block_runs_kilns_gemm_for_its_1x1_convolutions(kiln_wherever_offered, cpp_wrapper):
    torch.manual_seed(0)
    graphs = compiled_graphs(_Bottleneck().eval(), torch.randn(1, 32, 7, 7), cpp_wrapper=cpp_wrapper)
    convs = [step for g in graphs for step in g.schedule.externs if str(step.op) == "kiln.conv.default"]
    # Both 1x1 convolutions kiln's, the last with the identity and the ReLU inside; the 3x3 not.
    assert sorted(step.argument("impl") == "kiln" for step in convs) == [False, True, True]
    assert any(step.argument("impl") == "kiln" and step.argument("other") is not None and step.argument("unary") == "relu"
               for step in convs)


class _PatchEmbedding(torch.nn.Module):
    """A vision transformer's patch embedding, then a ConvNeXt-style 2x2 downsampling and a ResNet
    shortcut's 1x1 convolution of stride 2: every window its own pixels."""

    def __init__(self):
        super().__init__()
        self.patch = torch.nn.Conv2d(3, 24, 4, stride=4)
        self.down = torch.nn.Conv2d(24, 48, 2, stride=2)
        self.shortcut = torch.nn.Conv2d(48, 40, 1, stride=2)

    def forward(self, x):
        return self.shortcut(F.relu(self.down(F.gelu(self.patch(x)))))


@pytest.mark.parametrize("cpp_wrapper", [True, False], ids=["cpp-wrapper", "python-wrapper"])
def test_patch_embeddings_run_kilns_gemm(kiln_wherever_offered, cpp_wrapper):
    torch.manual_seed(0)
    # 35 = 8 * 4 + 3: the last three rows and columns are in no window.
    graphs = compiled_graphs(_PatchEmbedding().eval(), torch.randn(1, 3, 35, 35), cpp_wrapper=cpp_wrapper)
    convs = [step for g in graphs for step in g.schedule.externs if str(step.op) == "kiln.conv.default"]
    assert [step.argument("impl") for step in convs] == ["kiln"] * 3
