"""kiln_vec_math.h against eager PyTorch: accuracy over wide input ranges and exact special values.

A small C++ harness runs every function over an array in vector steps (float x16, double x16 and
float x4, with a partly filled last vector) and is compiled once for the module. float64 torch is the
reference: float32 results must be within a few ulp (relative error where the reference is a
normal float), and NaN, inf, signed zeros and gradual underflow must come out as they should.
"""

import ctypes
import math
import subprocess
import zlib
from pathlib import Path

import pytest
import torch

import kiln
from kiln.native import build as cpp_compile

HEADER = Path(kiln.__file__).parent / "native" / "include" / "kiln_vec_math.h"


def sigmoid_reference(x):
    # torch.sigmoid computes 1/(1 + e^-x), which flushes to 0 once e^-x overflows (x < -709 in
    # float64); e^x/(1 + e^x) keeps the denormal results that kiln_vsigmoid gives.
    e = torch.exp(-x.abs())
    return torch.where(x < 0, e, 1.0) / (1 + e)


UNARY = {
    "exp": torch.exp, "expm1": torch.expm1, "log": torch.log, "log1p": torch.log1p,
    "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal,
    "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "tanh": torch.tanh, "sigmoid": sigmoid_reference,
    "erf": torch.erf, "erfc": torch.erfc, "atan": torch.atan, "asin": torch.asin, "acos": torch.acos,
    "sinh": torch.sinh, "cosh": torch.cosh, "abs": torch.abs, "floor": torch.floor, "ceil": torch.ceil,
    "trunc": torch.trunc, "round": torch.round, "sign": torch.sign, "lgamma": torch.lgamma,
}
BINARY = {"pow": torch.pow, "atan2": torch.atan2, "maximum": torch.maximum, "minimum": torch.minimum}

# Max relative error of float32 results where the reference is a normal float32 (2^-24 = 6e-8 is
# half an ulp at most: correct rounding). Functions not listed must equal eager exactly.
F32_BOUND = {
    "sqrt": 2**-24, "reciprocal": 2**-24, "rsqrt": 2**-23,  # exact (eager's float32 sqrt is not)
    "exp": 4e-7, "expm1": 4e-7, "log": 4e-7, "log1p": 4e-7, "tanh": 4e-7, "sigmoid": 4e-7, "erf": 4e-7,
    "erfc": 4e-7, "sin": 4e-7, "cos": 4e-7, "tan": 4e-7, "atan": 4e-7, "asin": 4e-7, "acos": 4e-7,
    "sinh": 4e-7, "cosh": 4e-7, "pow": 2e-7, "atan2": 4e-7,
}
F64_BOUND = 1e-15  # lane loops over libm, against torch's own (Sleef or libm) float64

HARNESS = r"""
#include <cstdint>
#include <cstring>
typedef float F16 __attribute__((vector_size(64)));
typedef double D16 __attribute__((vector_size(128)));
typedef float F4 __attribute__((vector_size(16)));

// f over n elements in vector steps; the last, partly filled vector is padded with ones.
template <class V, class T, class F> static void run(const T* x, const T* y, T* out, int64_t n, F f) {
  constexpr int64_t L = sizeof(V) / sizeof(T);
  for (int64_t i = 0; i < n; i += L) {
    int64_t k = n - i < L ? n - i : L;
    V a = V{} + 1, b = V{} + 1;
    std::memcpy(&a, x + i, k * sizeof(T));
    if (y) std::memcpy(&b, y + i, k * sizeof(T));
    V r = f(a, b);
    std::memcpy(out + i, &r, k * sizeof(T));
  }
}
#define UNARY(name)                                                                            \
  extern "C" void f_##name(const float* x, float* o, int64_t n) {                              \
    run<F16>(x, (const float*)nullptr, o, n, [](F16 a, F16) { return kiln_v##name(a); });      \
  }                                                                                            \
  extern "C" void d_##name(const double* x, double* o, int64_t n) {                            \
    run<D16>(x, (const double*)nullptr, o, n, [](D16 a, D16) { return kiln_v##name(a); });     \
  }                                                                                            \
  extern "C" void q_##name(const float* x, float* o, int64_t n) {                              \
    run<F4>(x, (const float*)nullptr, o, n, [](F4 a, F4) { return kiln_v##name(a); });        \
  }
#define BINARY(name)                                                                           \
  extern "C" void f_##name(const float* x, const float* y, float* o, int64_t n) {              \
    run<F16>(x, y, o, n, [](F16 a, F16 b) { return kiln_v##name(a, b); });                     \
  }                                                                                            \
  extern "C" void d_##name(const double* x, const double* y, double* o, int64_t n) {           \
    run<D16>(x, y, o, n, [](D16 a, D16 b) { return kiln_v##name(a, b); });                     \
  }                                                                                            \
  extern "C" void q_##name(const float* x, const float* y, float* o, int64_t n) {              \
    run<F4>(x, y, o, n, [](F4 a, F4 b) { return kiln_v##name(a, b); });                        \
  }
"""


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    # The arrays here are small; on a busy machine torch's thread pool costs more than it saves.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    # The header's text goes into the source itself, so the compile cache key covers it.
    source = "\n".join(
        [HEADER.read_text(), HARNESS]
        + [f"UNARY({name})" for name in UNARY]
        + [f"BINARY({name})" for name in BINARY]
    )
    with kiln.config.patch({"cache.dir": str(tmp_path_factory.mktemp("cache"))}):
        return cpp_compile.load_library(source)


