"""kiln's own GEMM (kiln/native/include/kiln_gemm.h) against float64 matmuls: random shapes with
ragged edges (M not a multiple of the register block's rows, N not of a panel's width, K odd and
not a multiple of the vector width or of the K block), every epilogue, float32 and bfloat16, a
transposed weight as the frozen graph hands it, the ISAs this machine can also run (AVX2
without AVX-512, SSE, AVX-512 without its bfloat16 dot products), and AVX-512's written-out tile
against the C++ micro-kernel it replaces."""

from __future__ import annotations

import ctypes
import math
import subprocess

import pytest
import torch
import torch.nn.functional as F

from benchmarks import kernels
from kiln.native import build, kernels_unit

EPILOGUES = [("none", [], None), ("relu", [], None), ("gelu", [], None), ("gelu", [], "tanh"), ("swish", [], None),
             ("sigmoid", [], None), ("tanh", [], None), ("hardswish", [], None), ("leaky_relu", [0.1], None),
             ("hardtanh", [-0.5, 0.5], None)]
# (M, K, N). Last panels of 1, 2 and 22 columns (one or two of its three vectors); 520 x 40 x 70: a
# weight small enough that row blocks run outermost.
SHAPES = [(1, 1, 1), (3, 5, 7), (17, 33, 49), (9, 385, 50), (8, 769, 48), (64, 1000, 130), (130, 64, 97),
          (520, 40, 70)]


def unary_reference(y, unary, scalars, algorithm):
    """A post-op by oneDNN's name (kiln::mm's `unary`) as eager computes it."""
    ops = {"none": lambda y: y, "relu": F.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "swish": F.silu,
           "hardswish": F.hardswish, "gelu": lambda y: F.gelu(y, approximate=algorithm or "none"),
           "leaky_relu": lambda y, slope: F.leaky_relu(y, slope), "hardtanh": lambda y, lo, hi: F.hardtanh(y, lo, hi)}
    return ops[unary](y, *([] if unary == "gelu" else scalars))


def _reference(a, b, bias, unary, scalars, algorithm, residual):
    y = a.double() @ b.double()
    if bias is not None:
        y = y + bias.double()
    y = unary_reference(y, unary, scalars, algorithm)
    return y + residual.double() if residual is not None else y


def _check(out, ref, dtype, k):
    # float32, unit-variance operands: a sequential sum's partial sums grow like sqrt(K) and its
    # rounding errors add up like sqrt(K) of them, so about K ulps of 1; a wrong element is off by
    # O(1). bfloat16 output: one rounding to 8 bits.
    tol = 1e-7 * k + 1e-6 if dtype == torch.float32 else 1e-2
    err = ((out.double() - ref).abs() / (ref.abs() + 1)).max().item()
    assert err <= tol, (err, tol)


