"""A layer norm inside kiln's GEMM (kiln_gemm.h `layer_norm_rows`, kiln::mm_layer_norm,
passes/gemm_layer_norm.py): the kernel against a float64 layer norm of a float64 product on
ragged shapes and K blocks, with and without each of the GEMM's bias, the residual, the norm's
weight and bias, normalized in place or beside the kept sum; the operators bit-equal to
the kernel called directly; the pass fusing a post-norm block's sublayer output (kiln::mm_layer_norm) and a
pre-norm block's, whose sum is read again (kiln::mm_add_layer_norm), and nothing else (a
product another GEMM implementation computes); compiled blocks through both
wrappers. The same for an RMS norm (T5's and Llama's) with `rms=True`, and for a softmax or
log-softmax over the product's rows (kiln::mm_softmax: a classifier's probabilities), and in
bfloat16 (the rows normalized from their float32 sum, written as bfloat16)."""

import ctypes
import itertools

import pytest
import torch
import torch.nn.functional as F

from kiln.autotune import gemm
from benchmarks import kernels
from kiln.externs import native_ops
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


@pytest.mark.parametrize("shape", [*SHAPES, (128, 3072, 768), (1, 769, 1000)], ids=lambda s: "x".join(map(str, s)))
def test_the_normalized_rows_match_a_float64_layer_norm(shape):
    m, k, n = shape
    a, b, bias, residual = _operands(m, k, n, torch.float32, seed=m + k + n)
    g = torch.Generator().manual_seed(n)
    weight, norm_bias = torch.randn(n, generator=g), torch.randn(n, generator=g)
    panels = kernels.pack(b)
    for use_bias, use_residual, use_weight, use_norm_bias in itertools.product((False, True), repeat=4):
        args = (bias if use_bias else None, residual if use_residual else None, weight if use_weight else None,
                norm_bias if use_norm_bias else None)
        out = kernels.mm(a, panels, n, args[0], residual=args[1], row_norm=(args[2], args[3], 1e-5))
        torch.testing.assert_close(out.double(), _reference(a, b, *args, 1e-5), rtol=1e-4, atol=1e-4)
    # Beside the sum, which C keeps: rows of the normalized output further apart than N.
    normed = torch.full((m, n + 3), float("nan"))[:, :n]
    total = kernels.mm(a, panels, n, bias, residual=residual, row_norm=(weight, norm_bias, 1e-5, normed))
    _check(total, _reference(a, b, bias, residual, None, None, None), torch.float32, k)
    torch.testing.assert_close(normed.double(), _reference(a, b, bias, residual, weight, norm_bias, 1e-5),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [*SHAPES, (128, 2048, 512), (1, 2048, 768)], ids=lambda s: "x".join(map(str, s)))
def test_rms_normalized_rows_match_a_float64_rms_norm(shape):
    m, k, n = shape
    a, b, bias, residual = _operands(m, k, n, torch.float32, seed=m + k + n + 1)
    weight = torch.randn(n, generator=torch.Generator().manual_seed(n))
    panels = kernels.pack(b)
    for use_bias, use_residual, use_weight in itertools.product((False, True), repeat=3):
        args = (bias if use_bias else None, residual if use_residual else None, weight if use_weight else None)
        rms = kernels.RowNorm(args[2], None, 1e-6, kind="rms_norm")
        out = kernels.mm(a, panels, n, args[0], residual=args[1], row_norm=rms)
        torch.testing.assert_close(out.double(), _reference(a, b, *args, None, 1e-6, rms=True), rtol=1e-4, atol=1e-4)
    normed = torch.full((m, n + 3), float("nan"))[:, :n]
    beside = kernels.RowNorm(weight, None, 1e-6, normed, "rms_norm")
    total = kernels.mm(a, panels, n, None, residual=residual, row_norm=beside)
    _check(total, _reference(a, b, None, residual, None, None, None), torch.float32, k)
    torch.testing.assert_close(normed.double(), _reference(a, b, None, residual, weight, None, 1e-6, rms=True),
                               rtol=1e-4, atol=1e-4)
    # Not a layer norm: rows with a mean far from zero tell the two apart.
    shifted = kernels.mm(a, panels, n, bias + 5.0, row_norm=kernels.RowNorm(None, None, 1e-6, kind="rms_norm"))
    assert not torch.allclose(shifted, kernels.mm(a, panels, n, bias + 5.0, row_norm=(None, None, 1e-6)), atol=1e-2)


