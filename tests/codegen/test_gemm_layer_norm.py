"""A layer norm inside kiln's GEMM (kiln_gemm.h `layer_norm_rows`, kiln::mm_layer_norm,
passes/gemm_layer_norm.py): the kernel against a float64 layer norm of a float64 product on
ragged shapes and K blocks, with and without each of the GEMM's bias, the residual, the norm's
weight and bias, normalized in place or beside the kept sum; the runtime's forms bit-equal to
Python's; the pass fusing a post-norm block's sublayer output (kiln::mm_layer_norm) and a
pre-norm block's, whose sum is read again (kiln::mm_add_layer_norm), and nothing else (a
bfloat16 block; a product another GEMM implementation computes); compiled blocks through both
wrappers. The same for an RMS norm (T5's and Llama's) with `rms=True`."""

import ctypes
import itertools

import pytest
import torch
import torch.nn.functional as F

from kiln.autotune import gemm
from kiln.externs import kiln_gemm
from kiln.native import runtime
from tests.codegen.test_kiln_gemm import SHAPES, _check, _operands
from tests.kiln_backend import compiled_graphs
from tests.kiln_backend import kiln_wherever_offered, private_cache  # noqa: F401  (fixtures)


def _reference(a, b, bias, residual, weight, norm_bias, eps, rms=False):
    """The float64 layer norm (`rms`: RMS norm) of a @ b + bias + residual; with `eps` None, the sum itself."""
    y = a.double() @ b.double()
    y = y + bias.double() if bias is not None else y
    y = y + residual.double() if residual is not None else y
    if eps is None:
        return y
    as_double = lambda t: t.double() if t is not None else None  # noqa: E731
    if rms:
        return F.rms_norm(y, (y.shape[-1],), as_double(weight), eps)
    return F.layer_norm(y, (y.shape[-1],), as_double(weight), as_double(norm_bias), eps)


@pytest.mark.parametrize("shape", [*SHAPES, (128, 3072, 768)], ids=lambda s: "x".join(map(str, s)))
def test_the_normalized_rows_match_a_float64_layer_norm(shape):
    m, k, n = shape
    a, b, bias, residual = _operands(m, k, n, torch.float32, seed=m + k + n)
    g = torch.Generator().manual_seed(n)
    weight, norm_bias = torch.randn(n, generator=g), torch.randn(n, generator=g)
    panels = kiln_gemm.pack(b)
    for use_bias, use_residual, use_weight, use_norm_bias in itertools.product((False, True), repeat=4):
        args = (bias if use_bias else None, residual if use_residual else None, weight if use_weight else None,
                norm_bias if use_norm_bias else None)
        out = kiln_gemm.mm(a, panels, n, args[0], residual=args[1], layer_norm=(args[2], args[3], 1e-5))
        torch.testing.assert_close(out.double(), _reference(a, b, *args, 1e-5), rtol=1e-4, atol=1e-4)
    # Beside the sum, which C keeps: rows of the normalized output further apart than N.
    normed = torch.full((m, n + 3), float("nan"))[:, :n]
    total = kiln_gemm.mm(a, panels, n, bias, residual=residual, layer_norm=(weight, norm_bias, 1e-5, normed))
    _check(total, _reference(a, b, bias, residual, None, None, None), torch.float32, k)
    torch.testing.assert_close(normed.double(), _reference(a, b, bias, residual, weight, norm_bias, 1e-5),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [*SHAPES, (128, 2048, 512)], ids=lambda s: "x".join(map(str, s)))
def test_rms_normalized_rows_match_a_float64_rms_norm(shape):
    m, k, n = shape
    a, b, bias, residual = _operands(m, k, n, torch.float32, seed=m + k + n + 1)
    weight = torch.randn(n, generator=torch.Generator().manual_seed(n))
    panels = kiln_gemm.pack(b)
    for use_bias, use_residual, use_weight in itertools.product((False, True), repeat=3):
        args = (bias if use_bias else None, residual if use_residual else None, weight if use_weight else None)
        rms = kiln_gemm.RowNorm(args[2], None, 1e-6, rms=True)
        out = kiln_gemm.mm(a, panels, n, args[0], residual=args[1], layer_norm=rms)
        torch.testing.assert_close(out.double(), _reference(a, b, *args, None, 1e-6, rms=True), rtol=1e-4, atol=1e-4)
    normed = torch.full((m, n + 3), float("nan"))[:, :n]
    beside = kiln_gemm.RowNorm(weight, None, 1e-6, normed, rms=True)
    total = kiln_gemm.mm(a, panels, n, None, residual=residual, layer_norm=beside)
    _check(total, _reference(a, b, None, residual, None, None, None), torch.float32, k)
    torch.testing.assert_close(normed.double(), _reference(a, b, None, residual, weight, None, 1e-6, rms=True),
                               rtol=1e-4, atol=1e-4)
    # Not a layer norm: rows with a mean far from zero tell the two apart.
    shifted = kiln_gemm.mm(a, panels, n, bias + 5.0, layer_norm=kiln_gemm.RowNorm(None, None, 1e-6, rms=True))
    assert not torch.allclose(shifted, kiln_gemm.mm(a, panels, n, bias + 5.0, layer_norm=(None, None, 1e-6)), atol=1e-2)


