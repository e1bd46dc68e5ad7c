"""kiln_vec.h on vectors of 64-bit lanes (int64, double), which span two registers: comparisons,
select, max/min, relu and to_bool work on each register-wide half. Checked lane by lane against
scalar C++ on this machine's ISA and the narrower x86 ones, and in the assembly: no lane-by-lane
scalar compares (GCC's own lowering of a wide vector compare, about a hundred instructions)."""

import ctypes
import re
import subprocess

import numpy as np
import pytest

from kiln.native import build, header_text

HARNESS = r"""
#include <cmath>
template <typename T> static void run(const T* a, const T* b, const int32_t* c, int32_t* masks, T* out) {
  using V = kiln::vec<T>;
  const V va = kiln::load<T>(a), vb = kiln::load<T>(b);
  kiln::mask m;
  std::memcpy(&m.m, c, sizeof(m.m));
  const kiln::mask found[] = {kiln::veq(va, vb), kiln::vne(va, vb), kiln::vlt(va, vb), kiln::vle(va, vb),
                              kiln::vgt(va, vb), kiln::vge(va, vb), kiln::to_bool(va)};
  for (int k = 0; k < 7; ++k) std::memcpy(masks + k * kiln::L, &found[k].m, sizeof(found[k].m));
  const V results[] = {kiln::select(m, va, vb), kiln::vmax(va, vb), kiln::vmin(va, vb), kiln::vrelu(va)};
  for (int k = 0; k < 4; ++k) std::memcpy(out + k * kiln::L, &results[k], sizeof(V));
}
extern "C" int lanes() { return kiln::L; }
extern "C" void run_i64(const int64_t* a, const int64_t* b, const int32_t* c, int32_t* masks, int64_t* out) { run(a, b, c, masks, out); }
extern "C" void run_f64(const double* a, const double* b, const int32_t* c, int32_t* masks, double* out) { run(a, b, c, masks, out); }
extern "C" kiln::mask compare_i64(kiln::vec<int64_t> a, kiln::vec<int64_t> b) { return kiln::vlt(a, b); }
"""

ISAS = {"native": [], "avx2": ["-march=x86-64-v3"], "sse4": ["-march=x86-64-v2"]}


def _x86() -> bool:
    return "x86_64" in subprocess.run(["uname", "-m"], capture_output=True, text=True).stdout


def _build(tmp_path, flags, *extra):
    src = tmp_path / "wide.cpp"
    src.write_text(header_text() + HARNESS)
    cxx, _ = build.compiler()
    out = tmp_path / ("wide.s" if "-S" in extra else "wide.so")
    subprocess.run([cxx, *build.FLAGS, *flags, *extra, str(src), "-o", str(out)], check=True, capture_output=True)
    return out


@pytest.mark.parametrize("isa", list(ISAS))
def test_wide_vectors_match_scalar_code(isa, tmp_path):
    if isa != "native" and not _x86():
        pytest.skip("x86 ISAs")
    lib = ctypes.CDLL(str(_build(tmp_path, ISAS[isa], "-shared")))
    lanes = lib.lanes()
    rng = np.random.default_rng(0)
    cases = {"i64": (np.int64, lambda: rng.integers(-3, 4, lanes, dtype=np.int64)),
             "f64": (np.float64, lambda: rng.choice([-2.0, -0.0, 0.0, 1.5, np.nan, np.inf], lanes))}
    for name, (dtype, draw) in cases.items():
        for _ in range(20):
            a, b = draw(), draw()
            c = np.where(rng.random(lanes) < 0.5, -1, 0).astype(np.int32)
            masks, out = np.zeros(7 * lanes, np.int32), np.zeros(4 * lanes, dtype)
            getattr(lib, f"run_{name}")(*(x.ctypes.data_as(ctypes.c_void_p) for x in (a, b, c, masks, out)))
            with np.errstate(invalid="ignore"):
                expected_masks = [a == b, a != b, a < b, a <= b, a > b, a >= b, a != 0]
            for k, expected in enumerate(expected_masks):
                np.testing.assert_array_equal(masks[k * lanes:(k + 1) * lanes], np.where(expected, -1, 0))
            nan = np.isnan(a) | np.isnan(b) if dtype == np.float64 else np.zeros(lanes, bool)
            with np.errstate(invalid="ignore"):
                expected_out = [np.where(c != 0, a, b), np.where(nan, np.nan, np.maximum(a, b)),
                                np.where(nan, np.nan, np.minimum(a, b)), np.where(a < 0, 0, a)]
            for k, expected in enumerate(expected_out):
                np.testing.assert_array_equal(out[k * lanes:(k + 1) * lanes], expected.astype(dtype))


def test_a_wide_compare_is_not_lane_by_lane_scalar_code(tmp_path):
    if not _x86():
        pytest.skip("x86 assembly")
    asm = _build(tmp_path, [], "-S").read_text()
    body = asm[asm.index("compare_i64:"):]
    body = body[:body.index("ret")]
    assert not re.findall(r"\bset(l|le|g|ge|b|be|a|ae|e|ne)\b", body), body