def _operands(m, k, n, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(dtype)
    weight = torch.randn(n, k, generator=g).to(dtype)  # nn.Linear's [out, in]: the GEMM sees its transpose
    bias = torch.randn(n, generator=g).to(dtype)
    residual = torch.randn(m, n, generator=g).to(dtype)
    return a, weight.t(), bias, residual


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_epilogue_matches_a_float64_product(shape, dtype):
    m, k, n = shape
    a, b, bias, residual = _operands(m, k, n, dtype, seed=m * 7 + k)
    panels = kernels.pack(b)
    for unary, scalars, algorithm in EPILOGUES:
        for use_bias, use_residual in [(False, False), (True, False), (True, True)]:
            out = kernels.mm(a, panels, n, bias if use_bias else None, unary, scalars,
                               residual if use_residual else None, algorithm=algorithm)
            assert out.dtype == dtype and out.shape == (m, n)
            _check(out, _reference(a, b, bias if use_bias else None, unary, scalars, algorithm,
                                   residual if use_residual else None), dtype, k)


def _cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        return next((set(line.split(":")[1].split()) for line in f if line.startswith("flags")), set())


@pytest.mark.parametrize("product", [0, 1, 2], ids=["vdpbf16ps", "widened", "amx"])
def test_bfloat16_products_of_many_rows_every_way(product):
    """A bfloat16 product of 32 rows or more runs the fastest, on this CPU, of vdpbf16ps in the
    tiles, the panels widened to float32 block by block through float32's tile, and AMX's tiles
    where the CPU has them (kiln_gemm.h `gemm_bf16_by`, measured once per process; from 2 rows on
    where AMX is the fastest, fewer than 32 rows otherwise vdpbf16ps): each forced in turn, on
    ragged shapes (M and K not multiples of AMX's 32, a last block of at most 16 rows, a panel of
    22 columns, 300 rows of K = 4100 in four passes of AMX's blocks; 2, 7 and 20 rows), with the
    epilogues, float32 and bfloat16 out. Forced where the CPU has no AMX, the AMX product is
    vdpbf16ps."""
    lib = kernels.library()
    flags = _cpu_flags()
    amx = {"amx_bf16", "amx_tile"} <= flags
    assert lib.kiln_gemm_bf16_amx() == int(amx)  # built and granted by the OS wherever the CPU has it
    assert lib.kiln_gemm_bf16_product() in (((0, 1, 2) if amx else (0, 1)) if "avx512_bf16" in flags else (-1,))
    lib.kiln_gemm_bf16_force_product(product)
    try:
        for m, k, n in [(32, 77, 50), (64, 1000, 130), (130, 64, 97), (33, 2049, 22), (96, 64, 144), (40, 96, 48), (300, 4100, 60),
                        (2, 300, 100), (7, 64, 50), (20, 1000, 97)]:
            a, b, bias, residual = _operands(m, k, n, torch.bfloat16, seed=m + k)
            panels = kernels.pack(b)
            for unary, scalars, algorithm in EPILOGUES[:5]:
                for out_dtype in (torch.float32, torch.bfloat16):
                    out = kernels.mm(a, panels, n, bias, unary, scalars, residual, out_dtype=out_dtype,
                                     algorithm=algorithm)
                    _check(out, _reference(a, b, bias, unary, scalars, algorithm, residual), out_dtype, k)
    finally:
        lib.kiln_gemm_bf16_force_product(-1)


@pytest.mark.parametrize("n", [75, 400])
def test_k_blocks_partial_sums_and_strided_rows(n):
    # K spans several K blocks (partial sums kept in C between them; the blocks the outer loop, so
    # at n = 400 each thread runs several panels per block); A is a view whose rows are further
    # apart than K; the output is bfloat16 from float32 operands, the residual bfloat16.
    m, k = 37, 3 * kernels_unit.K_BLOCK + 5
    a, b, bias, residual = _operands(m, k + 11, n, torch.float32, seed=3)
    a = a[:, :k]
    b = torch.randn(k, n)
    assert a.stride(0) == k + 11
    panels = kernels.pack(b)
    _check(kernels.mm(a, panels, n), _reference(a, b, None, "none", [], None, None), torch.float32, k)
    out = kernels.mm(a, panels, n, bias, "relu", [], residual.bfloat16(), out_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    _check(out, _reference(a, b, bias, "relu", [], None, residual.bfloat16()), torch.bfloat16, k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("panels", [1, 3, 8, 9, 16, 17, 23, 40, 172])
def test_one_row_products_read_runs_of_panels(panels, threads, dtype):
    """M = 1 (a decode step's GEMV): each thread cuts its panels into GEMV_STREAMS runs and reads
    the next panel of every run at once (kiln_gemm.h `gemv`; bfloat16 in pairs of k where the CPU
    has them). Panel counts that leave runs of unequal length, fewer panels than runs, a ragged
    last panel; every epilogue; an odd K. Over panels on 2 MB pages the runtime asks for 2 runs
    (kiln_gemm_set_huge_page_packs, AMD's reading; kiln_gemm_set_near_gemv, Intel's: 2 runs asked
    for into L1): the same bits, each panel's sums taken in the same order. 172 panels: a float32
    row of 32 KB and more, stored with streaming stores (`stream_row_output`)."""
    n, k = 48 * panels - 5, 133
    a, b, bias, residual = _operands(1, k, n, dtype, seed=panels)
    packed = kernels.pack(b)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    library = kernels.library()
    reading = library.kiln_gemm_huge_page_packs(), library.kiln_gemm_near_gemv()

    def read_as(huge, near):
        library.kiln_gemm_set_huge_page_packs(huge)
        library.kiln_gemm_set_near_gemv(near)

    try:
        for unary, scalars, algorithm in EPILOGUES:
            read_as(0, 0)
            out = kernels.mm(a, packed, n, bias, unary, scalars, residual, algorithm=algorithm)
            _check(out, _reference(a, b, bias, unary, scalars, algorithm, residual), dtype, k)
            for huge, near in ((1, 0), (0, 1)):
                read_as(huge, near)
                assert torch.equal(kernels.mm(a, packed, n, bias, unary, scalars, residual, algorithm=algorithm), out)
    finally:
        read_as(*reading)
        torch.set_num_threads(before)


@pytest.mark.parametrize("columns", [48, 53], ids=["whole-panel", "ragged"])
def test_gelu_tanh_epilogue_at_extreme_values_is_eagers(columns):
    """GELU's tanh form runs as y * sigmoid(2u) with 2u taken within +-80 (no denormal e^-|2u|):
    beyond, eager's 1 + tanh u is exactly 0 or 2, and so is kiln's factor (y = -inf gives NaN, a
    large negative y -0); inside, tiny values where eager's cancels to 0."""
    values = torch.tensor([-math.inf, math.inf, math.nan, -1e20, 1e20, -100.0, -20.0, -10.0, -5.0, -3.0, -1.0,
                           -0.5, 0.5, 1.0, 3.0, 88.0, 1e-3])
    b = torch.zeros(1, columns)
    b[0, :len(values)] = values
    out = kernels.mm(torch.ones(9, 1), kernels.pack(b), columns, None, "gelu", [], algorithm="tanh")
    expected = F.gelu(b.expand(9, columns), approximate="tanh")
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6, equal_nan=True)
    assert torch.equal(out[:, :8].isinf(), expected[:, :8].isinf()) and torch.equal(out.isnan(), expected.isnan())
    assert (out[:, 3] == 0).all() and out[:, 3].signbit().all()  # -1e20: -0, as eager


def test_operands_of_two_dtypes_are_refused():
    panels = kernels.pack(torch.randn(4, 4))
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        kernels.mm(torch.randn(2, 4).bfloat16(), panels, 4)


def x86_kernels_built_with(flags: list[str], tmp_path) -> ctypes.CDLL:
    """kiln's own kernels (kernels_unit.source(): the GEMM, the depthwise convolution, the attention)
    built with `flags` after the kernels' own and loaded, its functions typed; the test skipped off
    x86."""
    if "x86_64" not in subprocess.run(["uname", "-m"], capture_output=True, text=True).stdout:
        pytest.skip("x86 ISAs")
    src, lib_path = tmp_path / "kernels.cpp", tmp_path / "kernels.so"
    src.write_text(kernels_unit.source())
    cxx, _ = build.compiler()
    subprocess.run([cxx, *build.FLAGS, *flags, "-shared", str(src), "-o", str(lib_path)], check=True,
                   capture_output=True)
    return kernels.bind(ctypes.CDLL(str(lib_path)))


@pytest.mark.parametrize("flags", [["-march=x86-64-v3"], ["-march=x86-64-v2"], ["-mno-avx512bf16"]],
                         ids=["avx2", "sse4", "avx512-no-bf16"])
def test_other_isas(flags, tmp_path):
    """The register blocking and bfloat16 paths of ISAs narrower than this machine's (every x86
    CPU kiln runs on has AVX2), built with their flags and run here, and the depthwise
    convolution's blocks for 16 vector registers (one output row at a time). NEON (aarch64) is
    cross-compiled and run under qemu instead: test_neon_cross.py."""
    lib = x86_kernels_built_with(flags, tmp_path)
    for dtype in (torch.float32, torch.bfloat16):
        for m, k, n in [(13, 77, 50), (1, 9, 3), (1, 130, 1000), (128, 8, 16432)]:  # the last: C streamed (float32)
            a, b, bias, residual = _operands(m, k, n, dtype, seed=k)
            out = kernels.mm(a, kernels.pack(b, lib), n, bias, "gelu", [], residual, lib=lib)
            _check(out, _reference(a, b, bias, "gelu", [], None, residual), dtype, k)
    for n, c, h, w, k, s, p, d in [(2, 48, 13, 15, 3, 2, 1, 1), (1, 33, 20, 21, 3, 1, 1, 1), (1, 19, 8, 8, 7, 1, 3, 1)]:
        torch.manual_seed(c)
        x, weight, bias = torch.randn(n, c, h, w), torch.randn(c, 1, k, k), torch.randn(c)
        other = torch.randn_like(F.conv2d(x, weight, None, s, p, d, c))
        out = kernels.depthwise_conv(x, kernels.depthwise_pack(weight, lib), (k, k), bias, (s, s), (p, p), (d, d), "swish",
                                  (), None, other, lib=lib)
        torch.testing.assert_close(out, F.silu(F.conv2d(x, weight, bias, s, p, d, c) + other), rtol=1e-5, atol=1e-5)


def test_the_written_out_tile_sums_as_the_cplusplus_one(tmp_path):
    """With AVX-512, a tile of 8 rows by 1, 2 or 3 whole vectors into float32 C runs written out
    in assembly (kiln_gemm.h, tile_8_written); the same FMAs in the same order as the C++
    micro-kernel, so the two builds agree bit for bit: K of every remainder mod 8, fewer and more
    than 8 iterations (C's rows asked for in the last 8), K blocks (partial sums loaded from C),
    strided A rows, several panels (the next block's prefetch), last panels of 1 and 2 vectors
    (N = 64, 80), ragged ones (the C++ store), an epilogue after."""
    lib = kernels.library()
    if lib.kiln_vec_lanes() != 16:
        pytest.skip("the written-out tile is AVX-512's")
    cplusplus = x86_kernels_built_with(["-DKILN_GEMM_NO_ASM"], tmp_path)
    for m, k, n, lda in [(8, 8, 64, 8), (16, 15, 80, 15), (9, 63, 50, 70), (24, 64, 144, 64), (17, 65, 48, 65),
                         (32, 520, 480, 531), (40, 2 * kernels_unit.K_BLOCK + 37, 100, 2 * kernels_unit.K_BLOCK + 37)]:
        a, b, bias, residual = _operands(m, lda, n, torch.float32, seed=k)
        a, b = a[:, :k], b[:k]
        for post in [dict(), dict(bias=bias, unary="relu", residual=residual)]:
            written = kernels.mm(a, kernels.pack(b), n, **post)
            stepped = kernels.mm(a, kernels.pack(b, cplusplus), n, lib=cplusplus, **post)
            assert torch.equal(written, stepped), (m, k, n, (written - stepped).abs().max().item())
            _check(written, _reference(a, b, post.get("bias"), post.get("unary", "none"), [], None,
                                       post.get("residual")), torch.float32, k)


@pytest.mark.parametrize("n", [16432, 16433], ids=["aligned-rows", "rows-off-vectors"])
def test_a_c_of_8_mb_is_written_alike_with_streaming_stores(n):
    # 128 x 16432 floats (8.4 MB) in rows whole vectors apart: stored bypassing the caches (the
    # ragged last panel through the ordinary stores); one column more puts the rows off the vector
    # boundaries and the stores back in the caches.
    m, k = 128, 24
    a, b, bias, residual = _operands(m, k, n, torch.float32, seed=n)
    panels = kernels.pack(b)
    _check(kernels.mm(a, panels, n), _reference(a, b, None, "none", [], None, None), torch.float32, k)
    out = kernels.mm(a, panels, n, bias, "relu", [], residual)
    _check(out, _reference(a, b, bias, "relu", [], None, residual), torch.float32, k)


def test_rows_in_several_passes_over_the_panels():
    # M large enough that A is taken in several passes of about 1 MB (8 x K_BLOCK floats per tile row
    # block), K in two blocks, with the epilogue on the last.
    m, k, n = 1000, kernels_unit.K_BLOCK + 64, 50
    a, b, bias, residual = _operands(m, k, n, torch.float32, seed=5)
    out = kernels.mm(a, kernels.pack(b), n, bias, "relu", [], residual)
    _check(out, _reference(a, b, bias, "relu", [], None, residual), torch.float32, k)


@pytest.mark.parametrize("panels,row_blocks,last_vectors,threads,along_panels", [
    (2, 2048, 1, 2, 1),   # N = 64, M = 16384: by panels one thread would have 3 vectors, the other 1
    (2, 2048, 3, 2, 2),   # N = 96: even by panels, which each thread then reads alone
    (11, 16, 2, 2, 1),    # N = 512, M = 128: 6 + 5 panels, rows split instead
    (16, 16, 3, 2, 2),    # N = 768: 8 + 8 panels
    (64, 16, 3, 4, 4)])
def test_the_thread_grid_balances_vectors_not_tiles(panels, row_blocks, last_vectors, threads, along_panels):
    # kiln_gemm.h's split: threads along the panels unless splitting the rows gives the busiest
    # thread fewer vector-tiles (the last panel has last_vectors of the 3).
    assert kernels.library().kiln_gemm_split(panels, row_blocks, last_vectors, threads) == along_panels


@pytest.mark.parametrize("panels,threads,team,late", [
    (48, 2, 2, False), (48, 2, 2, True), (666, 2, 2, True), (3, 4, 4, False), (1, 2, 2, False), (97, 4, 1, False),
    (40, 3, 2, True), (40, 3, 3, True)])
def test_shared_panels_are_each_taken_once_and_a_late_thread_s_are_taken_by_the_others(panels, threads, team, late):
    # kiln_gemm.h's SharedPanels (one-row products): every panel exactly once, whatever the team (one
    # smaller than the shares takes the missing threads' too); a thread 0 that starts only once the
    # others are done finds its whole share taken (from the back) by them.
    counts = torch.zeros(panels, dtype=torch.int32)
    taken = torch.zeros(team, dtype=torch.int64)
    kernels.library().kiln_gemm_shared_panels_take(panels, threads, team, int(late), counts.data_ptr(), taken.data_ptr())
    assert counts.eq(1).all(), counts
    assert int(taken.sum()) == panels
    if late and team > 1:
        assert int(taken[0]) == 0, taken


def test_a_product_s_scratch_is_kept_for_the_next_and_never_shared_with_one_inside_it():
    # kiln_gemm.h's Scratch: a block the thread keeps (grown where a later product asks for more),
    # a product inside a product given its own; above 256 KB each its own allocation.
    def blocks(size):
        out = (ctypes.c_void_p * 3)()
        kernels.library().kiln_gemm_scratch_blocks(ctypes.c_int64(size), out)
        return list(out)

    small = blocks(1000)
    assert small[0] != small[1] and small[2] == small[0]
    grown = blocks(100_000)
    assert grown[0] != grown[1] and grown[2] == grown[0] and blocks(1000)[0] == grown[0]
    large = blocks(1 << 20)
    assert large[0] != large[1] and grown[0] not in large[:2]
    assert all(address % 64 == 0 for address in small + grown + large)


@pytest.mark.parametrize("tiles,steps,bytes_per_step", [(16, 768, 192), (25, 768, 192), (7, 1024, 192), (16, 384, 192),
                                                         (12, 96, 96), (2, 512, 192), (1, 768, 192), (400, 64, 192)])
def test_the_next_block_s_prefetch_is_spread_over_every_tile_and_covers_it(tiles, steps, bytes_per_step):
    # The next weight panel's block (steps x bytes_per_step bytes) is asked for while the current
    # panel's tiles run, one new line every 2^shift steps: the sparsest spacing that still reaches
    # its last line (kiln_gemm.h's ahead_shift; at BERT's M = 128, 16 tiles, every fourth step).
    lib = kernels.library()
    lines = -(-steps * bytes_per_step // 64)
    shift = lib.kiln_gemm_ahead_shift(tiles, steps, lines)
    asked = lambda s: tiles * -(-steps // (1 << s))  # noqa: E731  lines the tiles ask for at spacing s
    assert 0 <= shift <= 4
    assert asked(shift) >= lines or shift == 0  # covered (or, with too few tiles, a line every step)
    assert shift == 4 or asked(shift + 1) < lines  # and no sparser spacing would cover it