def test_an_rms_norm_takes_no_bias():
    a, b, _, _ = _operands(4, 8, 16, torch.float32, seed=0)
    with pytest.raises(RuntimeError, match="RMS norm takes no bias"):
        kernels.mm(a, kernels.pack(b), 16, row_norm=kernels.RowNorm(None, torch.zeros(16), 1e-5, kind="rms_norm"))
    with pytest.raises(RuntimeError, match="RMS norm takes no norm_bias"):
        native_ops.direct("mm_layer_norm")(a, b, None, None, None, torch.zeros(16), 1e-5, rms=True)


def test_k_blocks_finish_before_the_rows_are_normalized():
    a, b, bias, residual = _operands(33, 70, 29, torch.float32, seed=3)
    panels = kernels.pack(b)
    want = kernels.mm(a, panels, 29, bias, residual=residual, row_norm=(None, None, 1e-6))
    torch.testing.assert_close(want.double(), _reference(a, b, bias, residual, None, None, 1e-6), rtol=1e-4, atol=1e-4)
    # K = 70 is one block at the default K_BLOCK; called directly, cut in blocks of 16.
    out = torch.empty(33, 29)
    post = kernels._with_row_norm(kernels.epilogue(bias, "none", (), None, residual, torch.float32), torch.float32,
                                      None, None, 1e-6)
    kernels.library().kiln_gemm_f32(33, 29, 70, a.data_ptr(), a.stride(0), panels.data_ptr(),
                                      out.data_ptr(), 29, ctypes.byref(post), 16)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def _row_reference(a, b, bias, residual, norm: kernels.RowNorm):
    """The float64 `norm` of a @ b + bias + residual, as kernels.mm's `row_norm` names it."""
    if norm.kind in ("softmax", "log_softmax"):
        return _softmax_reference(a, b, bias, residual, norm.kind == "log_softmax")
    return _reference(a, b, bias, residual, norm.weight, norm.bias, norm.eps, rms=norm.kind == "rms_norm")


@pytest.mark.parametrize("shape", [(1, 1, 1), (17, 33, 49), (9, 385, 50), (64, 1000, 130), (128, 768, 768)],
                         ids=lambda s: "x".join(map(str, s)))
def test_bfloat16_rows_are_normalized_from_their_float32_sum(shape):
    m, k, n = shape
    a, b, bias, residual = _operands(m, k, n, torch.bfloat16, seed=m + k + n + 3)
    a = (a.float() * k ** -0.5).bfloat16()  # sums of unit size: a softmax spread over the row
    g = torch.Generator().manual_seed(n)
    weight, norm_bias = torch.randn(n, generator=g).bfloat16(), torch.randn(n, generator=g).bfloat16()
    panels = kernels.pack(b)
    norms = [kernels.RowNorm(weight, norm_bias, 1e-5), kernels.RowNorm(None, None, 1e-5),
             kernels.RowNorm(weight, None, 1e-6, kind="rms_norm"), kernels.RowNorm.softmax(),
             kernels.RowNorm.softmax(log=True)]
    for norm, use_bias, use_residual in itertools.product(norms, (False, True), (False, True)):
        args = (bias if use_bias else None, residual if use_residual else None)
        out = kernels.mm(a, panels, n, args[0], residual=args[1], row_norm=norm)
        assert out.dtype == torch.bfloat16 and out.shape == (m, n)
        # bfloat16's 8 bits: the result rounded once (from a float32 sum; eager rounds the sum too).
        torch.testing.assert_close(out.double(), _row_reference(a, b, *args, norm), rtol=1e-2, atol=1e-2)
    # Beside the sum, which C keeps in float32; the norm into a bfloat16 tensor.
    normed = torch.full((m, n + 3), float("nan"), dtype=torch.bfloat16)[:, :n]
    total = kernels.mm(a, panels, n, bias, residual=residual, out_dtype=torch.float32,
                         row_norm=kernels.RowNorm(weight, norm_bias, 1e-5, normed))
    assert total.dtype == torch.float32
    _check(total, _reference(a, b, bias, residual, None, None, None), torch.float32, k)
    torch.testing.assert_close(normed.double(), _reference(a, b, bias, residual, weight, norm_bias, 1e-5),
                               rtol=1e-2, atol=1e-2)