def call(lib, name, *args, lanes=16):
    """kiln_v<name> over the tensors args (all float32 or all float64), in vectors of `lanes`."""
    args = [a.contiguous() for a in args]
    out = torch.empty_like(args[0])
    prefix = "q" if lanes == 4 else "f" if args[0].dtype == torch.float32 else "d"
    pointers = [ctypes.c_void_p(t.data_ptr()) for t in (*args, out)]
    getattr(lib, f"{prefix}_{name}")(*pointers, ctypes.c_int64(len(out)))
    return out


# ---------------------------------------------------------------- inputs

SPECIAL = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, 0.5, -0.5, 2.0, 1e-40, -1e-40, 1.4e-45,
           -1.4e-45, 1.1754944e-38, 3.4028235e38, -3.4028235e38, 1e-20, -1e-20, 1e20, -1e20]


def f32(*parts):
    return torch.cat([torch.as_tensor(p, dtype=torch.float64).flatten() for p in parts]).float()


def uniform(gen, lo, hi, n):
    return lo + (hi - lo) * torch.rand(n, generator=gen, dtype=torch.float64)


def log_spaced(gen, lo_exp, hi_exp, n):
    """Magnitudes 10^[lo_exp, hi_exp], both signs."""
    m = 10 ** uniform(gen, lo_exp, hi_exp, n)
    return torch.cat([m, -m])


def around(points, ulps=2):
    """The float32 points and their neighbours within `ulps`."""
    p = torch.as_tensor(points, dtype=torch.float64).float()
    out = [p]
    up, down = p, p
    for _ in range(ulps):
        up = torch.nextafter(up, up.new_tensor(math.inf))
        down = torch.nextafter(down, down.new_tensor(-math.inf))
        out += [up, down]
    return torch.cat(out)


