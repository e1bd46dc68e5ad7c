"""kiln's GEMM in bfloat16 fast math (kiln::mm's `kiln_bf16`, backend.fp32_gemm = bf16): float32
operands rounded to bfloat16 (the weight's panels once, A's copy at each call), float32 sums,
epilogue, row norms and output.

Against a float64 product of the bfloat16-rounded operands the only error left is float32
accumulation's, at most gamma_K * sum_k |a_k b_k| with gamma_K = K 2^-24 / (1 - K 2^-24): checked
element by element on ragged shapes (M below and past the register block, K odd and across K
blocks, N not a multiple of a panel, rows of A further apart than K). Against the float64 product
of the operands as they are, the rounding to 8 significant bits (u = 2^-8) adds at most
(2u + u^2) sum_k |a_k b_k|, and in practice, the roundings independent, an error whose rms is
0.60 u sqrt(sum_k (a_k b_k)^2) (each rounding's relative error has rms u sqrt(0.54 / 3) = 0.42 u
over mantissas spread log-uniformly; two per term): checked to lie between 0.4 u and 0.9 u of
that scale, far above float32's (~1e-4 u at these K), so bfloat16 math is what ran, and near the
estimate, so the bound is not loose (docs/gemm.md)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from benchmarks import kernels
from kiln.externs import native_ops
from kiln.native import libkiln
from tests.codegen.test_kiln_gemm import unary_reference, x86_kernels_built_with

U = 2.0 ** -8  # bfloat16's unit roundoff: 8 significant bits, rounded to nearest
# (M, K, N): M of 1, 7 and 33 rows (below, within and past the 8-row block), K odd (2049: three K
# blocks, the last of odd length), N not a multiple of a panel's 48 columns.
SHAPES = [(1, 33, 50), (7, 257, 100), (33, 1023, 97), (7, 2049, 20), (33, 129, 1)]


def _gamma(k: int) -> float:
    """float32 accumulation's worst relative error over a sum of k terms."""
    return k * 2.0 ** -24 / (1 - k * 2.0 ** -24)


def _rounded(t: torch.Tensor) -> torch.Tensor:
    return t.bfloat16().double()


def _operands(m, k, n, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k + 3, generator=g)[:, :k]  # (A's rows k + 3 apart)
    weight = torch.randn(n, k, generator=g)  # nn.Linear's [out, in]: the GEMM sees its transpose
    return a, weight.t(), torch.randn(n, generator=g)


def _mm(a, b, bias=None, unary="none", algorithm=None, impl="kiln_bf16"):
    return native_ops.direct("mm")(a, b, bias, unary, [], algorithm, impl)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_the_product_is_the_rounded_operands_product_summed_in_float32(shape):
    m, k, n = shape
    a, b, _ = _operands(m, k, n, seed=k)
    out = _mm(a, b)
    assert out.dtype == torch.float32 and out.shape == (m, n)
    exact_of_rounded = _rounded(a) @ _rounded(b)
    accumulation = _gamma(k) * (_rounded(a).abs() @ _rounded(b).abs())
    assert ((out.double() - exact_of_rounded).abs() <= accumulation).all()
    exact = a.double() @ b.double()
    rounding = (2 * U + U * U) * (a.double().abs() @ b.double().abs())
    assert ((out.double() - exact).abs() <= rounding + accumulation).all()


@pytest.mark.parametrize("shape", [(33, 1023, 97), (7, 2049, 20), (64, 4096, 64)], ids=lambda s: "x".join(map(str, s)))
def test_the_rounding_error_is_bfloat16s_not_float32s(shape):
    m, k, n = shape
    a, b, _ = _operands(m, k, n, seed=k)
    exact = a.double() @ b.double()
    scale = ((a.double() ** 2) @ (b.double() ** 2)).mean().sqrt()  # rms of sqrt(sum_k (a_k b_k)^2)
    rms = lambda y: ((y.double() - exact) ** 2).mean().sqrt() / scale  # noqa: E731
    assert 0.4 * U <= rms(_mm(a, b)) <= 0.9 * U
    assert rms(_mm(a, b, impl="kiln")) <= 1e-2 * U  # (float32: the same GEMM without the rounding)


@pytest.mark.parametrize("unary,algorithm", [("gelu", None), ("gelu", "tanh"), ("relu", None), ("swish", None)])
def test_the_epilogue_runs_in_float32_on_the_float32_sums(unary, algorithm):
    m, k, n = 33, 257, 100
    a, b, bias = _operands(m, k, n, seed=1)
    out = _mm(a, b, bias, unary, algorithm)
    assert out.dtype == torch.float32
    want = unary_reference(_rounded(a) @ _rounded(b) + bias.double(), unary, [], algorithm)
    # (the sum's accumulation error through an op of slope at most 1.13, and the op's own float32)
    tolerance = 1.2 * _gamma(k) * (_rounded(a).abs() @ _rounded(b).abs()) + 2.0 ** -20 * want.abs() + 1e-6
    assert ((out.double() - want).abs() <= tolerance).all()