def test_a_bfloat16_sum_kept_beside_its_norm_is_the_float32_sum_rounded():
    a, b, bias, residual = _operands(37, 200, 70, torch.bfloat16, seed=7)
    panels = kernels.pack(b)
    as_float32, normed = torch.empty(37, 70, dtype=torch.bfloat16), torch.empty(37, 70, dtype=torch.bfloat16)
    total = kernels.mm(a, panels, 70, bias, residual=residual, out_dtype=torch.float32,
                         row_norm=kernels.RowNorm(None, None, 1e-5, as_float32))
    kept = kernels.mm(a, panels, 70, bias, residual=residual, row_norm=kernels.RowNorm(None, None, 1e-5, normed))
    assert kept.dtype == torch.bfloat16
    torch.testing.assert_close(kept, total.bfloat16(), rtol=0, atol=0)
    torch.testing.assert_close(normed, as_float32, rtol=0, atol=0)


def _kernel_row_norm(a, b, bias, residual, weight, norm_bias, eps, rms=False, keep_sum=False):
    """kiln's GEMM with a layer or RMS norm, the kernel called directly (benchmarks/kernels.py: its
    epilogue made in Python): the operators must give the same bits. `keep_sum`: (the sum, its norm)."""
    normed = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype) if keep_sum else None
    norm = kernels.RowNorm(weight, norm_bias, eps, normed, "rms_norm" if rms else "layer_norm")
    out = kernels.mm(a, kernels.pack(b), b.shape[1], bias, residual=residual, row_norm=norm)
    return (out, normed) if keep_sum else out


def _kernel_softmax(a, b, bias, residual, log=False):
    return kernels.mm(a, kernels.pack(b), b.shape[1], bias, residual=residual, row_norm=kernels.RowNorm.softmax(log))