def unary_inputs(name):
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    parts = [SPECIAL, log_spaced(gen, -45, 38.5, 6000), uniform(gen, -10, 10, 6000)]
    if name in ("exp", "expm1", "sigmoid", "tanh", "sinh", "cosh"):
        # overflow at 88.72 (89.41 for sinh/cosh), denormal results below -87.34, zero below -103.97
        edges = [88.7228, 89.4159, -87.3365, -103.9721, -103.2789]
        parts += [uniform(gen, -110, 95, 6000), around(edges, 40), uniform(gen, -1, 1, 3000)]
    if name in ("log", "log1p"):
        parts += [uniform(gen, 0, 4, 6000), uniform(gen, 0.9, 1.1, 3000), uniform(gen, -1, 1, 6000),
                  around([-1.0, 1.0, 0.70710678, 1.41421356, 2.0**-126], 20)]
    if name in ("sin", "cos", "tan"):
        k = torch.randint(-60000, 60000, (8000,), generator=gen, dtype=torch.float64)
        parts += [around(k * math.pi / 2), around(torch.arange(-64.0, 64.0) * math.pi / 2),
                  uniform(gen, -1e5, 1e5, 6000), uniform(gen, -4, 4, 6000),
                  [2e5, -3e5, 1e7, -1e7, 8e9, 1e30]]  # the libm fallback for huge |x|
    if name in ("erf", "erfc"):
        parts += [uniform(gen, -11, 11, 6000), uniform(gen, -1.2, 1.2, 6000),
                  around([0.5, 1.0, 4.0, 9.19, 10.05], 10)]
    if name in ("asin", "acos", "atan"):
        parts += [uniform(gen, -1.1, 1.1, 8000), around([0.5, -0.5, 1.0, -1.0], 20)]
    if name in ("floor", "ceil", "trunc", "round"):
        parts += [uniform(gen, -5, 5, 3000).mul(2).round().div(2), around([2.0**23, 2.0**24, -(2.0**23)], 3)]
    if name == "lgamma":
        parts += [uniform(gen, -5, 5, 4000), torch.arange(-20, 20, dtype=torch.float64)]
    return f32(*parts)


def binary_inputs(name):
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    base = f32(SPECIAL, [3.0, -3.0, 0.25, -2.0, 1.5, -1.5, 1e-3, 0.999, 1.001, 10.0, 100.0, -100.0, 0.1])
    x, y = torch.meshgrid(base, base, indexing="ij")
    xs = [x.flatten(), f32(log_spaced(gen, -5, 5, 5000))]
    ys = [y.flatten(), f32(log_spaced(gen, -5, 5, 5000))]
    if name == "pow":
        xs += [f32(uniform(gen, 0, 3, 10000)), f32(uniform(gen, -4, 4, 4000))]
        ys += [f32(uniform(gen, -60, 60, 10000)), f32(torch.randint(-30, 30, (4000,), generator=gen))]
    if name == "atan2":
        xs += [f32(uniform(gen, -2, 2, 8000))]
        ys += [f32(uniform(gen, -2, 2, 8000))]
    return torch.cat(xs), torch.cat(ys)


# ---------------------------------------------------------------- checks


def check(out, ref64, bound, what):
    """out (float32 or float64) against the float64 reference: NaN, inf and signed zeros equal,
    relative error at most `bound` where the reference is normal, and gradual underflow."""
    dt = out.dtype
    ref = ref64.to(dt)
    tiny, big = torch.finfo(dt).tiny, torch.finfo(dt).max
    err = (out.double() - ref64).abs()

    def fail(mask):
        i = mask.nonzero().flatten()[:3].tolist()
        return f"{what}: {[(j, out[j].item(), ref64[j].item()) for j in i]}"

    assert torch.equal(out.isnan(), ref.isnan()), fail(out.isnan() != ref.isnan())
    # References a hair above the largest float may round either way; elsewhere inf must match.
    edge = (ref64.abs() > big * (1 - 1e-6)) & (ref64.abs() < big * (1 + 1e-6))
    inf = (out.isinf() | ref.isinf()) & ~edge
    assert torch.equal(out[inf], ref[inf]), fail(inf & (out != ref))
    zero = (out == 0) & (ref == 0)
    assert torch.equal(out[zero].signbit(), ref[zero].signbit()), fail(zero & (out.signbit() != ref.signbit()))
    finite = ref64.isfinite() & out.isfinite()
    normal = finite & (ref64.abs() >= tiny) & ~edge
    assert not (normal & (err > bound * ref64.abs())).any(), fail(normal & (err > bound * ref64.abs()))
    # Denormal (and underflowing) results within two denormal ulps: gradual underflow, no flushing.
    denormal_ulp = tiny * torch.finfo(dt).eps
    sub = finite & (ref64.abs() < tiny)
    assert not (sub & (err > 2 * denormal_ulp)).any(), fail(sub & (err > 2 * denormal_ulp))


def assert_exact(out, eager, zero_signs=True):
    torch.testing.assert_close(out, eager, rtol=0, atol=0, equal_nan=True)
    zero = (out == 0) & (eager == 0)
    assert not zero_signs or torch.equal(out[zero].signbit(), eager[zero].signbit()), "sign of zero"


