"""kiln's aarch64 (NEON) path, which no x86 build compiles: cross-compiled with
aarch64-linux-gnu-g++ and run under qemu-aarch64. Correctness only; qemu says nothing of speed.

The unit is kernels_unit.source(), the text kiln builds for the host, with its host flags
(build.FLAGS) but `-march=armv8-a` (NEON is baseline there), plus a main() (neon_harness.cpp)
that runs the kernels on operands sent from here: the GEMM in its NEON register blocking (MR = 8
rows, NV = 3 vectors of 4 floats: NR = 12) on ragged shapes with every epilogue, float32 and
bfloat16 (widened to float32: no pair dot products on NEON); the weight-only int8/int4 GEMM
(float32 lanes; int8 activations over the float32 GEMM); the depthwise convolution; the vector
math of the GEMM's epilogue; float16 rounding (kiln_half.h on __fp16 there). References and
tolerances are the x86 tests' own (test_kiln_gemm.py, test_kiln_depthwise.py, test_vec_math.py).

Without the cross tools the tests fail, naming the Debian packages (`make setup` installs them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from benchmarks import kernels
from kiln.native import build, kernels_unit
from tests.codegen import test_kiln_depthwise as depthwise_tests
from tests.codegen import test_vec_math as vec_math_tests
from tests.codegen.test_kiln_gemm import EPILOGUES, _check, _operands, _reference
# Autouse, here too: the references are hundreds of tiny float64 products, which torch's thread
# pool makes several times slower on a busy machine.
from tests.codegen.test_vec_math import one_torch_thread  # noqa: F401

CXX, QEMU = "aarch64-linux-gnu-g++", "qemu-aarch64"
PACKAGES = "g++-aarch64-linux-gnu qemu-user"
# kiln's host flags for aarch64: NEON is part of armv8-a; the vector width preference is x86's.
FLAGS = ["-march=armv8-a" if f == "-march=native" else f for f in build.FLAGS
         if not f.startswith("-mprefer-vector-width")]
MR, NV, LANES = 8, 3, 4  # kiln_gemm.h's NEON blocking: what these shapes are chosen around
NR = NV * LANES


class Harness:
    """neon_harness.cpp built for aarch64 and run under qemu, or why it could not be built (each
    test then fails with that: a missing tool is a broken setup, not a reason to skip)."""

    def __init__(self, binary: Path | None, problem: str | None = None):
        self.binary, self.problem = binary, problem

    def run(self, requests: list[tuple[list, list[torch.Tensor], torch.dtype, int]]) -> list[torch.Tensor]:
        """Each request (words, operands, result dtype, result elements) in one qemu process;
        the results in order."""
        if self.problem:
            pytest.fail(self.problem, pytrace=False)
        data = bytearray()
        for words, operands, _, _ in requests:
            data += (" ".join(map(str, words)) + "\n").encode()
            for t in operands:
                data += t.contiguous().flatten().view(torch.uint8).numpy().tobytes()
        # Two threads, as on the test machine: large enough GEMMs split their panels between them.
        done = subprocess.run([QEMU, str(self.binary)], input=bytes(data), capture_output=True, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": "2"})
        assert done.returncode == 0, f"harness exited with {done.returncode}: {done.stderr.decode()[-2000:]}"
        results, at = [], 0
        for _, _, dtype, count in requests:
            size = count * torch.tensor([], dtype=dtype).element_size()
            results.append(torch.frombuffer(bytearray(done.stdout[at:at + size]), dtype=dtype))
            at += size
        assert at == len(done.stdout), f"harness wrote {len(done.stdout)} bytes, {at} expected"
        return results


def _harness(tmp_path_factory, flags: list[str]) -> Harness:
    missing = [tool for tool in (CXX, QEMU) if shutil.which(tool) is None]
    if missing:
        return Harness(None, f"{' and '.join(missing)} not found: the NEON tests need the Debian packages "
                             f"{PACKAGES} (apt-get install {PACKAGES}; `make setup` installs them)")
    folder = tmp_path_factory.mktemp("neon")
    source, binary = folder / "neon.cpp", folder / "neon"
    source.write_text(kernels_unit.source() + "\n" + Path(__file__).with_name("neon_harness.cpp").read_text())
    # Static: qemu then needs no aarch64 libraries at run time (-L /usr/aarch64-linux-gnu).
    done = subprocess.run([CXX, *flags, "-static", str(source), "-o", str(binary)], capture_output=True, text=True)
    if done.returncode != 0:
        return Harness(None, f"kiln's kernels do not compile for aarch64 ({CXX} {' '.join(flags)}):\n"
                             f"{done.stderr[-4000:]}")
    return Harness(binary)


@pytest.fixture(scope="module")
def neon(tmp_path_factory) -> Harness:
    return _harness(tmp_path_factory, FLAGS)


@pytest.fixture(scope="module")
def neon_dotprod(tmp_path_factory) -> Harness:
    """Built for aarch64 with the dot product instructions (sdot: Neoverse N1, Graviton2 and later),
    which qemu's default CPU has."""
    return _harness(tmp_path_factory, ["-march=armv8.2-a+dotprod" if f == "-march=armv8-a" else f for f in FLAGS])