def test_the_operators_and_the_kernel_called_directly_agree():
    a, b, bias, residual = _operands(50, 96, 100, torch.float32, seed=1)
    weight, norm_bias = torch.randn(100), torch.randn(100)
    for args in [(bias, residual, weight, norm_bias), (None, None, None, None), (bias, None, weight, None)]:
        want = _kernel_row_norm(a, b, *args, 1e-12)
        torch.testing.assert_close(native_ops.direct("mm_layer_norm")(a, b, *args, 1e-12), want, rtol=0, atol=0)
        kept, normed = _kernel_row_norm(a, b, *args, 1e-12, keep_sum=True)
        torch.testing.assert_close(normed, want, rtol=0, atol=0)
        for got, expected in zip(native_ops.direct("mm_add_layer_norm")(a, b, *args, 1e-12), (kept, normed)):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
    for args in [(bias, residual, weight, None), (None, residual, None, None)]:
        want = _kernel_row_norm(a, b, *args, 1e-6, rms=True)
        torch.testing.assert_close(want.double(), _reference(a, b, *args, 1e-6, rms=True), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(native_ops.direct("mm_layer_norm")(a, b, *args, 1e-6, rms=True), want, rtol=0, atol=0)
        kept, normed = _kernel_row_norm(a, b, *args, 1e-6, rms=True, keep_sum=True)
        torch.testing.assert_close(normed, want, rtol=0, atol=0)
        for got, expected in zip(native_ops.direct("mm_add_layer_norm")(a, b, *args, 1e-6, rms=True), (kept, normed)):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_the_operators_and_the_kernel_called_directly_agree_in_bfloat16():
    a, b, bias, residual = _operands(50, 96, 100, torch.bfloat16, seed=6)
    a = (a.float() * 0.1).bfloat16()
    weight, norm_bias = torch.randn(100).bfloat16(), torch.randn(100).bfloat16()
    for args, rms in [((bias, residual, weight, norm_bias), False), ((None, residual, weight, None), True)]:
        want = _kernel_row_norm(a, b, *args, 1e-5, rms=rms)
        assert want.dtype == torch.bfloat16
        torch.testing.assert_close(native_ops.direct("mm_layer_norm")(a, b, *args, 1e-5, rms=rms), want, rtol=0, atol=0)
        kept, normed = _kernel_row_norm(a, b, *args, 1e-5, rms=rms, keep_sum=True)
        assert kept.dtype == normed.dtype == torch.bfloat16
        torch.testing.assert_close(normed, want, rtol=0, atol=0)
        torch.testing.assert_close(kept.double(), _reference(a, b, *args[:2], None, None, None), rtol=1e-2, atol=1e-2)
        for got, expected in zip(native_ops.direct("mm_add_layer_norm")(a, b, *args, 1e-5, rms=rms), (kept, normed)):
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
    for log in (False, True):
        want = _kernel_softmax(a, b, bias, residual, log=log)
        torch.testing.assert_close(native_ops.direct("mm_softmax")(a, b, bias, residual, log=log), want, rtol=0, atol=0)


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


def _fused_calls(model, *inputs, cpp_wrapper=True, rms=False, tolerance=1e-4):
    steps = [s for g in compiled_graphs(model, *inputs, cpp_wrapper=cpp_wrapper, tolerance=tolerance)
             for s in g.schedule.externs]
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


@pytest.mark.parametrize("cpp_wrapper", [True, False], ids=["cpp-wrapper", "python-wrapper"])
@pytest.mark.parametrize("norm", ["llama", "t5"])
def test_a_bfloat16_rms_norm_is_taken_with_its_casts(kiln_wherever_offered, cpp_wrapper, norm):
    # HF's norms in bfloat16 compute in float32 and cast back: Llama squares and scales x's float32
    # copy; T5 squares the copy and scales x itself (promoted to float32).
    torch.manual_seed(0)
    model = _PreRmsNorm(norm).eval().bfloat16()
    h, x = torch.randn(1, 10, 64).bfloat16(), (torch.randn(1, 10, 48) + 3.0).bfloat16()
    assert _fused_calls(model, h, x, cpp_wrapper=cpp_wrapper, rms=True, tolerance=2e-2) == (0, 1)


def test_an_rms_norm_of_a_sum_read_only_by_it_is_fused_without_the_sum(kiln_wherever_offered):
    class Block(_PreRmsNorm):
        def forward(self, h, x):
            return self.up(self.norm(x + self.o(h)))

    torch.manual_seed(0)
    assert _fused_calls(Block().eval(), torch.randn(1, 10, 64), torch.randn(1, 10, 48), rms=True) == (1, 0)


@pytest.mark.parametrize("cpp_wrapper", [True, False], ids=["cpp-wrapper", "python-wrapper"])
@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-norm", "pre-norm"])
def test_a_bfloat16_sublayer_normalizes_inside_the_gemm(kiln_wherever_offered, cpp_wrapper, pre_norm):
    torch.manual_seed(0)
    model = _PostNorm(pre_norm).eval().to(torch.bfloat16)
    inputs = torch.randn(1, 10, 64, dtype=torch.bfloat16), torch.randn(1, 10, 48, dtype=torch.bfloat16)
    steps = [s for g in compiled_graphs(model, *inputs, cpp_wrapper=cpp_wrapper, tolerance=2e-2)
             for s in g.schedule.externs]
    fused = torch.ops.kiln.mm_add_layer_norm.default if pre_norm else torch.ops.kiln.mm_layer_norm.default
    assert [s.op for s in steps if "layer_norm" in str(s.op)] == [fused]


def test_a_product_of_another_implementation_is_left_alone(monkeypatch):
    pick = gemm.choose
    monkeypatch.setattr(gemm, "choose", lambda op, signature, candidates, *a, **k: "onednn" if "onednn" in candidates
                        else pick(op, signature, candidates, *a, **k))
    torch.manual_seed(0)
    assert _fused_calls(_PostNorm().eval(), torch.randn(1, 10, 64), torch.randn(1, 10, 48)) == (0, 0)


def _softmax_reference(a, b, bias, residual, log):
    y = _reference(a, b, bias, residual, None, None, None)
    return y.log_softmax(-1) if log else y.softmax(-1)


@pytest.mark.parametrize("shape", [*SHAPES, (1, 768, 1000), (128, 512, 4)], ids=lambda s: "x".join(map(str, s)))
def test_softmax_rows_match_a_float64_softmax(shape):
    m, k, n = shape
    a, b, bias, residual = _operands(m, k, n, torch.float32, seed=m + k + n + 2)
    a = a * k ** -0.5  # logits of unit size: probabilities spread over the row, not one-hot
    panels = kernels.pack(b)
    for log, use_bias, use_residual in itertools.product((False, True), repeat=3):
        args = (bias if use_bias else None, residual if use_residual else None)
        out = kernels.mm(a, panels, n, args[0], residual=args[1], row_norm=kernels.RowNorm.softmax(log))
        torch.testing.assert_close(out.double(), _softmax_reference(a, b, *args, log), rtol=1e-4, atol=1e-5)
    # Beside the sum, which C keeps.
    normed = torch.full((m, n + 3), float("nan"))[:, :n]
    total = kernels.mm(a, panels, n, bias, residual=residual, row_norm=kernels.RowNorm.softmax(out=normed))
    _check(total, _reference(a, b, bias, residual, None, None, None), torch.float32, k)
    torch.testing.assert_close(normed.double(), _softmax_reference(a, b, bias, residual, False), rtol=1e-4, atol=1e-5)


def test_softmax_takes_the_row_max_out_before_the_exponentials():
    # Logits near 100: exp overflows float32 (e^88.7) unless the row's max is taken out first.
    a, b, bias, _ = _operands(20, 64, 37, torch.float32, seed=5)
    a = a * 0.125
    for log in (False, True):
        out = kernels.mm(a, kernels.pack(b), 37, bias + 100.0, row_norm=kernels.RowNorm.softmax(log))
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out.double(), _softmax_reference(a, b, bias + 100.0, None, log), rtol=1e-4, atol=1e-5)