def _norm_reference(y, kind, weight, norm_bias, eps):
    if kind == "layer_norm":
        return F.layer_norm(y, (y.shape[-1],), weight.double(), norm_bias.double(), eps)
    if kind == "rms_norm":
        return F.rms_norm(y, (y.shape[-1],), weight.double(), eps)
    return torch.softmax(y, -1) if kind == "softmax" else torch.log_softmax(y, -1)


# (a softmax's logits are never kept beside it: gemm_layer_norm.py)
@pytest.mark.parametrize("kind,keep_sum", [("layer_norm", False), ("layer_norm", True), ("rms_norm", False),
                                           ("rms_norm", True), ("softmax", False), ("log_softmax", False)])
@pytest.mark.parametrize("shape", [(1, 33, 50), (33, 2049, 97)], ids=lambda s: "x".join(map(str, s)))
def test_row_norms_of_a_bfloat16_math_product_stay_float32(kind, keep_sum, shape):
    """kiln_gemm.h's row pass normalizes C's float32 rows; with bfloat16 operands it had meant
    bfloat16 outputs (a bfloat16 model's), here every output is float32."""
    m, k, n = shape
    a, b, bias = _operands(m, k, n, seed=n)
    g = torch.Generator().manual_seed(2)
    residual, weight, norm_bias = torch.randn(m, n, generator=g), torch.rand(n, generator=g) + 0.5, torch.randn(n, generator=g)
    total = _rounded(a) @ _rounded(b) + bias.double() + residual.double()
    want = _norm_reference(total, kind, weight, norm_bias, 1e-5)
    if kind in ("softmax", "log_softmax"):
        outs = [native_ops.direct("mm_softmax")(a, b, bias, residual, log=kind == "log_softmax", impl="kiln_bf16")]
    else:
        name = "mm_add_layer_norm" if keep_sum else "mm_layer_norm"
        outs = native_ops.direct(name)(a, b, bias, residual, weight, None if kind == "rms_norm" else norm_bias, 1e-5,
                                       rms=kind == "rms_norm", impl="kiln_bf16")
        outs = list(outs) if keep_sum else [outs]
    assert all(out.dtype == torch.float32 for out in outs)
    torch.testing.assert_close(outs[-1].double(), want, rtol=1e-4, atol=1e-4)
    if keep_sum:
        torch.testing.assert_close(outs[0].double(), total, rtol=1e-5, atol=_gamma(k) * k ** 0.5 * 4)
    # ...and bfloat16 math ran: the unrounded operands' norm is much further away (bfloat16's error)
    unrounded = _norm_reference(a.double() @ b.double() + bias.double() + residual.double(), kind, weight, norm_bias, 1e-5)
    assert (outs[-1].double() - unrounded).abs().max() > 30 * (outs[-1].double() - want).abs().max()


def test_the_bfloat16_panels_are_a_pack_of_their_own():
    """The same weight used in float32 and in bfloat16 math holds both packs (its float32 panels
    and half as many bytes of bfloat16 ones), and each call reads its own."""
    m, k, n = 7, 96, 48
    a, b, _ = _operands(m, k, n, seed=3)
    weight = b.t().contiguous().t()  # (a weight of its own, packed by nobody yet)
    before = libkiln.packed_bytes(weight)
    full = _mm(a, weight, impl="kiln")
    fast = _mm(a, weight)
    assert libkiln.packed_bytes(weight) - before == k * n * 4 + k * n * 2
    torch.testing.assert_close(_mm(a, weight, impl="kiln"), full, rtol=0, atol=0)
    torch.testing.assert_close(_mm(a, weight), fast, rtol=0, atol=0)
    assert (full - fast).abs().max() > 1e-3


def test_bfloat16_operands_are_refused_in_bfloat16_math():
    a, b, _ = _operands(3, 8, 5, seed=4)
    with pytest.raises(RuntimeError, match="kiln_bf16.*float32 operands"):
        _mm(a.bfloat16(), b.bfloat16())


@pytest.mark.parametrize("flags", [[], ["-mno-avx512bf16"], ["-march=x86-64-v3"]], ids=["native", "avx512-no-bf16", "avx2"])
def test_bfloat16_operands_into_a_float32_c_on_every_isa(flags, tmp_path):
    """The header's part, on this machine's ISA (with avx512_bf16: the pairs instruction) and as
    CPUs without it build it (bfloat16 widened to float32 on load): bfloat16 A and panels, float32
    C, K cut into blocks whose partial sums C holds (a bfloat16 C never is)."""
    lib = x86_kernels_built_with(flags, tmp_path) if flags else kernels.library()
    for m, k, n in SHAPES:
        a, b, _ = _operands(m, k, n, seed=k)
        a16, b16 = a.bfloat16(), b.bfloat16()
        out = kernels.mm(a16, kernels.pack(b16, lib), n, out_dtype=torch.float32, lib=lib)
        assert out.dtype == torch.float32
        exact_of_rounded = a16.double() @ b16.double()
        assert ((out.double() - exact_of_rounded).abs() <= _gamma(k) * (a16.double().abs() @ b16.double().abs())).all()