def test_the_neon_register_blocking_is_built(neon):
    [blocking] = neon.run([(["blocking"], [], torch.int32, 4)])
    assert blocking.tolist() == [MR, NV, LANES, NR], "kiln_gemm.h did not take its aarch64 branch"


# ---------------------------------------------------------------- the GEMM


def _gemm_request(a, b, bias, unary, scalars, algorithm, residual, out_dtype, pad_a=0, pad_c=0, kc=0):
    """A harness request for kiln's GEMM (a [M, K] @ b [K, N] and the epilogue) with A's rows
    K + pad_a apart, NaN in between (read only if the GEMM reads past K), and C's N + pad_c."""
    (m, k), n = a.shape, b.shape[1]
    rows = torch.full((m, k + pad_a), float("nan"), dtype=a.dtype)
    rows[:, :k] = a
    name = "gelu_tanh" if unary == "gelu" and algorithm == "tanh" else unary
    s0, s1 = [*scalars, 0.0, 0.0][:2]
    words = ["gemm_bf16" if a.dtype == torch.bfloat16 else "gemm_f32", m, n, k, k + pad_a, n + pad_c, kc,
             int(bias is not None), int(residual is not None),
             int(residual is not None and residual.dtype == torch.bfloat16), int(out_dtype == torch.bfloat16),
             kernels.UNARY_CODES[name], s0, s1]
    operands = [rows, b, *([bias] if bias is not None else []), *([residual] if residual is not None else [])]
    return words, operands, out_dtype, m * (n + pad_c)


def _run_gemms(neon, cases):
    """cases: (label, a, b, bias, unary, scalars, algorithm, residual, out_dtype, pad_a, pad_c, kc),
    all run in one process, each checked against its float64 reference."""
    results = neon.run([_gemm_request(*case[1:]) for case in cases])
    for (label, a, b, bias, unary, scalars, algorithm, residual, out_dtype, _, pad_c, _), c in zip(cases, results):
        (m, k), n = a.shape, b.shape[1]
        c = c.view(m, n + pad_c)
        untouched = c[:, n:].view(torch.int16 if out_dtype == torch.bfloat16 else torch.int32)
        assert (untouched == -1).all(), f"{label}: the GEMM wrote C's columns past N"
        try:
            _check(c[:, :n], _reference(a, b, bias, unary, scalars, algorithm, residual), out_dtype, k)
        except AssertionError as error:
            raise AssertionError(f"{label}: (max relative error, tolerance) = {error}") from None