def test_a_softmax_takes_no_weight_or_bias():
    a, b, _, _ = _operands(4, 8, 16, torch.float32, seed=0)
    with pytest.raises(RuntimeError, match="softmax takes no weight or bias"):
        kernels.mm(a, kernels.pack(b), 16, row_norm=kernels.RowNorm(torch.ones(16), None, 0.0, kind="softmax"))
    with pytest.raises(ValueError, match="'sparsemax', not one of"):
        kernels.mm(a, kernels.pack(b), 16, row_norm=kernels.RowNorm(None, None, 0.0, kind="sparsemax"))


def test_the_softmax_operator_and_the_kernel_called_directly_agree():
    a, b, bias, residual = _operands(50, 96, 100, torch.float32, seed=4)
    a = a * 0.1
    for log, args in itertools.product((False, True), [(bias, residual), (None, None), (bias, None)]):
        want = _kernel_softmax(a, b, *args, log=log)
        torch.testing.assert_close(want.double(), _softmax_reference(a, b, *args, log), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(native_ops.direct("mm_softmax")(a, b, *args, log=log), want, rtol=0, atol=0)


class _Classifier(torch.nn.Module):
    """A classification head's probabilities (or log-probabilities, as a CTC head's): softmax over
    the logits of a linear layer, through a view of its 2-d product."""

    def __init__(self, log: bool = False, heads: int = 1):
        super().__init__()
        self.head, self.log, self.heads = torch.nn.Linear(64, 48), log, heads

    def forward(self, h):
        logits = self.head(h)
        logits = logits.unflatten(-1, (self.heads, -1)) if self.heads > 1 else logits
        return F.log_softmax(logits, dim=-1) if self.log else F.softmax(logits, dim=-1)


def _softmax_calls(model, *inputs, cpp_wrapper=True) -> list[bool]:
    """The `log` flag of each kiln::mm_softmax the compiled graphs call."""
    steps = [s for g in compiled_graphs(model, *inputs, cpp_wrapper=cpp_wrapper) for s in g.schedule.externs]
    return [bool(s.kwargs.get("log", False)) for s in steps if s.op is torch.ops.kiln.mm_softmax.default]


@pytest.mark.parametrize("cpp_wrapper", [True, False], ids=["cpp-wrapper", "python-wrapper"])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_a_classifiers_softmax_runs_inside_the_gemm(kiln_wherever_offered, cpp_wrapper, log):
    torch.manual_seed(0)
    assert _softmax_calls(_Classifier(log).eval(), torch.randn(2, 10, 64), cpp_wrapper=cpp_wrapper) == [log]


def test_a_bfloat16_classifiers_softmax_runs_inside_the_gemm(kiln_wherever_offered):
    torch.manual_seed(0)
    model, h = _Classifier().eval().to(torch.bfloat16), torch.randn(2, 10, 64, dtype=torch.bfloat16)
    steps = [s for g in compiled_graphs(model, h, tolerance=2e-2) for s in g.schedule.externs]
    assert [s.op for s in steps if s.op is torch.ops.kiln.mm_softmax.default] == [torch.ops.kiln.mm_softmax.default]


def test_a_softmax_over_part_of_a_row_is_left_alone(kiln_wherever_offered):
    # [20, 48] seen as [20, 4, 12]: the softmax's rows are not the GEMM's.
    torch.manual_seed(0)
    assert _softmax_calls(_Classifier(heads=4).eval(), torch.randn(2, 10, 64)) == []


def test_logits_read_again_are_left_alone(kiln_wherever_offered):
    class Both(_Classifier):
        def forward(self, h):
            logits = self.head(h)
            return logits.softmax(-1), logits

    torch.manual_seed(0)
    assert _softmax_calls(Both().eval(), torch.randn(2, 10, 64)) == []