def test_an_rms_norm_takes_no_bias():
    a, b, _, _ = _operands(4, 8, 16, torch.float32, seed=0)
    with pytest.raises(RuntimeError, match="RMS norm takes no bias"):
        kiln_gemm.mm(a, kiln_gemm.pack(b), 16, layer_norm=kiln_gemm.RowNorm(None, torch.zeros(16), 1e-5, rms=True))
    with pytest.raises(RuntimeError, match="RMS norm takes no norm_bias"):
        runtime.mm_layer_norm(a, b, None, None, None, torch.zeros(16), 1e-5, rms=True)


def test_k_blocks_finish_before_the_rows_are_normalized():
    a, b, bias, residual = _operands(33, 70, 29, torch.float32, seed=3)
    panels = kiln_gemm.pack(b)
    want = kiln_gemm.mm(a, panels, 29, bias, residual=residual, layer_norm=(None, None, 1e-6))
    torch.testing.assert_close(want.double(), _reference(a, b, bias, residual, None, None, 1e-6), rtol=1e-4, atol=1e-4)
    # K = 70 is one block at the default K_BLOCK; called directly, cut in blocks of 16.
    out = torch.empty(33, 29)
    post = kiln_gemm._with_layer_norm(kiln_gemm.epilogue(bias, "none", (), None, residual, torch.float32), torch.float32,
                                      None, None, 1e-6)
    kiln_gemm.library().kiln_gemm_f32(33, 29, 70, a.data_ptr(), a.stride(0), panels.data_ptr(),
                                      out.data_ptr(), 29, ctypes.byref(post), 16)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_only_float32_results_are_normalized():
    a, b, _, _ = _operands(4, 8, 16, torch.bfloat16, seed=0)
    with pytest.raises(RuntimeError, match="float32"):
        kiln_gemm.mm(a, kiln_gemm.pack(b), 16, layer_norm=(None, None, 1e-5))


def test_the_runtime_and_python_forms_agree():
    a, b, bias, residual = _operands(50, 96, 100, torch.float32, seed=1)
    weight, norm_bias = torch.randn(100), torch.randn(100)
    for args in [(bias, residual, weight, norm_bias), (None, None, None, None), (bias, None, weight, None)]:
        want = torch.ops.kiln.mm_layer_norm(a, b, *args, 1e-12)
        torch.testing.assert_close(runtime.mm_layer_norm(a, b, *args, 1e-12), want, rtol=0, atol=0)
        kept, normed = torch.ops.kiln.mm_add_layer_norm(a, b, *args, 1e-12)
        torch.testing.assert_close(normed, want, rtol=0, atol=0)
        for got, expected in zip(runtime.mm_add_layer_norm(a, b, *args, 1e-12), (kept, normed)):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
    for args in [(bias, residual, weight, None), (None, residual, None, None)]:
        want = torch.ops.kiln.mm_layer_norm(a, b, *args, 1e-6, rms=True)
        torch.testing.assert_close(want.double(), _reference(a, b, *args, 1e-6, rms=True), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(runtime.mm_layer_norm(a, b, *args, 1e-6, rms=True), want, rtol=0, atol=0)
        kept, normed = torch.ops.kiln.mm_add_layer_norm(a, b, *args, 1e-6, rms=True)
        torch.testing.assert_close(normed, want, rtol=0, atol=0)
        for got, expected in zip(runtime.mm_add_layer_norm(a, b, *args, 1e-6, rms=True), (kept, normed)):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)


class _PostNorm(torch.nn.Module):
    """A transformer sublayer's output as BERT has it: LayerNorm(dropout(dense(h)) + x)."""

    def __init__(self, pre_norm: bool = False):
        super().__init__()
        self.dense, self.norm, self.dropout, self.pre_norm = torch.nn.Linear(64, 48), torch.nn.LayerNorm(48), \
            torch.nn.Dropout(0.1), pre_norm

    def forward(self, h, x):
        total = self.dropout(self.dense(h)) + x
        return (self.norm(total), total) if self.pre_norm else self.norm(total)