@pytest.mark.parametrize("name", UNARY)
def test_unary_matches_torch(lib, name):
    x = unary_inputs(name)
    fn = UNARY[name]
    if name in F32_BOUND:
        check(call(lib, name, x), fn(x.double()), F32_BOUND[name], f"{name} float32")
        check(call(lib, name, x.double()), fn(x.double()), F64_BOUND, f"{name} float64")
    elif name == "lgamma":  # libm's lgamma; relative error means nothing at its zeros (1, 2, ...)
        xd = x.double()
        torch.testing.assert_close(call(lib, name, x), fn(xd).float(), rtol=1e-6, atol=1e-6, equal_nan=True)
        torch.testing.assert_close(call(lib, name, xd), fn(xd), rtol=F64_BOUND, atol=1e-14, equal_nan=True)
    else:
        assert_exact(call(lib, name, x), fn(x))
        assert_exact(call(lib, name, x.double()), fn(x.double()))


@pytest.mark.parametrize("name", BINARY)
def test_binary_matches_torch(lib, name):
    x, y = binary_inputs(name)
    fn = BINARY[name]
    xd, yd = x.double(), y.double()
    if name in F32_BOUND:
        check(call(lib, name, x, y), fn(xd, yd), F32_BOUND[name], f"{name} float32")
        check(call(lib, name, xd, yd), fn(xd, yd), F64_BOUND, f"{name} float64")
    else:  # maximum/minimum: which of two tied zeros comes out differs even within eager
        assert_exact(call(lib, name, x, y), fn(x, y), zero_signs=False)
        assert_exact(call(lib, name, xd, yd), fn(xd, yd), zero_signs=False)


@pytest.mark.parametrize("name", [*UNARY, *BINARY])
def test_results_do_not_depend_on_the_lane_count(lib, name):
    args = [unary_inputs(name)] if name in UNARY else binary_inputs(name)
    x16, x4 = call(lib, name, *args), call(lib, name, *args, lanes=4)
    assert torch.equal(x16.view(torch.int32), x4.view(torch.int32))


SPECIAL_CASES = [  # (function, inputs, expected float32 results): C's libm, and gradual underflow
    ("exp", [-math.inf, math.inf, 88.73, -104.0, -100.0, -0.0], [0.0, math.inf, math.inf, 0.0, 3.7835e-44, 1.0]),
    ("log", [0.0, -0.0, -1.0, math.inf, 1.0, 1e-45], [-math.inf, -math.inf, math.nan, math.inf, 0.0, -103.2789]),
    ("log1p", [-1.0, -2.0, math.inf, -0.0], [-math.inf, math.nan, math.inf, -0.0]),
    ("expm1", [-math.inf, math.inf, -0.0, 100.0], [-1.0, math.inf, -0.0, math.inf]),
    ("tanh", [math.inf, -math.inf, 20.0, -0.0], [1.0, -1.0, 1.0, -0.0]),
    ("sigmoid", [math.inf, -math.inf, 100.0, -100.0], [1.0, 0.0, 1.0, 3.7835e-44]),
    ("erf", [math.inf, -math.inf, -0.0, 5.0], [1.0, -1.0, -0.0, 1.0]),
    ("erfc", [math.inf, -math.inf, 11.0, -6.0], [0.0, 2.0, 0.0, 2.0]),
    ("sin", [math.inf, -0.0, 1e30], [math.nan, -0.0, -0.79116344]),
    ("rsqrt", [0.0, -0.0, -1.0, math.inf], [math.inf, -math.inf, math.nan, 0.0]),
    ("sign", [math.nan, -0.0, -3.0, math.inf], [0.0, 0.0, -1.0, 1.0]),  # eager: NaN -> 0
    ("round", [0.5, 1.5, 2.5, -0.5, -2.5], [0.0, 2.0, 2.0, -0.0, -2.0]),
    ("floor", [-0.5, -0.0, 0.5], [-1.0, -0.0, 0.0]),
    ("ceil", [-0.5, 0.5, -1.0], [-0.0, 1.0, -1.0]),
    ("atan", [math.inf, -math.inf, -0.0], [math.pi / 2, -math.pi / 2, -0.0]),
    ("acos", [1.0, -1.0, 1.5], [0.0, math.pi, math.nan]),
]


