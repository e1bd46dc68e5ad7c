"""A schedule's kernels as one Python module of Triton kernels.

The module holds a preamble (imports, and the `kiln_*` helpers the printers call), each kernel's
`@triton.jit` functions, and for each kernel a launcher `def kernel_<hash>(*tensors)` that
launches them on their grids: what the wrapper calls, as it calls a C++ kernel. Each launch is an
object made once beside its launcher, `kernel_<hash>_launch0 = kiln_launch(fn, grid, sizes...,
BLOCKS=...)`, called with the tensors (kiln/runtime/triton_launch.py). Kernels are
named by a hash of their text, so identical kernels of repeated layers are one function. The
runtime (kiln/runtime/triton_kernels.py) writes the module to the cache and imports it; it
binds `libdevice` (NVIDIA's math library, or its stand-in under Triton's interpreter),
`kiln_error_flag` (the tensor indirect indices report to) and `kiln_launch` before the module runs.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

from kiln.codegen.triton.kernel import JitFunction, kernel_source
from kiln.ir.schedule import FusedKernel

_PLACEHOLDER = "KILN_KERNEL"

PREAMBLE = '''\
import torch
import triton
import triton.language as tl

# Bound by the loader before this module runs: `libdevice`, `kiln_error_flag`, `kiln_do_bench`
# (how the autotuner times a config: Triton's own over a few milliseconds, on a GPU) and
# `kiln_launch` (a launch: through Triton's `fn[grid](...)` each time, or on a GPU resolved once
# to its compiled binary).


@triton.jit
def kiln_maximum(a, b):
    # NaN wins, as in eager's maximum.
    if a.dtype.is_floating():
        return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
    else:
        return tl.maximum(a, b)


@triton.jit
def kiln_minimum(a, b):
    if a.dtype.is_floating():
        return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
    else:
        return tl.minimum(a, b)


@triton.jit
def kiln_add(a, b):
    return a + b


@triton.jit
def kiln_multiply(a, b):
    return a * b


@triton.jit
def kiln_floordiv(a, b):
    if a.dtype.is_floating():
        return libdevice.floor(a / b)
    else:
        # Triton's // rounds toward zero.
        quotient = a // b
        return tl.where((a % b != 0) & ((a < 0) != (b < 0)), quotient - 1, quotient)


@triton.jit
def kiln_remainder(a, b):
    # The sign of the divisor, as eager's remainder (Triton's % takes the dividend's).
    if a.dtype.is_floating():
        r = libdevice.fmod(a, b)
    else:
        r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def kiln_round_bf16(x):
    # float32 to the nearest bfloat16, ties to even, held in float32 (what the GPU's conversion
    # does; Triton's interpreter truncates instead, so kernels round here, on both).
    bits = x.to(tl.uint32, bitcast=True)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return tl.where(x != x, x, rounded.to(tl.float32, bitcast=True))


@triton.jit
def kiln_rand(seed, offset):
    # Philox4x32-10 of the counter (offset, 0, 0) under the key (seed), as kiln/ir/philox.py and
    # kiln_scalar.h: a float32 in [0, 1) from the first word's top 24 bits.
    s = seed.to(tl.int64)
    o = offset.to(tl.int64) + s * 0
    s = s + o * 0
    c0 = (o & 0xFFFFFFFF).to(tl.uint32)
    c1 = ((o >> 32) & 0xFFFFFFFF).to(tl.uint32)
    c2 = c0 * 0
    c3 = c0 * 0
    k0 = (s & 0xFFFFFFFF).to(tl.uint32)
    k1 = ((s >> 32) & 0xFFFFFFFF).to(tl.uint32)
    m0 = tl.full([], 0xD2511F53, tl.uint32)
    m1 = tl.full([], 0xCD9E8D57, tl.uint32)
    w0 = tl.full([], 0x9E3779B9, tl.uint32)
    w1 = tl.full([], 0xBB67AE85, tl.uint32)
    for _ in tl.static_range(10):
        n0 = tl.umulhi(c2, m1) ^ c1 ^ k0
        n2 = tl.umulhi(c0, m0) ^ c3 ^ k1
        c1 = c2 * m1
        c3 = c0 * m0
        c0 = n0
        c2 = n2
        k0 = k0 + w0
        k1 = k1 + w1
    return (c0 >> 8).to(tl.float32) * (1.0 / 16777216.0)


@triton.jit
def kiln_zeta_tail_term(tail, settled, total, coefficient, rising, x, s, a, k):
    # One term of kiln_zeta's tail, added until a term no longer changes the sum; then the next
    # term's rising factorial and power.
    term = coefficient * rising * x
    tail = tl.where(settled, tail, tail + term)
    settled = settled | (tl.abs(term) <= 1e-17 * tl.abs(total + tail))
    return tail, settled, rising * (s + k) * (s + k + 1), x / (a * a)


@triton.jit
def kiln_zeta(s_in, q_in):
    # Hurwitz zeta in float64, kiln_special.h's steps: terms (q + k)^-s while q + k < max(10, s)
    # (at most 64 of them: below q = -54 the sum starts short), stopping once
    # the rest cannot matter, then the Euler-Maclaurin tail; eager's values at the edges.
    s = s_in.to(tl.float64) + q_in.to(tl.float64) * 0
    q = q_in.to(tl.float64) + s * 0
    large = tl.maximum(s * 0 + 10.0, s)
    total = s * 0
    a = q
    finished = s != s
    for _ in tl.static_range(64):
        active = (a < large) & (finished == 0)
        term = libdevice.pow(a, -s)
        total = tl.where(active, total + term, total)
        finished = finished | (active & (a > 1) & (tl.abs(term) * (1 + (a + 1) / (s - 1)) <= 1e-17 * tl.abs(total)))
        a = tl.where(active & (finished == 0), a + 1, a)
    power = libdevice.pow(a, -s)
    tail = power * a / (s - 1) + power / 2
    rising = s
    x = power / a
    settled = finished
    # The Euler-Maclaurin tail: B_2j / (2j)! s (s+1) ... (s+2j-2) a^(-s-2j+1), j = 1..8.
    tail, settled, rising, x = kiln_zeta_tail_term(tail, settled, total, 1.0 / 12, rising, x, s, a, 1)
    tail, settled, rising, x = kiln_zeta_tail_term(tail, settled, total, -1.0 / 720, rising, x, s, a, 3)
    tail, settled, rising, x = kiln_zeta_tail_term(tail, settled, total, 1.0 / 30240, rising, x, s, a, 5)
    tail, settled, rising, x = kiln_zeta_tail_term(tail, settled, total, -1.0 / 1209600, rising, x, s, a, 7)
    tail, settled, rising, x = kiln_zeta_tail_term(tail, settled, total, 1.0 / 47900160, rising, x, s, a, 9)
    tail, settled, rising, x = kiln_zeta_tail_term(tail, settled, total, -691.0 / 1307674368000, rising, x, s, a, 11)
    tail, settled, rising, x = kiln_zeta_tail_term(tail, settled, total, 1.0 / 74724249600, rising, x, s, a, 13)
    tail, settled, rising, x = kiln_zeta_tail_term(tail, settled, total, -3617.0 / 10670622842880000, rising, x, s, a, 15)
    result = tl.where(finished, total, total + tail)
    integer_q = q == libdevice.floor(q)
    result = tl.where((q <= 0) & (s != libdevice.floor(s)), float("nan"), result)
    result = tl.where((q <= 0) & integer_q, float("inf"), result)
    infinite_s = tl.abs(s) == float("inf")
    result = tl.where(infinite_s, tl.where(q == 1, 1.0, tl.where(q < 1, float("inf"), float("nan"))), result)
    result = tl.where(s < 1, float("nan"), result)
    result = tl.where(s == 1, float("inf"), result)
    return result.to(q_in.dtype)


@triton.jit
def kiln_polygamma_n(n, x):
    # Order n >= 2: (-1)^(n+1) n! zeta(n + 1, x), in float64.
    order = n.to(tl.float64) + x.to(tl.float64) * 0
    sign = tl.where(order.to(tl.int64) % 2 == 1, 1.0, -1.0)
    return (sign * libdevice.exp(libdevice.lgamma(order + 1)) * kiln_zeta(order + 1, x.to(tl.float64))).to(x.dtype)


@triton.jit
def kiln_spherical_bessel_j0(x):
    # sin(x) / x in float64, 1 at 0 and 0 at the infinities (kiln_special.h).
    v = x.to(tl.float64)
    result = tl.where(v == 0, 1.0, libdevice.sin(v) / tl.where(v == 0, 1.0, v))
    return tl.where(tl.abs(v) == float("inf"), 0.0, result).to(x.dtype)


@triton.jit
def kiln_frexp_parts(x):
    # (mantissa in [0.5, 1) with x's sign, exponent) from x's bits, as std::frexp; subnormals are
    # scaled into the normal range first; 0, infinities and NaN keep x with exponent 0.
    if x.dtype == tl.float64:
        tiny = tl.abs(x) < 2.2250738585072014e-308
        v = tl.where(tiny, x * 18014398509481984.0, x)  # 2^54
        bits = v.to(tl.uint64, bitcast=True)
        field = ((bits >> 52) & 0x7FF).to(tl.int32)
        mantissa = ((bits & 0x800FFFFFFFFFFFFF) | (1022 << 52)).to(tl.float64, bitcast=True)
        exponent = field - 1022 - tl.where(tiny, 54, 0)
    else:
        tiny = tl.abs(x) < 1.1754943508222875e-38
        v = tl.where(tiny, x * 16777216.0, x)  # 2^24
        bits = v.to(tl.uint32, bitcast=True)
        field = ((bits >> 23) & 0xFF).to(tl.int32)
        mantissa = ((bits & 0x807FFFFF) | (126 << 23)).to(tl.float32, bitcast=True)
        exponent = field - 126 - tl.where(tiny, 24, 0)
    special = (x == 0) | (x != x) | (tl.abs(x) == float("inf"))
    return tl.where(special, x, mantissa), tl.where(special, 0, exponent)


@triton.jit
def kiln_frexp_mantissa(x):
    mantissa, _ = kiln_frexp_parts(x)
    return mantissa


@triton.jit
def kiln_frexp_exponent(x):
    _, exponent = kiln_frexp_parts(x)
    return exponent


@triton.jit
def kiln_sign(x):
    return (x > 0).to(x.dtype) - (x < 0).to(x.dtype)


@triton.jit
def kiln_pow(a, b):
    if a.dtype.is_floating():
        return libdevice.pow(a, b)
    else:
        # An integer power by squaring (63 steps cover every int64 exponent); a negative
        # exponent gives 0 unless the base is 1 or -1, as eager's integer pow.
        result = a * 0 + 1 + b * 0
        base = a + b * 0
        exponent = b + a * 0
        for _ in tl.static_range(63):
            result = tl.where((exponent & 1) != 0, result * base, result)
            base = base * base
            exponent = exponent >> 1
        odd = (b & 1) != 0
        negative = tl.where(a == 1, 1, tl.where(a == -1, tl.where(odd, -1, 1), 0))
        return tl.where(b < 0, negative.to(result.dtype), result)


@triton.jit
def kiln_shift_left(a, b):
    # Shifts by a negative amount or by the bit width or more give 0, as eager's kernels.
    bits = a.dtype.primitive_bitwidth
    return tl.where((b < 0) | (b >= bits), 0, a << b).to(a.dtype)


@triton.jit
def kiln_shift_right(a, b):
    bits = a.dtype.primitive_bitwidth
    return tl.where((b < 0) | (b >= bits), tl.where(a < 0, -1, 0), a >> b).to(a.dtype)


@triton.jit
def kiln_digamma(x):
    # In float64, as kiln's C++ (kiln_special.h): psi(x) = psi(x + 1) - 1/x up to x >= 10, then
    # the asymptotic series; psi(x) = psi(1 - x) - pi / tan(pi x) below 0; poles give NaN, 0 gives
    # -inf (+inf for -0).
    v = x.to(tl.float64)
    negative = v < 0
    y = tl.where(negative, 1 - v, v)
    shift = tl.where(negative, 0.0, 0.0).to(tl.float64)  # (not y * 0: NaN at y = inf)
    for _ in tl.static_range(10):
        small = y < 10
        shift = tl.where(small, shift - 1 / y, shift)
        y = tl.where(small, y + 1, y)
    z = 1 / (y * y)
    series = z * (1.0 / 12 + z * (-1.0 / 120 + z * (1.0 / 252 + z * (-1.0 / 240 + z * (1.0 / 132 + z * (
        -691.0 / 32760 + z * (1.0 / 12)))))))
    result = shift + libdevice.log(y) - 0.5 / y - series
    pi = 3.141592653589793
    result = tl.where(negative, result - pi / libdevice.tan(pi * (v - libdevice.trunc(v))), result)
    result = tl.where(negative & (v == libdevice.floor(v)), float("nan"), result)
    result = tl.where(v == 0, tl.where(libdevice.signbit(v) != 0, float("inf"), float("-inf")), result)
    return result.to(x.dtype)


@triton.jit
def kiln_trigamma(x):
    # Eager's steps in x's own type (ATen's trigamma; kiln_special.h trigamma_as_eager): near its
    # poles eager's float result carries float sin(pi x)'s rounding, and kiln matches it.
    pi = tl.full([], 3.141592653589793, x.dtype)
    reflect = x < 0.5
    sin_pi_x = libdevice.sin(pi * x)
    result = tl.where(reflect, -((pi * pi) / (sin_pi_x * sin_pi_x)), 0.0).to(x.dtype)
    y = tl.where(reflect, 1 - x, x)
    for _ in tl.static_range(6):
        result = result + 1 / (y * y)
        y = y + 1
    ixx = 1 / (y * y)
    result = result + (1 + 1 / (2 * y) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / y
    return tl.where(reflect, -result, result)


@triton.jit
def kiln_i0e(x):
    # exp(-|x|) I0(x) in float64: libdevice's I0 below 700, beyond it (where I0 overflows) the
    # asymptotic series, whose next term is below 1e-12 relative there.
    v = tl.abs(x.to(tl.float64))
    near = libdevice.cyl_bessel_i0(tl.minimum(v, 700.0)) * libdevice.exp(-tl.minimum(v, 700.0))
    t = 1 / v
    far = (1 + t * (0.125 + t * (0.0703125 + t * 0.0732421875))) / libdevice.sqrt(6.283185307179586 * v)
    return tl.where(v < 700, near, far).to(x.dtype)


@triton.jit
def kiln_i1e(x):
    # exp(-|x|) I1(x), odd, as kiln_i0e.
    v = tl.abs(x.to(tl.float64))
    near = libdevice.cyl_bessel_i1(tl.minimum(v, 700.0)) * libdevice.exp(-tl.minimum(v, 700.0))
    t = 1 / v
    far = (1 - t * (0.375 + t * (0.1171875 + t * 0.1025390625))) / libdevice.sqrt(6.283185307179586 * v)
    result = tl.where(v < 700, near, far)
    return tl.where(x < 0, -result, result).to(x.dtype)


@triton.jit
def kiln_greater(a, b):
    # For argmax: NaN is the largest value.
    return (a > b) | ((a != a) & (b == b))


@triton.jit
def kiln_less(a, b):
    # For argmin: NaN is taken as eagerly as by argmax.
    return (a < b) | ((a != a) & (b == b))


@triton.jit
def kiln_welford_combine(mean0, m20, count0, mean1, m21, count1):
    # Two parts' means, squared deviations from them and counts, as one part's (Chan et al.'s
    # pairwise update); empty parts (count 0) add nothing.
    count = count0 + count1
    delta = mean1 - mean0
    share = tl.where(count == 0, 0.0, count1 / tl.maximum(count, 1))
    return mean0 + delta * share, m20 + m21 + delta * delta * count0 * share, count


@triton.jit
def kiln_argmax_combine(value0, index0, value1, index1):
    # The larger value, or on a tie (NaN ties NaN) the first position.
    tie = (value0 == value1) | ((value0 != value0) & (value1 != value1))
    take = kiln_greater(value1, value0) | (tie & (index1 < index0))
    return tl.where(take, value1, value0), tl.where(take, index1, index0)


@triton.jit
def kiln_argmin_combine(value0, index0, value1, index1):
    tie = (value0 == value1) | ((value0 != value0) & (value1 != value1))
    take = kiln_less(value1, value0) | (tie & (index1 < index0))
    return tl.where(take, value1, value0), tl.where(take, index1, index0)
'''


@dataclass
class TritonKernels:
    """What the Triton printer made of a schedule's kernels (the C++ printer's CppKernels)."""

    kernels: dict[str, str] = field(default_factory=dict)  # jit function name -> its source
    launchers: dict[str, str] = field(default_factory=dict)  # launcher -> its source (and its warm-up's)
    functions: dict[str, str] = field(default_factory=dict)  # kernel name -> launcher
    jit: dict[str, list[JitFunction]] = field(default_factory=dict)  # launcher -> its jit functions
    checks: list[str] = field(default_factory=list)  # kernels after which the index-error flag is read
    vectorized: dict[str, bool] = field(default_factory=dict)  # kernel name -> True: every Triton kernel works on blocks
    arity: dict[str, int] = field(default_factory=dict)  # kernel name -> tensor arguments
    size_arguments: dict[str, list[str]] = field(default_factory=dict)  # none: Triton graphs are compiled per size

    @property
    def source(self) -> str:
        """The module's whole text."""
        every = ", ".join(f"{name}_precompile" for name in self.launchers)
        return "\n\n\n".join([PREAMBLE, *self.kernels.values(), *self.launchers.values(),
                                 f"KILN_PRECOMPILE = [{every}]"]) + "\n"