class _PreRmsNorm(torch.nn.Module):
    """A pre-norm block's residual stream as Llama and T5 have it: the sum, and the next sublayer
    reading its RMS norm (HF's own norm modules, so the pattern is theirs)."""

    def __init__(self, norm: str = "llama"):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm
        from transformers.models.t5.modeling_t5 import T5LayerNorm

        self.o = torch.nn.Linear(64, 48, bias=False)
        self.norm = (LlamaRMSNorm if norm == "llama" else T5LayerNorm)(48, eps=1e-6)
        self.up = torch.nn.Linear(48, 32, bias=False)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)

    def forward(self, h, x):
        total = x + self.o(h)
        return self.up(self.norm(total)), total


def _fused_calls(model, *inputs, cpp_wrapper=True, rms=False):
    steps = [s for g in compiled_graphs(model, *inputs, cpp_wrapper=cpp_wrapper) for s in g.schedule.externs]
    fused = [s for s in steps if s.op in (torch.ops.kiln.mm_layer_norm.default, torch.ops.kiln.mm_add_layer_norm.default)]
    assert all(bool(s.kwargs.get("rms", False)) == rms for s in fused)
    ops = [s.op for s in fused]
    return ops.count(torch.ops.kiln.mm_layer_norm.default), ops.count(torch.ops.kiln.mm_add_layer_norm.default)


@pytest.mark.parametrize("cpp_wrapper", [True, False], ids=["cpp-wrapper", "python-wrapper"])
def test_a_post_norm_sublayer_normalizes_inside_the_gemm(kiln_wherever_offered, cpp_wrapper):
    torch.manual_seed(0)
    model, h, x = _PostNorm().eval(), torch.randn(1, 10, 64), torch.randn(1, 10, 48)
    assert _fused_calls(model, h, x, cpp_wrapper=cpp_wrapper) == (1, 0)


@pytest.mark.parametrize("cpp_wrapper", [True, False], ids=["cpp-wrapper", "python-wrapper"])
def test_a_sum_read_again_is_kept_beside_its_norm(kiln_wherever_offered, cpp_wrapper):
    torch.manual_seed(0)
    model, h, x = _PostNorm(pre_norm=True).eval(), torch.randn(1, 10, 64), torch.randn(1, 10, 48)
    assert _fused_calls(model, h, x, cpp_wrapper=cpp_wrapper) == (0, 1)


@pytest.mark.parametrize("cpp_wrapper", [True, False], ids=["cpp-wrapper", "python-wrapper"])
@pytest.mark.parametrize("norm", ["llama", "t5"])
def test_a_pre_rms_norm_stream_normalizes_inside_the_gemm(kiln_wherever_offered, cpp_wrapper, norm):
    torch.manual_seed(0)
    model, h, x = _PreRmsNorm(norm).eval(), torch.randn(1, 10, 64), torch.randn(1, 10, 48) + 3.0
    assert _fused_calls(model, h, x, cpp_wrapper=cpp_wrapper, rms=True) == (0, 1)


def test_an_rms_norm_of_a_sum_read_only_by_it_is_fused_without_the_sum(kiln_wherever_offered):
    class Block(_PreRmsNorm):
        def forward(self, h, x):
            return self.up(self.norm(x + self.o(h)))

    torch.manual_seed(0)
    assert _fused_calls(Block().eval(), torch.randn(1, 10, 64), torch.randn(1, 10, 48), rms=True) == (1, 0)


def test_a_bfloat16_sublayer_is_left_alone(kiln_wherever_offered):
    torch.manual_seed(0)
    model = _PostNorm().eval().to(torch.bfloat16)
    inputs = torch.randn(1, 10, 64, dtype=torch.bfloat16), torch.randn(1, 10, 48, dtype=torch.bfloat16)
    graphs = compiled_graphs(model, *inputs, tolerance=2e-2)
    assert not any("layer_norm" in str(s.op) for g in graphs for s in g.schedule.externs)


def test_a_product_of_another_implementation_is_left_alone(monkeypatch):
    pick = gemm.choose
    monkeypatch.setattr(gemm, "choose", lambda op, signature, candidates, *a, **k: "onednn" if "onednn" in candidates
                        else pick(op, signature, candidates, *a, **k))
    torch.manual_seed(0)
    assert _fused_calls(_PostNorm().eval(), torch.randn(1, 10, 64), torch.randn(1, 10, 48)) == (0, 0)
