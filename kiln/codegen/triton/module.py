"""A schedule's kernels as one Python module of Triton kernels.

The module holds a preamble (imports, the `kiln_*` helpers the printers call, the special
functions' among them from kiln/codegen/special_functions.py), each kernel's
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

from kiln.codegen.special_functions import triton_source
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


''' + triton_source() + "\n"


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

