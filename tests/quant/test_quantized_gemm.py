"""kiln's GEMM over weight-only quantized weights (kiln/native/include/kiln_gemm_quant.h) against a
float64 product of the dequantized weight: ragged shapes, int8 and int4 at several group sizes,
every epilogue kiln's GEMM has (bias, unary post-ops, residual, row norms), both of its paths (a
few rows dequantized in registers; more through a buffer per panel block, with K blocks), and the
narrower ISAs built here."""

from __future__ import annotations

import ctypes

import pytest
import torch

from benchmarks import kernels
from kiln.quant.weights import dequantize, quantize_activations, quantize_int4, quantize_int8
from tests.codegen.test_kiln_gemm import EPILOGUES, x86_kernels_built_with
from tests.codegen.test_kiln_gemm import _reference as gemm_reference

# (M, K, N): M <= 4 takes the register path, more the buffer's; K odd (a half byte of int4 padding),
# K not a multiple of the group, K > 1024 (K blocks with partial sums in C); N with a ragged last
# panel of 1, 2 and 22 columns; at one row, 17 panels (int8 reads a thread's panels in runs of
# unequal length, kiln_gemm_quant.h `int8_row`) and 71 (the last two the threads' shared reserve,
# RESERVE_PARTS).
SHAPES = [(1, 7, 1), (1, 64, 50), (1, 133, 811), (1, 90, 3401), (2, 200, 97), (4, 129, 48), (5, 64, 70), (17, 333, 49),
          (9, 2500, 130), (64, 96, 200)]
KINDS = [(8, 0), (4, 32), (4, 64), (4, 128), (4, 2)]