def triton_kernels(kernels: list[FusedKernel], device: str = "cpu", tune: str | None = None,
                   time_gemm: bool = False) -> TritonKernels:
    """Print every kernel for graphs on `device` (`tune`: block sizes chosen by Triton's
    autotuner; `time_gemm`: product kernels timed against the library's product; kernel.py);
    NotImplementedError for one Triton cannot express (symbolic sizes, an
    op libdevice lacks, a scatter with no atomic)."""
    printed = TritonKernels()
    for kernel in kernels:
        if not kernel.has_static_sizes:
            raise NotImplementedError("Triton kernels with symbolic sizes")
        made = kernel_source(kernel, _PLACEHOLDER, device, tune, time_gemm)
        precompile = "\n".join([f"def {_PLACEHOLDER}_precompile():", *(f"    {w}" for w in made.warmups or ["pass"])])
        functions = [_named_by_text(f) for f in made.functions]
        text = "\n\n\n".join([made.launcher, precompile])
        for before, after in zip(made.functions, functions):
            text = re.sub(rf"\b{before.name}\b", after.name, text)
        name = f"kernel_{hashlib.sha256((text + ''.join(f.name for f in functions)).encode()).hexdigest()[:16]}"
        printed.launchers.setdefault(name, text.replace(_PLACEHOLDER, name))
        printed.kernels.update((f.name, f.source) for f in functions)
        printed.jit.setdefault(name, functions)
        printed.functions[kernel.name] = name
        printed.arity[kernel.name] = len(kernel.inputs) + len(kernel.outputs)
        printed.vectorized[kernel.name] = True
        if made.uses_error_flag:
            printed.checks.append(kernel.name)
    return printed


def _named_by_text(function: JitFunction) -> JitFunction:
    """`function` named by the hash of its own text. Launchers hold the sizes a jit function
    does not (a kernel's rows are its `xnumel` argument), so kernels that differ only there
    (the same layer at another batch size, in this graph or another) share one jit function,
    whose source, and so Triton's compiled binary, is the same."""
    role = function.name.removeprefix(_PLACEHOLDER)  # _main, _partial, _epilogue, ...
    name = f"triton_{hashlib.sha256(function.source.encode()).hexdigest()[:16]}{role}"
    return JitFunction(name, re.sub(rf"\b{function.name}\b", name, function.source), function.takes_error_flag,
                       function.signature, function.constexprs)