@pytest.mark.parametrize("name, inputs, expected", SPECIAL_CASES, ids=[c[0] for c in SPECIAL_CASES])
def test_special_values(lib, name, inputs, expected):
    out = call(lib, name, torch.tensor(inputs))
    expected = torch.tensor(expected)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=0, equal_nan=True)
    assert torch.equal(out.signbit()[expected == 0], expected.signbit()[expected == 0])


def test_pow_special_cases_follow_std_pow(lib):
    nan, inf = math.nan, math.inf
    cases = [  # x, y, pow(x, y) as C's pow defines it
        (nan, 0.0, 1.0), (1.0, nan, 1.0), (-1.0, inf, 1.0), (-1.0, -inf, 1.0), (-2.0, 3.0, -8.0),
        (-2.0, 0.5, nan), (-0.0, -3.0, -inf), (-0.0, -2.0, inf), (0.0, -1.0, inf), (-0.0, 3.0, -0.0),
        (-0.0, 0.5, 0.0), (0.5, inf, 0.0), (0.5, -inf, inf), (2.0, -inf, 0.0), (-inf, 3.0, -inf),
        (-inf, -3.0, -0.0), (-inf, 0.5, inf), (inf, -0.5, 0.0), (2.0, 128.0, inf), (2.0, -150.0, 0.0),
        (2.0, -149.0, 1.4e-45), (-8.0, 1.0 / 3.0, nan), (nan, 1.0, nan), (1.0, inf, 1.0),
    ]
    x, y, expected = (torch.tensor(c) for c in zip(*cases))
    out = call(lib, "pow", x, y)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=0, equal_nan=True)
    assert torch.equal(out.signbit()[expected == 0], expected.signbit()[expected == 0])
    torch.testing.assert_close(out, torch.pow(x, y), rtol=1e-6, atol=0, equal_nan=True)


def test_atan2_signed_zeros_and_infinities(lib):
    z, inf = 0.0, math.inf
    y = torch.tensor([z, -z, z, -z, inf, inf, -inf, -inf, 1.0, -1.0, inf, 1e-45, 3e38])
    x = torch.tensor([z, z, -z, -z, inf, -inf, inf, -inf, -inf, -inf, 1.0, 1e38, -3e38])
    out, ref = call(lib, "atan2", y, x), torch.atan2(y.double(), x.double()).float()
    torch.testing.assert_close(out, ref, rtol=2e-7, atol=0)
    assert torch.equal(out.signbit(), ref.signbit())


def test_exp_and_friends_are_vectorized(tmp_path):
    """No libm call, and no call at all, left in the float32 functions that have vector algorithms,
    at the vector width kernels use on this machine (kiln_vec.h: 64 bytes with AVX-512, 32 with
    AVX2; GCC may call a helper out of line for vectors wider than the machine's)."""
    probes = {"exp": "expf", "log": "logf", "tanh": "tanhf", "erf": "erff", "sigmoid": "expf"}
    src = tmp_path / "probe.cpp"
    src.write_text(
        f'#include "{HEADER}"\n'
        # the register width kiln_vec.h picks for kernels
        "#if defined(__AVX512F__)\n#define W 64\n#elif defined(__AVX__)\n#define W 32\n#else\n#define W 16\n#endif\n"
        "typedef float FV __attribute__((vector_size(W)));\n"
        + "".join(f'extern "C" FV probe_{n}(FV x) {{ return kiln_v{n}(x); }}\n' for n in probes)
    )
    cxx, _ = cpp_compile.compiler()
    flags = [f for f in cpp_compile.FLAGS if f not in ("-shared", "-fPIC")]
    asm = tmp_path / "probe.s"
    subprocess.run([cxx, *flags, "-S", str(src), "-o", str(asm)], check=True, capture_output=True)
    text = asm.read_text()
    for name, libm in probes.items():
        body = text.split(f"probe_{name}:", 1)[1].split(".cfi_endproc", 1)[0]
        assert libm not in body and "call" not in body, f"kiln_v{name} calls out:\n{body[:2000]}"