def _quantized(n: int, k: int, bits: int, group: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    if bits == 8:
        q, s = quantize_int8(w)
        z = None
    else:
        q, s, z = quantize_int4(w, group)
    return q, s, z, dequantize(q, s, z, bits, group, k).double()


def _check(out: torch.Tensor, ref: torch.Tensor, k: int) -> None:
    # The dequantized weights are float32 values used exactly (eager's rounding); what is left is
    # float32 accumulation over K (see tests/codegen/test_kiln_gemm.py `_check`).
    err = ((out.double() - ref).abs() / (ref.abs() + 1)).max().item()
    assert err <= 1e-7 * k + 1e-6, err


def split_activations(a: torch.Tensor) -> torch.Tensor:
    """The activations as int4's bfloat16 path carries them (kiln_gemm_quant.h `direct_tile_bf16`):
    hi = bf16(a), lo = bf16(a - hi), hi + lo."""
    hi = a.to(torch.bfloat16).float()
    lo = (a - hi).to(torch.bfloat16).float()
    return hi.double() + lo.double()


# The groups of k over which int8 weights' digits path splits the activations (kiln_gemm_quant.h
# INT8_DIGIT_GROUP; int4's path splits them over the weight's groups).
INT8_DIGIT_GROUP = 256


def digits_of(a: torch.Tensor, group: int, digits: int) -> torch.Tensor:
    """The activations as the int8-digits path carries them (kiln_gemm_quant.h `split_group`): per
    row and group, `digits` int8 digits, each the rounded remainder of the last. Two: scales 2^e and
    2^(e - 8), 2^e the least power of two with the group's largest |a| at most 127 steps, the second
    digit clamped to 127; three: 2^e, 2^(e - 7), 2^(e - 14), 2^(e + 6) the power of two above the
    group's largest |a|."""
    k = a.shape[-1]
    groups = -(-k // group)
    g = torch.nn.functional.pad(a.double(), (0, groups * group - k)).unflatten(-1, (groups, group))
    largest = g.abs().amax(-1, keepdim=True).float()
    top = torch.frexp(largest)[1].double()
    if digits == 2:
        e = top - 7 + (largest.double() > 127.0 * torch.pow(2.0, top - 7)).double()
    else:
        e = top - 6
    e, bits = e.clamp(min=-100), 8 if digits == 2 else 7
    rest, carried = g.clone(), torch.zeros_like(g)
    for d in range(digits):
        step = torch.pow(2.0, e - bits * d)
        level = torch.round(rest / step).clamp(-127, 127)
        carried += level * step
        rest -= level * step
    return carried.flatten(-2)[..., :k]


def _carried(a: torch.Tensor, bits: int, m: int, group: int, lib=None, path: str | None = None) -> torch.Tensor:
    """`a` as `path` (else the one kiln's GEMM, built for this CPU or `lib`, takes) carries it: at
    most 4 rows int4 runs the fastest of its paths the build has (`int4_fastest_path`, groups of a
    multiple of 8), int8 the digits where the build's dot4 is one instruction; both at 4 rows on
    AMX's integer tiles where the CPU has them (the digits' own values: the same bits)."""
    path = path or (kernels.quant_path(bits, m, 64, 64, group, lib) if m <= 4 else "float32")
    if path == "int8_digits" or (path == "amx" and m <= 4):
        return digits_of(a, INT8_DIGIT_GROUP if bits == 8 else group, kernels.quant_digits(bits, lib))
    return split_activations(a) if path == "bf16_pairs" else a


def _bf16_parts(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (float32 values) as two bfloat16 parts, its rounding and the rounding of what is left."""
    x = x.float()
    high = x.bfloat16().float()
    return high.double(), (x - high).bfloat16().double()


def _operands(a: torch.Tensor, w: torch.Tensor, bits: int, m: int, group: int, lib=None):
    """(a', w') whose float64 product a' @ w'ᵀ is kiln's product of `m` rows but for float32's
    summation: the activations as `_carried`, the weight's values; where int4's rows run on AMX by
    default (kiln_gemm_quant.h `QuantSplitPanels`: `quant_path` "amx") a and w each in two bfloat16
    parts, a1 w1 + a2 w1 + a1 w2: three blocks of K."""
    if bits == 4 and m > 4 and kernels.quant_path(4, m, a.shape[-1], w.shape[0], group, lib) == "amx":
        (a1, a2), (w1, w2) = _bf16_parts(a), _bf16_parts(w)
        return torch.cat([a1, a2, a1], -1), torch.cat([w1, w1, w2], -1)
    return _carried(a, bits, m, group, lib), w


def _on_huge_pages(*args, **kwargs) -> torch.Tensor:
    """kernels.mm_quant(*args, **kwargs) read as over panels on 2 MB pages (kiln_gemm_set_huge_page_packs)."""
    kernels.library().kiln_gemm_set_huge_page_packs(1)
    try:
        return kernels.mm_quant(*args, **kwargs)
    finally:
        kernels.library().kiln_gemm_set_huge_page_packs(0)


def test_the_carried_activations_are_within_their_bounds():
    a = torch.randn(10000) * torch.logspace(-20, 20, 10000)
    assert ((split_activations(a) - a.double()).abs() <= 2.0 ** -16 * a.double().abs()).all()
    rows = torch.randn(3, 1000, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 3, 1000)
    rows[0, :8] = torch.tensor([127.0, 2.5, -2.5, 126.5, 0.75, 1.5, -127.0, 3.0])  # ties of the first digit's rounding
    rows[1, :8] = 127.5  # above 127 steps of 2^0: the first digit's step 2^1
    for group in (8, 64, 128):
        largest = torch.nn.functional.pad(rows.abs(), (0, -1000 % group)).unflatten(-1, (-1, group)).amax(-1)
        largest = largest.repeat_interleave(group, -1)[:, :1000].double()
        for digits, bound in [(2, 2.0 ** -13.9), (3, 2.0 ** -20)]:
            error = (digits_of(rows, group, digits) - rows.double()).abs()
            assert (error <= bound * largest).all(), digits
            # Two digits: each within 2^(e - 8) of its value, e the first digit's step (under 2^-14 of the largest)
            assert digits == 3 or (error > 2.0 ** -16 * largest).any(), "two digits finer than their steps"


def _reference(a, w, bias, unary, scalars, algorithm, residual):
    """The float64 epilogue(a @ wᵀ) of a dequantized weight w [N, K] (kiln's GEMM test's reference)."""
    return gemm_reference(a, w.t(), bias, unary, scalars, algorithm, residual)


@pytest.mark.parametrize("bits,group", KINDS, ids=lambda v: str(v))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_epilogue_matches_a_float64_product_of_the_dequantized_weight(shape, bits, group):
    m, k, n = shape
    q, s, z, w = _quantized(n, k, bits, group, seed=m + k + n)
    packed = kernels.quant_pack(q, s, z, bits, group, k)
    g = torch.Generator().manual_seed(k)
    a, bias, residual = torch.randn(m, k, generator=g), torch.randn(n, generator=g), torch.randn(m, n, generator=g)
    # int4's bfloat16 path products its activations' two-bfloat16 split exactly (the rest as float32 does).
    carried, ws = _operands(a, w, bits, m, group)
    for unary, scalars, algorithm in EPILOGUES:
        for b, r in [(None, None), (bias, None), (bias, residual)]:
            out = kernels.mm_quant(a, packed, n, bits, group, b, unary, scalars, r, algorithm)
            _check(out, _reference(carried, ws, b, unary, scalars, algorithm, r), carried.shape[-1])


@pytest.mark.parametrize("bits,group", [(4, 64), (8, 0)], ids=["int4", "int8"])
@pytest.mark.parametrize("m", [1, 3, 12])
@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm", "softmax", "log_softmax"])
def test_row_norms_after_the_quantized_product(m, kind, bits, group):
    k, n = 300, 1000
    q, s, z, w = _quantized(n, k, bits, group, seed=m)
    packed = kernels.quant_pack(q, s, z, bits, group, k)
    g = torch.Generator().manual_seed(m)
    a, bias, residual = torch.randn(m, k, generator=g), torch.randn(n, generator=g), torch.randn(m, n, generator=g)
    weight, beta = torch.rand(n, generator=g) + 0.5, torch.randn(n, generator=g)
    norm_weight, norm_bias = (None, None) if "softmax" in kind else (weight, None if kind == "rms_norm" else beta)
    out = kernels.mm_quant(a, packed, n, bits, group, bias, "none", (), residual,
                           row_norm=kernels.RowNorm(norm_weight, norm_bias, 1e-5, None, kind))
    y = _reference(_carried(a, bits, m, group), w, bias, "none", (), None, residual)
    if kind == "layer_norm":
        ref = torch.nn.functional.layer_norm(y, [n], weight.double(), beta.double(), 1e-5)
    elif kind == "rms_norm":
        ref = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.double()
    else:
        ref = torch.log_softmax(y, -1) if kind == "log_softmax" else torch.softmax(y, -1)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


# (M, K, N) of a prompt's products on AMX: M past DIRECT_ROWS and not a multiple of AMX's 32 rows
# (a last block of at most 16), K odd and not a multiple of 32 (a zero high half, a zero-padded
# last step), ragged last panels of 1, 22 and 32 columns; the rows where int8 (16) and int4 (32)
# take AMX by default, and one fewer.
AMX_SHAPES = [(5, 64, 50), (33, 333, 130), (70, 2500, 97), (40, 65, 49), (130, 896, 1000), (17, 129, 22),
              (15, 96, 61), (16, 96, 61), (31, 200, 70), (32, 200, 70)]


@pytest.mark.parametrize("bits,group", KINDS, ids=lambda v: str(v))
@pytest.mark.parametrize("product", [2, 0], ids=["amx", "vdpbf16ps"])
def test_a_prompt_s_products_on_amx(product, bits, group):
    """A prompt's rows where AMX is the bfloat16 product (forced here; kiln_gemm_quant.h
    `gemm_quant_amx`). By default int8 from 16 rows: its levels (exact in bfloat16) times A in
    three bfloat16 parts (exactly A), then its scales; int4 from 32: each weight and A in two
    bfloat16 parts, a1 w1 + a2 w1 + a1 w2 (`_operands`). In bfloat16 fast math (kiln::mm_quant's
    impl "kiln_bf16") from 5 rows: A rounded to bfloat16, int8's levels, int4's weights dequantized
    and rounded. Each against a float64 product of exactly those values, every epilogue and an RMS
    norm, within float32's accumulation bound (a product that skipped a rounding or a part, 1e-2
    or 2^-9 off, would fail). Where AMX is not the product or not on the CPU, and at 4 rows or
    fewer, the float32 products, fast math's bits the default's."""
    lib = kernels.library()
    lib.kiln_gemm_bf16_force_product(product)
    try:
        on_amx = bool(lib.kiln_gemm_bf16_amx()) and product == 2
        for m, k, n in AMX_SHAPES + [(1, 333, 130), (4, 65, 49)]:
            fast_amx = on_amx and m > 4
            path = kernels.quant_path(bits, m, k, n, group)
            few_amx = m == 4 and (bits == 8 or group % 64 == 0) and _amx_few_rows(lib)  # (integer tiles: any product)
            assert (path == "amx") == (on_amx and m >= (16 if bits == 8 else 32) or few_amx), (m, path)
            assert m <= 4 or path in ("amx", "float32")
            q, s, z, w = _quantized(n, k, bits, group, seed=m + k)
            packed = kernels.quant_pack(q, s, z, bits, group, k)
            g = torch.Generator().manual_seed(n)
            a, bias, residual = torch.randn(m, k, generator=g), torch.randn(n, generator=g), torch.randn(m, n, generator=g)
            carried, ws = _operands(a, w, bits, m, group)
            fast_w = w.float().bfloat16().double() if bits == 4 else w  # (int8's levels and scales stay exact)
            for unary, scalars, algorithm in EPILOGUES[:5]:
                exact = kernels.mm_quant(a, packed, n, bits, group, bias, unary, scalars, residual, algorithm)
                _check(exact, _reference(carried, ws, bias, unary, scalars, algorithm, residual), carried.shape[-1])
                fast = kernels.mm_quant(a, packed, n, bits, group, bias, unary, scalars, residual, algorithm,
                                        bf16_math=True)
                if fast_amx:
                    _check(fast, _reference(a.bfloat16().double(), fast_w, bias, unary, scalars, algorithm, residual), k)
                else:
                    assert torch.equal(fast, exact)
            if fast_amx:
                weight = torch.rand(n, generator=g) + 0.5
                for bf16_math, rows, weights in [(False, carried, ws), (True, a.bfloat16().double(), fast_w)]:
                    out = kernels.mm_quant(a, packed, n, bits, group, bias, "none", (), residual, bf16_math=bf16_math,
                                           row_norm=kernels.RowNorm(weight, None, 1e-5, None, "rms_norm"))
                    y = _reference(rows, weights, bias, "none", (), None, residual)
                    ref = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.double()
                    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    finally:
        lib.kiln_gemm_bf16_force_product(-1)


@pytest.mark.parametrize("bits,group", KINDS, ids=lambda v: str(v))
@pytest.mark.parametrize("product", [2, 0], ids=["amx", "vdpbf16ps"])
def test_a_bfloat16_model_s_rows(product, bits, group):
    """bfloat16 activations, C bfloat16 (a bfloat16 model's quantized layers: kiln_gemm_quant.h
    `gemm_quant_bf16_rows`): a prompt's rows on AMX where it is the product (forced here), A as it
    is, int4's weights rounded to bfloat16 as eager's reference rounds them; else A widened to
    float32 for the float32 products (at 4 rows or fewer the path's carried activations). Against
    float64 products of those values, a bfloat16 bias and residual, every epilogue: within C's
    rounding to bfloat16 (2^-8 relative) and float32's bound."""
    lib = kernels.library()
    lib.kiln_gemm_bf16_force_product(product)
    try:
        for m, k, n in AMX_SHAPES + [(1, 333, 130), (4, 65, 49)]:
            amx = bool(lib.kiln_gemm_bf16_amx()) and product == 2 and m > 4
            q, s, z, w = _quantized(n, k, bits, group, seed=m + k)
            packed = kernels.quant_pack(q, s, z, bits, group, k)
            g = torch.Generator().manual_seed(n)
            a, bias, residual = (torch.randn(m, k, generator=g).bfloat16(), torch.randn(n, generator=g).bfloat16(),
                                 torch.randn(m, n, generator=g).bfloat16())
            ws = w.float().bfloat16().double() if amx and bits == 4 else w
            carried = a.double() if amx or m > 4 else _carried(a.float(), bits, m, group)
            for unary, scalars, algorithm in EPILOGUES[:5]:
                out = kernels.mm_quant(a, packed, n, bits, group, bias, unary, scalars, residual, algorithm)
                assert out.dtype == torch.bfloat16
                ref = _reference(carried, ws, bias, unary, scalars, algorithm, residual)
                err = ((out.double() - ref).abs() / (ref.abs() + 1)).max().item()
                assert err <= 2.0 ** -8 + 1e-7 * k + 1e-6, (m, k, n, unary, err)
    finally:
        lib.kiln_gemm_bf16_force_product(-1)


def test_amx_s_three_parts_carry_float32_activations_exactly():
    """int8 on AMX, one activation a row (the others zero), of full float32 precision: the product
    is one term, which float32 rounds at most twice (eager's a * (q * scale); kiln's (a * q) *
    scale), so kiln's is within 2^-22 of it relative. Two bfloat16 parts of a would leave ~2^-17,
    one 2^-9. Where AMX is not the product, the float32 GEMM's (the same bound)."""
    m, k, n = 40, 256, 60
    q, s, z, w = _quantized(n, k, 8, 0, seed=7)
    packed = kernels.quant_pack(q, s, z, 8, 0, k)
    lib = kernels.library()
    assert kernels.quant_path(8, m, k, n, 0) == ("amx" if lib.kiln_gemm_bf16_amx() and lib.kiln_gemm_bf16_product() == 2
                                                  else "float32")
    a = torch.zeros(m, k)
    a[torch.arange(m), torch.arange(m) * 5 % k] = torch.randn(m, generator=torch.Generator().manual_seed(1)) * 3
    out, ref = kernels.mm_quant(a, packed, n, 8, 0).double(), a.double() @ w.t()
    assert ((out - ref).abs() <= 2.0 ** -22 * ref.abs()).all(), ((out - ref).abs() / ref.abs()).max().item()


def _cpu_has(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and flag in line.split() for line in f)
    except OSError:
        return False


def _amx_few_rows(lib=None) -> bool:
    """Whether 2 to 4 rows (at 4 by default) can run on AMX's integer tiles here: the CPU has them,
    the build (-march=native) and the kernel give them (kiln_gemm_quant.h `amx_few_rows_apply`;
    int4's groups besides, a multiple of 64)."""
    return _cpu_has("amx_int8") and bool((lib or kernels.library()).kiln_gemm_bf16_amx())


@pytest.mark.parametrize("bits,path", [(4, "float32"), (4, "bf16_pairs"), (4, "int8_digits"), (4, "amx"),
                                       (8, "float32"), (8, "int8_digits"), (8, "amx")])
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_every_path_at_a_few_rows(m, bits, path):
    """At a few rows int4 has three paths, the CPU's fastest measured once per process
    (kiln_gemm_quant.h `int4_fastest_path`), int8 two (the digits where dot4 is one instruction),
    and both the digits on AMX's integer tiles: each is checked here whichever runs by default,
    against float64 of the activations as it carries them. The bfloat16 one runs where the CPU has
    avx512_bf16, the int8 digits where it has avx512_vnni, AMX's where it has amx_int8 and int4's
    groups are whole chunks of 64 (else the digits where it has VNNI, else the float32 one). K =
    1030: int8's digits in groups of 256 and a last, partial quad; int4's groups of 32: vpdpbusd
    (test_a_few_rows_on_amx_s_integer_tiles_are_the_digits_path_s_bits: groups of 64 and 128)."""
    k, n, group = (264, 811, 32) if bits == 4 else (1030, 811, 0)
    q, s, z, w = _quantized(n, k, bits, group, seed=m)
    packed = kernels.quant_pack(q, s, z, bits, group, k)
    g = torch.Generator().manual_seed(m)
    a, bias, residual = torch.randn(m, k, generator=g), torch.randn(n, generator=g), torch.randn(m, n, generator=g)
    has = {"float32": True, "bf16_pairs": _cpu_has("avx512_bf16"), "int8_digits": _cpu_has("avx512_vnni"),
           "amx": _cpu_has("avx512_vnni")}[path]  # (amx: its digits, on the tiles or on vpdpbusd)
    carried = _carried(a, bits, m, group, path=path if has else "float32")
    for unary, scalars, algorithm in EPILOGUES[:4]:
        out = kernels.mm_quant(a, packed, n, bits, group, bias, unary, scalars, residual, algorithm, path=path)
        _check(out, _reference(carried, w, bias, unary, scalars, algorithm, residual), k)
        # Over panels on 2 MB pages the runtime asks for one stream a thread (the digits at one row:
        # one run of panels shared between the threads; kiln_gemm_set_huge_page_packs): the same bits.
        on_huge_pages = _on_huge_pages(a, packed, n, bits, group, bias, unary, scalars, residual, algorithm, path=path)
        assert torch.equal(on_huge_pages, out)


def test_int8_weights_digits_keep_small_activations_beside_large_ones():
    """int8 weights' digits scale each group of INT8_DIGIT_GROUP k on its own: activations a
    thousand times larger in k 300..499 (weights zero there, so the product is the small ones')
    leave the others' digits as fine as before (within float32 rounding of the product over
    digits_of per group), where one group over all of K would carry them 2^10 times more coarsely."""
    if kernels.quant_path(8, 1, 1030, 64, 0) != "int8_digits":
        pytest.skip("int8 weights take the float32 path on this CPU (no one-instruction dot4)")
    m, k, n = 2, 1030, 64
    g = torch.Generator().manual_seed(5)
    weight = torch.randn(n, k, generator=g)
    weight[:, 300:500] = 0
    q, s = quantize_int8(weight)
    w = dequantize(q, s, None, 8, 0, k).double()
    packed = kernels.quant_pack(q, s, None, 8, 0, k)
    a = torch.randn(m, k, generator=g)
    a[:, 300:500] *= 1000
    out = kernels.mm_quant(a, packed, n, 8, 0).double()
    magnitude = a.double().abs() @ w.abs().t()
    for group, within in [(INT8_DIGIT_GROUP, True), (k, False)]:
        carried = digits_of(a, group, kernels.quant_digits(8))
        err = ((out - _reference(carried, w, None, "none", (), None, None)).abs() / magnitude).max().item()
        assert (err <= 1e-6) == within, (group, err)


# (M, K, N, group): one row in runs of panels (17 of them), 2..4 rows, K not a multiple of 8 (a
# partial last word) nor of the group, groups of 8 and 24 (a group of words ends inside a vector of
# 16 activations), a group not of whole words (10: the float32 path only), more rows than 4 (idem).
A8_SHAPES = [(1, 768, 1088, 128), (1, 133, 811, 32), (2, 256, 200, 64), (3, 1000, 130, 8), (4, 264, 97, 24),
             (1, 130, 70, 10), (7, 256, 96, 32)]


@pytest.mark.parametrize("path", ["integer", "float"])
@pytest.mark.parametrize("shape", A8_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_int8_activations_match_a_float64_product_of_the_quantized_rows(shape, path):
    """int4 with int8 activations (kiln.quantize's activations="int8"): kiln's GEMM makes the same
    levels as the reference (kiln/quant/weights.py `quantize_activations`), so its product is
    within float32 rounding of float64's over those rows, on the vpdpbusd path (where this CPU has
    AVX512-VNNI: the shapes it applies to) and on the float32 one, with the epilogues."""
    m, k, n, group = shape
    q, s, z, w = _quantized(n, k, 4, group, seed=k)
    packed = kernels.quant_pack(q, s, z, 4, group, k)
    g = torch.Generator().manual_seed(n)
    a, bias, residual = torch.randn(m, k, generator=g), torch.randn(n, generator=g), torch.randn(m, n, generator=g)
    a[0, :group] = 0  # an all-zero group
    rows = quantize_activations(a, group)
    assert (rows != a).any() and ((rows - a).abs() <= 0.02).all()  # quantized: half a level, 1/254 of a group's max
    integer = path == "integer" and kernels.int8_dot_applies(m, k, n, group)
    # (else the float32 GEMM over those rows, which takes int4's fastest path: test_every_path_at_a_few_rows)
    carried, ws = (rows, w) if integer else _operands(rows, w, 4, m, group)
    for unary, scalars, algorithm in EPILOGUES[:4]:
        out = kernels.mm_quant(a, packed, n, 4, group, bias, unary, scalars, residual, algorithm,
                               int8_activations=path)
        _check(out, _reference(carried, ws, bias, unary, scalars, algorithm, residual), carried.shape[-1])
        # Over panels on 2 MB pages one row reads one stream a thread: the same bits.
        on_huge_pages = _on_huge_pages(a, packed, n, 4, group, bias, unary, scalars, residual, algorithm,
                                       int8_activations=path)
        assert torch.equal(on_huge_pages, out)


def test_the_integer_path_runs_where_the_cpu_has_vnni():
    """Not a silent fallback: on a CPU with avx512_vnni the decode rows take vpdpbusd, with int8
    activations and over int8 weights."""
    assert kernels.int8_dot_applies(1, 768, 768, 128) == _cpu_has("avx512_vnni")
    assert not kernels.int8_dot_applies(5, 768, 768, 128) and not kernels.int8_dot_applies(1, 768, 768, 10)
    assert (kernels.quant_path(8, 1, 768, 768, 0) == "int8_digits") == _cpu_has("avx512_vnni")
    for m in (2, 3, 4):  # (AMX's tiles at four: the digits' own values)
        assert kernels.quant_path(8, m, 768, 768, 0) == ("amx" if m == 4 and _amx_few_rows() else
                                                         "int8_digits" if _cpu_has("avx512_vnni") else "float32")


# (K, N) of a few rows on AMX's integer tiles: K below, at and past one chunk of 64 k and one
# group (int8's of 256: a last chunk of 1 to 63 k from the zeroed copy; int4's 64 or 128), not a
# multiple of 4 or 8 (a last, partial quad or word), Qwen2-0.5B's 4864; N of one ragged panel,
# whole panels, an odd count of them (a thread's runs of unequal length) and many.
AMX_FEW_SHAPES = [(1, 5), (63, 48), (64, 49), (65, 97), (256, 200), (257, 47), (1030, 811), (4864, 130), (96, 2000)]


@pytest.mark.parametrize("bits,group", [(8, 0), (4, 64), (4, 128)], ids=["int8", "int4-64", "int4-128"])
@pytest.mark.parametrize("m", [2, 3, 4])
def test_a_few_rows_on_amx_s_integer_tiles_are_the_digits_path_s_bits(m, bits, group):
    """2 to 4 rows on AMX's integer tiles (kiln_gemm_quant.h `amx_digits_products`; forced at 2 and
    3, the default at 4): the digits path's digits over the same groups, its integer sums the same
    whole numbers (int4's nibbles widened to bytes), summed into float32 in the same order, so the
    same bits as vpdpbusd's, with every epilogue and row norm, on ragged shapes; and within
    float32's bound of float64 over the digits. Runs where the CPU has AMX's int8 tiles (the path's
    choice is tested everywhere, above)."""
    lib = kernels.library()
    if not (_amx_few_rows(lib) and _cpu_has("avx512_vnni")):
        pytest.skip("no AMX int8 tiles here: a few rows take vpdpbusd (test_every_path_at_a_few_rows)")
    for k, n in AMX_FEW_SHAPES:
        assert (kernels.quant_path(bits, m, k, n, group) == "amx") == (m == 4)
        q, s, z, w = _quantized(n, k, bits, group, seed=m * k + n)
        packed = kernels.quant_pack(q, s, z, bits, group, k)
        g = torch.Generator().manual_seed(n)
        a, bias, residual = torch.randn(m, k, generator=g), torch.randn(n, generator=g), torch.randn(m, n, generator=g)
        carried = _carried(a, bits, m, group, path="int8_digits")
        for unary, scalars, algorithm in EPILOGUES:
            on_tiles = kernels.mm_quant(a, packed, n, bits, group, bias, unary, scalars, residual, algorithm, path="amx")
            digits = kernels.mm_quant(a, packed, n, bits, group, bias, unary, scalars, residual, algorithm, path="int8_digits")
            assert torch.equal(on_tiles, digits), (k, n, unary)
            _check(on_tiles, _reference(carried, w, bias, unary, scalars, algorithm, residual), k)
        a[0, : min(k, 3)] *= 1000  # (a group with a larger scale beside the others: the same bits still)
        on_tiles = kernels.mm_quant(a, packed, n, bits, group, bias, "gelu", (), residual, path="amx")
        assert torch.equal(on_tiles, kernels.mm_quant(a, packed, n, bits, group, bias, "gelu", (), residual, path="int8_digits"))
        for kind in ("rms_norm", "softmax"):
            norm = kernels.RowNorm(torch.rand(n, generator=g) + 0.5 if kind == "rms_norm" else None, None, 1e-5, None, kind)
            on_tiles = kernels.mm_quant(a, packed, n, bits, group, bias, "none", (), residual, row_norm=norm, path="amx")
            digits = kernels.mm_quant(a, packed, n, bits, group, bias, "none", (), residual, row_norm=norm, path="int8_digits")
            assert torch.equal(on_tiles, digits), (k, n, kind)
        a[1, 0] = float("nan")  # (a row's non-finite activation: that row NaN, as float32's product)
        out = kernels.mm_quant(a, packed, n, bits, group, path="amx")
        assert out[1].isnan().all() and not out[0].isnan().any()


def test_a_wrong_dequantization_is_caught():
    """The comparison can fail: the same product with the zero points dropped from the packing."""
    m, k, n = 1, 256, 64
    q, s, z, w = _quantized(n, k, 4, 32, seed=3)
    packed = kernels.quant_pack(q, s, torch.zeros_like(z), 4, 32, k)
    a = torch.randn(m, k)
    with pytest.raises(AssertionError):
        _check(kernels.mm_quant(a, packed, n, 4, 32), _reference(a, w, None, "none", (), None, None), k)


@pytest.mark.parametrize("bits,group", [(4, 64), (8, 0)], ids=["int4", "int8"])
@pytest.mark.parametrize("m", [1, 3])
def test_a_wide_row_streamed_to_c_matches(m, bits, group):
    """A decode step's wide row (32 KB of float32 and more: kiln_gemm.h `stream_row_output`) is
    stored with streaming stores: every epilogue, a last panel of fewer columns, one row's columns
    past its last whole vector; C whose rows or start are not whole vectors apart (stored the plain
    way): the same bits."""
    k, n = 192, 8192 + 32 + (5 if m == 1 else 0)  # (rows of whole vectors: 8224 = 171.3 panels of 48)
    q, s, z, w = _quantized(n, k, bits, group, seed=m + 1)
    packed = kernels.quant_pack(q, s, z, bits, group, k)
    g = torch.Generator().manual_seed(m)
    a, bias, residual = torch.randn(m, k, generator=g), torch.randn(n, generator=g), torch.randn(m, n, generator=g)
    carried = _carried(a, bits, m, group)
    for unary, scalars, algorithm in EPILOGUES[:4]:
        for b, r in [(None, None), (bias, residual)]:
            out = kernels.mm_quant(a, packed, n, bits, group, b, unary, scalars, r, algorithm)
            _check(out, _reference(carried, w, b, unary, scalars, algorithm, r), k)
    # The same rows 3 floats past an aligned start, 16 floats apart beyond their end.
    lib = kernels.library()
    wide = torch.zeros(m, n + 16)
    out = kernels.mm_quant(a, packed, n, bits, group, bias)
    post = kernels.epilogue(bias, "none", (), None, None, torch.float32)
    lib.kiln_gemm_quant_f32(bits, m, n, k, k if bits == 8 else group, a.data_ptr(), k, packed.data_ptr(),
                            wide[:, 3:].data_ptr(), n + 16, ctypes.byref(post), kernels.K_BLOCK)
    assert torch.equal(wide[:, 3:3 + n], out)


@pytest.mark.parametrize("flags", [["-march=x86-64-v3"], ["-march=x86-64-v3", "-mavxvnni"], ["-march=x86-64-v2"]],
                         ids=["avx2", "avx2-vnni", "sse4"])
def test_other_isas(flags, tmp_path):
    """int8's quads read per ISA (vector shifts), and the int8 activations and digits (AVX2's byte
    products or AVX-VNNI's dot products, plain C++ elsewhere), built here."""
    if "-mavxvnni" in flags and not _cpu_has("avx_vnni"):
        pytest.skip("AVX-VNNI: this CPU cannot run it")
    lib = x86_kernels_built_with(flags, tmp_path)
    # int8 weights' default path: the digits at one row with AVX2's three-instruction dot4, at every
    # few rows with AVX-VNNI's one, none without a dot product (x86-64-v2).
    dot4 = "-march=x86-64-v3" in flags
    assert [kernels.quant_path(8, m, 768, 768, 0, lib) for m in (1, 4)] == \
        [dot4 and "int8_digits" or "float32", "-mavxvnni" in flags and "int8_digits" or "float32"]
    # The activations' digits: two at int4 weights, three of 64 levels at int8 ones (whose byte
    # pairs would saturate AVX2's 16 bits at 127); none without a dot product.
    assert [kernels.quant_digits(bits, lib) for bits in (4, 8)] == ([2, 3] if dot4 else [0, 0])
    for (m, k, n), (bits, group) in [((1, 77, 50), (8, 0)), ((1, 77, 300), (8, 0)), ((3, 130, 33), (4, 32)),
                                     ((9, 65, 20), (4, 64)), ((1, 72, 8200), (4, 8))]:  # (the last: a streamed row)
        q, s, z, w = _quantized(n, k, bits, group, seed=k)
        a, bias = torch.randn(m, k), torch.randn(n)
        packed = kernels.quant_pack(q, s, z, bits, group, k, lib=lib)
        out = kernels.mm_quant(a, packed, n, bits, group, bias, "gelu", lib=lib)  # (the build's fastest path)
        _check(out, _reference(_carried(a, bits, m, group, lib), w, bias, "gelu", (), None, None), k)
        if bits == 4:  # int8 activations and digits: AVX2's vpmaddubsw (x86-64-v3), plain C++ (v2) after
            out = kernels.mm_quant(a, packed, n, bits, group, bias, "gelu", lib=lib, int8_activations="integer")
            _check(out, _reference(quantize_activations(a, group), w, bias, "gelu", (), None, None), k)
        if m <= 4:  # the digits (int4's, int8's): vpdpbusd or AVX2's byte products (x86-64-v3), plain C++ (v2)
            digits = "-march=x86-64-v3" in flags
            out = kernels.mm_quant(a, packed, n, bits, group, bias, "gelu", lib=lib, path="int8_digits")
            carried = _carried(a, bits, m, group, lib, path="int8_digits" if digits else "float32")
            _check(out, _reference(carried, w, bias, "gelu", (), None, None), k)


def test_int4_scales_leave_the_packed_tables_low_bits_to_the_zero_points():
    """quantize_int4 rounds each scale to 19 bits of mantissa (its 4 low bits free for the zero
    point in kiln's packed table, kiln_gemm_quant.h `int4_table_word`), within 2^-20 of the
    unrounded min-max scale; a scale that is not so rounded (a state_dict of other origin) is
    rounded by the pack, and the product moves by no more than that rounding."""
    w = torch.randn(70, 256, generator=torch.Generator().manual_seed(3))
    q, s, z = quantize_int4(w, 64)
    assert (s.view(torch.int32) & 15).eq(0).all()
    groups = w.view(70, 4, 64)
    unrounded = (groups.amax(2).clamp(min=0) - groups.amin(2).clamp(max=0)) / 15
    assert ((s - unrounded).abs() <= unrounded * 2.0 ** -20).all()
    # Scales with their low bits set: the pack rounds them, each to within 2^-20 of itself.
    ragged = (s.view(torch.int32) | 7).view(torch.float32)
    a = torch.randn(1, 256, generator=torch.Generator().manual_seed(4))
    carried = _carried(a, 4, 1, 64).double()  # (the activations as this CPU's one-row path carries them)
    rounded = kernels.mm_quant(a, kernels.quant_pack(q, s, z, 4, 64, 256), 70, 4, 64).double()
    _check(rounded, carried @ dequantize(q, s, z, 4, 64, 256).double().t(), 256)
    out = kernels.mm_quant(a, kernels.quant_pack(q, ragged, z, 4, 64, 256), 70, 4, 64).double()
    assert torch.equal(out, rounded)
    moved = carried.abs() @ dequantize(q, ragged, z, 4, 64, 256).double().abs().t() * 2.0 ** -20
    assert ((out - carried @ dequantize(q, ragged, z, 4, 64, 256).double().t()).abs() <= moved + 1e-5).all()


def test_int4_zero_points_must_be_whole_numbers_the_table_can_hold():
    from kiln.externs import native_ops

    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(5))
    q, s, z = quantize_int4(w, 32)
    mm_quant = native_ops.direct("mm_quant")
    for bad in (z + 0.5, z + 16):
        with pytest.raises(RuntimeError, match="zero points must be whole numbers in 0..15"):
            mm_quant(torch.randn(1, 64), q, s, bad, 4, 32, None, None, "none", [], None, False)


def _gated_operands(m: int, k: int, h: int, bits: int, group: int, seed: int, lib=None):
    """A gated MLP's gate and up ([2h, k], quantized as one) packed as kiln::mm_quant_gated packs
    them (each half padded to whole panels: kernels.gated_halves), its dequantized weight, a's rows
    and a bias of 2h."""
    q, s, z, w = _quantized(2 * h, k, bits, group, seed=seed)
    halves = [kernels.gated_halves(t, lib) if t is not None else None for t in (q, s, z)]
    packed = kernels.quant_pack(*halves, bits, group, k, lib=lib)
    g = torch.Generator().manual_seed(seed)
    return packed, w, torch.randn(m, k, generator=g), torch.randn(2 * h, generator=g)


def _check_gated(out, carried, w, bias, unary, scalars, algorithm, h):
    """`out` against float64 unary(a @ gateᵀ + bias[:h]) * (a @ upᵀ + bias[h:]): each factor within
    float32's bound of its own (`_check`), so the product within twice it of (|gate| + 1)(|up| + 1)."""
    gate_bias, up_bias = (bias[:h], bias[h:]) if bias is not None else (None, None)
    gate = _reference(carried, w[:h], gate_bias, unary, scalars, algorithm, None)
    up = _reference(carried, w[h:], up_bias, "none", (), None, None)
    k = carried.shape[-1]
    err = ((out.double() - gate * up).abs() / ((gate.abs() + 1) * (up.abs() + 1))).max().item()
    assert err <= 2 * (1e-7 * k + 1e-6), err


# (M, K, h): halves of a ragged last panel (100: 2 panels and 4 columns at 48 a panel), of whole
# panels, of one column; at one row the paired store (int8_products), else the sums apart.
# (1, 72, 2000): 42 pairs of panels at one row, the last of them the threads' shared reserve
# (kiln_gemm_quant.h RESERVE_PARTS).
GATED_SHAPES = [(1, 264, 100), (1, 256, 96), (1, 133, 1), (3, 200, 70), (4, 129, 50), (5, 64, 70), (17, 333, 49),
                (64, 96, 130), (1, 72, 2000)]


@pytest.mark.parametrize("bits,group", KINDS, ids=lambda v: str(v))
@pytest.mark.parametrize("shape", GATED_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_a_gated_product_matches_the_gate_s_unary_times_up(shape, bits, group):
    """kiln::mm_quant_gated's GEMM (Epilogue::gated_width): unary(gate) * up of a float64 product of
    the dequantized weight, with and without a bias, the gate's unary ops, at every row count (one
    row: a gate panel and its up panel in one thread's pair; more: both halves' sums, then the
    outputs); at one row on 2 MB pages (one stream of pairs a thread) the same bits."""
    m, k, h = shape
    packed, w, a, bias = _gated_operands(m, k, h, bits, group, seed=m + k + h)
    n = 2 * kernels.gated_halves_width(h)
    carried, ws = _operands(a, w, bits, m, group)
    for unary, scalars, algorithm in EPILOGUES[:5]:
        for b in (None, bias):
            out = kernels.mm_quant(a, packed, n, bits, group, b, unary, scalars, None, algorithm, gated_width=h)
            assert out.shape == (m, h)
            _check_gated(out, carried, ws, b, unary, scalars, algorithm, h)
            if m == 1:
                on_huge_pages = _on_huge_pages(a, packed, n, bits, group, b, unary, scalars, None, algorithm, gated_width=h)
                assert torch.equal(on_huge_pages, out)


@pytest.mark.parametrize("bits,path", [(4, "float32"), (4, "bf16_pairs"), (4, "int8_digits"), (4, "amx"),
                                       (8, "float32"), (8, "int8_digits"), (8, "amx")])
@pytest.mark.parametrize("m", [1, 2, 4])
def test_a_gated_product_on_every_path_at_a_few_rows(m, bits, path):
    """Each path at a few rows (test_every_path_at_a_few_rows) over a gated weight: the digits' at
    one row stores pairs itself, the others' sums are made whole first; int4 with int8 activations
    (the integer path stores pairs at one row, the float one never)."""
    k, h, group = (264, 100, 32) if bits == 4 else (1030, 100, 0)
    packed, w, a, bias = _gated_operands(m, k, h, bits, group, seed=m)
    n = 2 * kernels.gated_halves_width(h)
    has = {"float32": True, "bf16_pairs": _cpu_has("avx512_bf16"), "int8_digits": _cpu_has("avx512_vnni"),
           "amx": _cpu_has("avx512_vnni")}[path]
    carried = _carried(a, bits, m, group, path=path if has else "float32")
    out = kernels.mm_quant(a, packed, n, bits, group, bias, "swish", path=path, gated_width=h)
    _check_gated(out, carried, w, bias, "swish", (), None, h)
    if bits == 4 and path == "float32":
        rows = quantize_activations(a, group)
        for kind in ("integer", "float"):
            carried = rows if kind == "integer" and kernels.int8_dot_applies(m, k, n, group) else \
                _operands(rows, w, 4, m, group)[0]
            out = kernels.mm_quant(a, packed, n, 4, group, bias, "swish", int8_activations=kind, gated_width=h)
            _check_gated(out, carried, w, bias, "swish", (), None, h)


@pytest.mark.parametrize("rows", ["bfloat16", "bf16_math"])
@pytest.mark.parametrize("m", [1, 4, 9])
def test_a_gated_product_of_bfloat16_rows_and_in_fast_math(m, rows):
    """A bfloat16 model's gated product (C bfloat16, rounded once from the float32 outputs) and one
    in bfloat16 fast math (a prompt's rows on AMX where it is the product: the sums made whole
    first): within bfloat16's rounding of the weights, activations and C."""
    k, h, bits, group = 256, 100, 4, 64
    packed, w, a, bias = _gated_operands(m, k, h, bits, group, seed=m)
    n = 2 * kernels.gated_halves_width(h)
    if rows == "bfloat16":
        a, bias = a.bfloat16(), bias.bfloat16()
    lib = kernels.library()
    lib.kiln_gemm_bf16_force_product(2)  # (AMX where the CPU has it, not as timed on a loaded machine)
    try:
        out = kernels.mm_quant(a, packed, n, bits, group, bias, "swish", gated_width=h, bf16_math=rows == "bf16_math")
    finally:
        lib.kiln_gemm_bf16_force_product(-1)
    assert out.dtype == a.dtype and out.shape == (m, h)
    # (a prompt's rows on AMX: int4's weights, and fast math's activations, rounded to bfloat16 as
    # well: test_a_bfloat16_model_s_rows)
    amx = m > 4 and lib.kiln_gemm_bf16_amx()
    ws, av = (w.float().bfloat16().double(), a.bfloat16().double()) if amx else (w, a.double())
    gate = _reference(av, ws[:h], bias[:h], "swish", (), None, None)
    up = _reference(av, ws[h:], bias[h:], "none", (), None, None)
    err = ((out.double() - gate * up).abs() / ((gate.abs() + 1) * (up.abs() + 1))).max().item()
    assert err <= 2.0 ** -6, err