# Every row count from 1 to MR + 1 (each one's own micro-kernel instance, and a second row block),
# N not a multiple of the panel width (a last panel of 5 columns: one full vector and one of a
# single lane; of 8: the third vector absent), odd K; then several row blocks and panels, one
# panel exactly, and K = 1. C's rows always further apart than N, A's than K in every other shape.
GEMM_SHAPES = [(m, 29, 7) for m in range(1, MR + 2)] + [(2 * MR + 3, 41, 33), (MR, NR, 1), (5, 20, 64), (1, 1, 1)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gemm_ragged_shapes_and_every_epilogue(neon, dtype):
    cases = []
    for index, (m, n, k) in enumerate(GEMM_SHAPES):
        a, b, bias, residual = _operands(m, k, n, dtype, seed=m * 7 + k)
        pad = 3 * (index % 2)
        for unary, scalars, algorithm in EPILOGUES:
            for use_bias, use_residual in [(False, False), (True, False), (True, True)]:
                label = f"{dtype} {m}x{k}x{n} {unary}/{algorithm} bias={use_bias} residual={use_residual}"
                cases.append((label, a, b, bias if use_bias else None, unary, scalars, algorithm,
                              residual if use_residual else None, dtype, pad, pad + 2, 0))
    _run_gemms(neon, cases)


def test_gemm_k_blocks_threads_and_bfloat16_output(neon):
    # K in several blocks (a small kc: partial sums kept in C between them, the epilogue on the
    # last), at 37x101x75 on two threads; rows further apart than K; then bfloat16 output (and a
    # bfloat16 residual) from float32 operands, which keeps K in one block.
    cases = []
    for m, k, n, kc in [(37, 101, 75, 16), (9, 50, 13, 7)]:
        a, b, bias, residual = _operands(m, k, n, torch.float32, seed=k)
        shape = f"{m}x{k}x{n} kc={kc}"
        cases.append((f"{shape} no epilogue", a, b, None, "none", [], None, None, torch.float32, 11, 4, kc))
        for unary, scalars, algorithm in EPILOGUES:
            cases.append((f"{shape} {unary}/{algorithm} bias residual", a, b, bias, unary, scalars, algorithm,
                          residual, torch.float32, 11, 4, kc))
        cases.append((f"{shape} bfloat16 out", a, b, bias, "relu", [], None, residual.bfloat16(), torch.bfloat16,
                      11, 4, kc))
    _run_gemms(neon, cases)


# ---------------------------------------------------------------- the quantized GEMM

# (M, K, N) and (bits, group): kiln.quantize's weights on NEON, where int4 takes the float32 path
# (neither bfloat16 pairs nor int8 dot products) at any row count: the decode rows (one row in
# runs of panels, 2-4 rows a tile each), then the packed GEMM's; K odd and not a multiple of the
# group, N with a ragged last panel; K in two blocks (kc) at 9 rows.
QUANT_SHAPES = [(1, 7, 1), (1, 133, 200), (2, 200, 29), (4, 129, 48), (5, 64, 70), (9, 300, 30)]
QUANT_KINDS = [(8, 0), (4, 32), (4, 128), (4, 10)]


def _quant_request(a, q, s, z, bits, group, bias, residual, unary, scalars, algorithm=None, int8_activations=False,
                   kc=0, path=-1):
    (m, k), n = a.shape, q.shape[0]
    s0, s1 = [*scalars, 0.0, 0.0][:2]
    name = "gelu_tanh" if unary == "gelu" and algorithm == "tanh" else unary
    words = ["gemm_quant", bits, m, n, k, k if bits == 8 else group, kc, int(bias is not None),
             int(residual is not None), kernels.UNARY_CODES[name], s0, s1, int(int8_activations), path]
    operands = [a, q, s.float(), *([z.float()] if z is not None else []), *([bias] if bias is not None else []),
                *([residual] if residual is not None else [])]
    return words, operands, torch.float32, m * n


def test_quantized_gemm_every_epilogue(neon):
    from tests.quant.test_quantized_gemm import _check as quant_check
    from tests.quant.test_quantized_gemm import _quantized
    from tests.quant.test_quantized_gemm import _reference as quant_reference

    requests, expected = [], []
    for m, k, n in QUANT_SHAPES:
        for bits, group in QUANT_KINDS:
            q, s, z, w = _quantized(n, k, bits, group, seed=m + k + n)
            g = torch.Generator().manual_seed(k)
            a, bias, residual = torch.randn(m, k, generator=g), torch.randn(n, generator=g), torch.randn(m, n, generator=g)
            for unary, scalars, algorithm in EPILOGUES:
                for b, r in [(None, None), (bias, residual)]:
                    kc = 128 if m == 9 else 0
                    requests.append(_quant_request(a, q, s, z, bits, group, b, r, unary, scalars, algorithm, kc=kc))
                    expected.append((f"int{bits} g{group} {m}x{k}x{n} {unary} bias/residual={b is not None}",
                                     quant_reference(a, w, b, unary, scalars, algorithm, r), m, n, k))
    for (label, reference, m, n, k), out in zip(expected, neon.run(requests)):
        try:
            quant_check(out.view(m, n), reference, k)
        except AssertionError as error:
            raise AssertionError(f"{label}: max relative error {error}") from None


def test_quantized_gemm_paths_and_int8_activations(neon):
    """NEON has one int4 path (float32) and no integer products: the path chosen says so without
    measuring, and int8 activations run the float32 GEMM over the quantized rows."""
    from tests.quant.test_quantized_gemm import _check as quant_check
    from tests.quant.test_quantized_gemm import _quantized
    from tests.quant.test_quantized_gemm import _reference as quant_reference
    from kiln.quant.weights import quantize_activations

    shapes = [(1, 256, 40, 32), (3, 130, 29, 10), (6, 64, 20, 64)]
    requests = [([f"quant_paths {m} {k} {n} {group}"], [], torch.int32, 5) for m, k, n, group in shapes]
    cases = []
    for m, k, n, group in shapes:
        q, s, z, w = _quantized(n, k, 4, group, seed=k)
        g = torch.Generator().manual_seed(n)
        a, bias = torch.randn(m, k, generator=g), torch.randn(n, generator=g)
        requests.append(_quant_request(a, q, s, z, 4, group, bias, None, "relu", [], int8_activations=True))
        cases.append((quant_reference(quantize_activations(a, group), w, bias, "relu", [], None, None), m, n, k))
    results = neon.run(requests)
    for paths in results[:len(shapes)]:
        assert paths.tolist() == [0, 0, 0, 0, 0], "NEON took a path other than float32, or integer products"
    for (reference, m, n, k), out in zip(cases, results[len(shapes):]):
        quant_check(out.view(m, n), reference, k)


def test_quantized_gemm_by_dot_products(neon_dotprod):
    """Built with armv8.2-a's dot products, int4 at 4 rows or fewer has the int8 digits' path and
    int8 activations the integer one (sdot in place of x86's vpdpbusd), groups of a multiple of 8,
    and int8 weights take the digits by default (sdot reads their bytes signed), two digits a group
    at int4 weights and three at int8 ones, as on x86: each against float64 over the activations
    as that path carries them (the x86 tests' references)."""
    from tests.quant.test_quantized_gemm import INT8_DIGIT_GROUP, _quantized, digits_of
    from tests.quant.test_quantized_gemm import _check as quant_check
    from tests.quant.test_quantized_gemm import _reference as quant_reference
    from kiln.quant.weights import quantize_activations

    shapes = [(1, 256, 40, 32), (1, 133, 811, 32), (2, 200, 29, 8), (3, 130, 50, 64), (4, 264, 97, 24), (1, 130, 70, 10)]
    requests = [([f"quant_paths {m} {k} {n} {group}"], [], torch.int32, 5) for m, k, n, group in shapes]
    cases = []
    for m, k, n, group in shapes:
        q, s, z, w = _quantized(n, k, 4, group, seed=k + n)
        g = torch.Generator().manual_seed(n)
        a, bias, residual = torch.randn(m, k, generator=g), torch.randn(n, generator=g), torch.randn(m, n, generator=g)
        a[0, :group] = 0  # an all-zero group
        whole_words = group % 8 == 0
        for unary, scalars, algorithm in EPILOGUES[:4]:
            requests.append(_quant_request(a, q, s, z, 4, group, bias, residual, unary, scalars, algorithm, path=2))
            carried = digits_of(a, group, 2) if whole_words else a  # (else the float32 path)
            cases.append((f"{m}x{k}x{n} g{group} digits {unary}", carried, w, bias, unary, scalars, algorithm, residual))
            requests.append(_quant_request(a, q, s, z, 4, group, bias, residual, unary, scalars, algorithm,
                                           int8_activations=True))
            cases.append((f"{m}x{k}x{n} g{group} int8 activations {unary}", quantize_activations(a, group), w, bias,
                          unary, scalars, algorithm, residual))
        q8, s8, _, w8 = _quantized(n, k, 8, 0, seed=k + n)
        for unary, scalars, algorithm in EPILOGUES[:4]:
            requests.append(_quant_request(a, q8, s8, None, 8, 0, bias, residual, unary, scalars, algorithm))
            cases.append((f"{m}x{k}x{n} int8 weights {unary}", digits_of(a, INT8_DIGIT_GROUP, 3), w8, bias, unary, scalars,
                          algorithm, residual))
    results = neon_dotprod.run(requests)
    for (m, k, n, group), paths in zip(shapes, results):
        assert paths[1].item() == int(group % 8 == 0), f"{m}x{k}x{n} g{group}: integer products {paths.tolist()}"
        assert paths[2].item() == 2, f"{m}x{k}x{n}: int8 weights took path {paths[2].item()}, not the digits"
        assert paths[3:].tolist() == [2, 3], f"{m}x{k}x{n}: digits at int4, int8 weights {paths[3:].tolist()}"
    for (label, carried, w, bias, unary, scalars, algorithm, residual), out in zip(cases, results[len(shapes):]):
        m, n = carried.shape[0], w.shape[0]
        try:
            quant_check(out.view(m, n), quant_reference(carried, w, bias, unary, scalars, algorithm, residual),
                        carried.shape[1])
        except AssertionError as error:
            raise AssertionError(f"{label}: max relative error {error}") from None


# ---------------------------------------------------------------- the depthwise convolution

# (batch, channels, height, width, kernel, stride, padding, dilation): 3 x 3 and 7 x 7 at strides 1
# (the unit-stride blocks) and 2, dilation 2; no channel count a multiple of the 4 lanes.
DEPTHWISE_SHAPES = [(1, 19, 9, 11, 3, 1, 1, 1), (2, 10, 12, 13, 7, 2, 3, 1), (1, 6, 10, 10, 7, 1, 3, 1),
                    (1, 13, 10, 9, 3, 2, 1, 1), (1, 7, 9, 9, 3, 1, 2, 2)]


def test_depthwise_convolution(neon):
    requests, expected = [], []
    for n, c, h, w, k, s, p, d in DEPTHWISE_SHAPES:
        g = torch.Generator().manual_seed(c * h + k)
        x, weight = torch.randn(n, c, h, w, generator=g), torch.randn(c, 1, k, k, generator=g)
        bias = torch.randn(c, generator=g)
        oh, ow = (h + 2 * p - d * (k - 1) - 1) // s + 1, (w + 2 * p - d * (k - 1) - 1) // s + 1
        other = torch.randn(n, c, oh, ow, generator=g)
        for unary in depthwise_tests.UNARY:
            for with_bias, with_other in [(False, False), (True, False), (True, True)]:
                s0, s1 = [*depthwise_tests.SCALARS.get(unary, ()), 0.0, 0.0][:2]
                words = ["depthwise", n, h, w, c, k, k, oh, ow, s, s, p, p, d, d, int(with_bias), int(with_other),
                         kernels.UNARY_CODES[unary], s0, s1]
                channels_last = [x.permute(0, 2, 3, 1), weight, *([bias] if with_bias else []),
                                 *([other.permute(0, 2, 3, 1)] if with_other else [])]
                requests.append((words, channels_last, torch.float32, n * oh * ow * c))
                reference = depthwise_tests._reference(x.double(), weight.double(),
                                                       bias.double() if with_bias else None, s, p, d,
                                                       other.double() if with_other else None, unary)
                label = f"{n}x{c}x{h}x{w} k={k} s={s} p={p} d={d} {unary} bias={with_bias} other={with_other}"
                expected.append((label, reference.permute(0, 2, 3, 1).float()))
    for (label, reference), y in zip(expected, neon.run(requests)):
        torch.testing.assert_close(y.view(reference.shape), reference, rtol=1e-5, atol=1e-5,
                                   msg=lambda message: f"{label}: {message}")


# ---------------------------------------------------------------- vector math of the epilogue


@pytest.mark.parametrize("name", ["exp", "log", "erf", "tanh", "sigmoid"])
def test_vector_math(neon, name):
    # test_vec_math.py's inputs (special values, wide ranges, overflow and underflow edges) and bounds.
    x = vec_math_tests.unary_inputs(name)
    [y] = neon.run([(["vmath", name, len(x)], [x], torch.float32, len(x))])
    vec_math_tests.check(y, vec_math_tests.UNARY[name](x.double()), vec_math_tests.F32_BOUND[name], f"NEON {name}")


def test_float16_rounding(neon):
    # kiln_fp16 on __fp16 (g++ 12 has no _Float16 in C++ on aarch64): round to nearest even, ties
    # included, gradual underflow, overflow to inf, NaN; bit for bit as torch's float16.
    g = torch.Generator().manual_seed(16)
    ties = 1 + torch.arange(0, 64, dtype=torch.float64) * 2.0**-11  # every other one halfway between float16s
    x = vec_math_tests.f32(vec_math_tests.SPECIAL, vec_math_tests.log_spaced(g, -9, 5, 4000), ties, -ties,
                           [65504.0, 65519.0, 65520.0, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 2.0**-14 * (1 - 2.0**-11)])
    [y] = neon.run([(["round_fp16", len(x)], [x], torch.float32, len(x))])
    want = x.half().float()
    same = (y.view(torch.int32) == want.view(torch.int32)) | (y.isnan() & want.isnan())
    assert same.all(), [(x[i].item(), y[i].item(), want[i].item()) for i in (~same).nonzero().flatten()[:5]]
