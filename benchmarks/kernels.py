"""kiln's CPU kernels (kiln/native/include/kiln_gemm.h, kiln_depthwise.h) called directly through
ctypes, for kernel tests and sweeps: the translation unit of kiln/native/kernels_unit.py `source`
built on its own (`library`, or with other flags: `bind`), its GEMM with any epilogue (`mm`), its
depthwise convolution (`depthwise_conv`). No compiled graph takes this path: graphs call the
kernels through kiln's operators in its runtime (kiln/native/src/kiln_runtime.cpp).
"""

from __future__ import annotations

import ctypes
import functools
from typing import NamedTuple

import torch

from kiln.native.kernels_unit import CTYPES, SUFFIX, DTYPES, K_BLOCK, source
from kiln.native.build import load_library

# kiln_gemm::Unary, by the post-op names kiln::mm uses (kiln/externs/prepacked.py: UNARY).
UNARY_CODES = {"none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "swish": 4, "sigmoid": 5, "tanh": 6,
               "hardswish": 7, "leaky_relu": 8, "hardtanh": 9}

# kiln_gemm::RowNorm: what each row of C becomes once it is whole.
ROW_NORMS = {"layer_norm": 1, "rms_norm": 2, "softmax": 3, "log_softmax": 4}


def norm_kind(rms: bool) -> str:
    """The row norm of kiln::mm_layer_norm's `rms` flag."""
    return "rms_norm" if rms else "layer_norm"


def softmax_kind(log: bool) -> str:
    """The row norm of kiln::mm_softmax's `log` flag."""
    return "log_softmax" if log else "softmax"


class RowNorm(NamedTuple):
    """A normalization of each row of C after the epilogue: `kind` "layer_norm"; "rms_norm" (T5's,
    Llama's: row / sqrt(mean(row^2) + eps) * weight, no bias); "softmax" or "log_softmax" (no
    weight, bias or eps). `out`: the normalized rows go there, C keeping the sum. A plain tuple
    (weight, bias, eps[, out]) is a layer norm."""
    weight: torch.Tensor | None  # [N] or None (1)
    bias: torch.Tensor | None  # [N] or None (0)
    eps: float
    out: torch.Tensor | None = None
    kind: str = "layer_norm"

    @classmethod
    def softmax(cls, log: bool = False, out: torch.Tensor | None = None) -> "RowNorm":
        return cls(None, None, 0.0, out, softmax_kind(log))


class Epilogue(ctypes.Structure):
    """kiln_gemm::Epilogue, field by field."""
    _fields_ = [("bias", ctypes.c_void_p), ("residual", ctypes.c_void_p), ("ld_residual", ctypes.c_int64),
                ("bias_bf16", ctypes.c_int32), ("residual_bf16", ctypes.c_int32), ("out_bf16", ctypes.c_int32),
                ("unary", ctypes.c_int32), ("scalar0", ctypes.c_float), ("scalar1", ctypes.c_float),
                ("residual_before_unary", ctypes.c_int32), ("row_norm", ctypes.c_int32), ("norm_eps", ctypes.c_float),
                ("norm_weight", ctypes.c_void_p), ("norm_bias", ctypes.c_void_p), ("norm_out", ctypes.c_void_p),
                ("ld_norm_out", ctypes.c_int64), ("norm_out_bf16", ctypes.c_int32), ("sum_out", ctypes.c_void_p),
                ("ld_sum_out", ctypes.c_int64), ("gated_width", ctypes.c_int64)]


@functools.cache
def library() -> ctypes.CDLL:
    """The GEMM built for this machine (once; then from the C++ cache)."""
    return bind(load_library(source()))


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """`lib` (the GEMM source built with any flags: tests build other ISAs) with its functions typed."""
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for suffix in CTYPES:
        getattr(lib, f"kiln_gemm_packed_elements_{suffix}").restype = i64
        getattr(lib, f"kiln_gemm_packed_elements_{suffix}").argtypes = [i64, i64]
        getattr(lib, f"kiln_gemm_pack_{suffix}").argtypes = [ptr, i64, i64, i64, i64, ptr]
        getattr(lib, f"kiln_gemm_{suffix}").argtypes = [i64, i64, i64, ptr, i64, ptr, ptr, i64, ptr, i64]
    lib.kiln_gemm_ahead_shift.argtypes = [i64, i64, i64]
    lib.kiln_gemm_split.argtypes = [i64, i64, ctypes.c_int, ctypes.c_int]
    lib.kiln_gemm_shared_panels_take.argtypes = [i64, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ptr, ptr]
    lib.kiln_depthwise_pack_f32.argtypes = [ptr, i64, i64, ptr]
    lib.kiln_depthwise_f32.argtypes = [ptr, ptr, ptr, ptr, ptr, ptr, ptr]
    i32 = ctypes.c_int32
    lib.kiln_gemm_quant_packed_bytes.restype = i64
    lib.kiln_gemm_quant_packed_bytes.argtypes = [i32, i64, i64, i64]
    lib.kiln_gemm_panel_columns.restype = i64
    lib.kiln_gemm_quant_pack.argtypes = [i32, i64, i64, i64, ptr, ptr, ptr, ptr]
    lib.kiln_gemm_quant_f32.argtypes = [i32, i64, i64, i64, i64, ptr, i64, ptr, ptr, i64, ptr, i64]
    lib.kiln_gemm_quant_bf16_math.argtypes = [i32, i64, i64, i64, i64, ptr, i64, ptr, ptr, i64, ptr, i64]
    lib.kiln_gemm_quant_bf16_rows.argtypes = [i32, i64, i64, i64, i64, ptr, i64, ptr, ptr, i64, ptr, i64]
    lib.kiln_gemm_quant_path_of.restype = i32
    lib.kiln_gemm_quant_path_of.argtypes = [i32, i64, i64, i64, i64]
    lib.kiln_gemm_quant_digits.restype = i32
    lib.kiln_gemm_quant_digits.argtypes = [i32]
    lib.kiln_gemm_quant_path.argtypes = [i32, i32, i64, i64, i64, i64, ptr, i64, ptr, ptr, i64, ptr]
    lib.kiln_gemm_quant_a8_f32.argtypes = [i32, i64, i64, i64, i64, ptr, i64, ptr, ptr, i64, ptr, i64]
    lib.kiln_gemm_quant_a8_integer.restype = i32
    lib.kiln_gemm_quant_a8_integer.argtypes = [i64, i64, i64, i64]
    lib.kiln_gemm_quant_step.argtypes = [i32, i32, i64, ptr, ptr, ptr, ptr, ptr, ptr, i64, ptr]
    lib.kiln_read_pieces.argtypes = [i32, ptr, ptr, i32, i64, ptr]
    return lib


def pack(b: torch.Tensor, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """B [K, N] (any strides) in the GEMM's panel layout, a flat tensor of b's dtype."""
    suffix = SUFFIX[b.dtype]
    lib = lib or library()
    K, N = b.shape
    out = torch.empty(getattr(lib, f"kiln_gemm_packed_elements_{suffix}")(K, N), dtype=b.dtype)
    getattr(lib, f"kiln_gemm_pack_{suffix}")(b.data_ptr(), K, N, b.stride(0), b.stride(1), out.data_ptr())
    return out


# Epilogues without a residual, by what they hold: a GEMM call reuses its struct (building one
# is a third of a small call's Python time). Holds pointers and flags only, no tensor.
_EPILOGUES: dict[tuple, Epilogue] = {}


def epilogue(bias: torch.Tensor | None, unary: str, scalars: list | tuple, algorithm: str | None,
             residual: torch.Tensor | None, out_dtype: torch.dtype, residual_first: bool = False) -> Epilogue | None:
    """The Epilogue struct of these post-ops (kept for reuse where it holds no residual); None
    for none at all. `residual_first`: the residual is added before the unary op, as a
    convolution's added tensor is (kiln_conv_gemm.py). Also kiln's depthwise convolution's
    (kiln_depthwise.py)."""
    if bias is None and unary == "none" and residual is None and out_dtype == torch.float32:
        return None
    name = "gelu_tanh" if unary == "gelu" and algorithm == "tanh" else unary
    key = (bias.data_ptr() if bias is not None else 0, bias.dtype if bias is not None else None, name,
           tuple(scalars), out_dtype)
    if residual is None and (found := _EPILOGUES.get(key)) is not None:
        return found
    values = [float(s) for s in scalars] + [0.0, 0.0]
    made = Epilogue(
        key[0] or None, residual.data_ptr() if residual is not None else None,
        residual.stride(0) if residual is not None else 0, int(bias is not None and bias.dtype == torch.bfloat16),
        int(residual is not None and residual.dtype == torch.bfloat16), int(out_dtype == torch.bfloat16),
        UNARY_CODES[name], values[0], values[1], int(residual is not None and residual_first))
    if residual is None:
        if len(_EPILOGUES) > 4096:
            _EPILOGUES.clear()
        _EPILOGUES[key] = made
    return made


def mm(a: torch.Tensor, packed_b: torch.Tensor, n: int, bias: torch.Tensor | None = None, unary: str = "none",
       scalars: list | tuple = (), residual: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
       algorithm: str | None = None, lib: ctypes.CDLL | None = None, residual_first: bool = False,
       out: torch.Tensor | None = None, row_norm: RowNorm | tuple | None = None) -> torch.Tensor:
    """epilogue(a [M, K] @ B [K, n]) with B packed by `pack`: `unary(a @ B + bias) + residual`
    (`residual_first`: `unary(a @ B + bias + residual)`), stored as `out_dtype` (a's dtype by
    default) into a new tensor, or into `out` ([M, n], rows of unit stride). `algorithm` "tanh"
    makes gelu the tanh form. `row_norm` (a `RowNorm`, or (weight [n] or None, bias [n] or None,
    eps) for a layer norm): each row of that result then normalized (a layer or RMS norm, a
    softmax) from its float32 sum, its weight and bias taken as float32; with its `out`, a [M, n]
    tensor of either dtype, the normalized rows go there and the result keeps the sum."""
    if a.dtype != packed_b.dtype or a.dtype not in DTYPES:
        raise RuntimeError(f"kiln's GEMM takes float32 or bfloat16 operands of one dtype, not {a.dtype} and {packed_b.dtype}")
    if a.dim() != 2 or a.stride(1) != 1:
        a = a.contiguous()
    if bias is not None and bias.stride(0) != 1:
        bias = bias.contiguous()
    if residual is not None and residual.stride(-1) != 1:
        residual = residual.contiguous()
    M, K = a.shape
    result = sum_out = None
    if row_norm is not None:
        row_norm = RowNorm(*row_norm)
        as_float = lambda t: t.float() if t is not None and t.dtype == torch.bfloat16 else t  # noqa: E731
        row_norm = row_norm._replace(weight=as_float(row_norm.weight), bias=as_float(row_norm.bias))
        if (out.dtype if out is not None else out_dtype or a.dtype) == torch.bfloat16:
            # A bfloat16 result from float32 rows, C a float32 scratch: the norm, or the sum kept
            # beside the norm (the row pass rounds it there).
            result = out if out is not None else torch.empty((M, n), dtype=torch.bfloat16)
            out, out_dtype = None, torch.float32
            if row_norm.out is None:
                row_norm = row_norm._replace(out=result)
            else:
                sum_out = result
    if out is None:
        out = torch.empty((M, n), dtype=out_dtype or a.dtype)
    post = epilogue(bias, unary, scalars, algorithm, residual, out.dtype, residual_first)
    if row_norm is not None:
        post = _with_row_norm(post, out.dtype, *row_norm)
    if sum_out is not None:
        if sum_out.stride(-1) != 1:
            raise RuntimeError("kiln's GEMM writes a bfloat16 sum beside its norm into rows of unit stride")
        post.sum_out, post.ld_sum_out = sum_out.data_ptr(), sum_out.stride(0)
    run = _GEMMS[a.dtype] if lib is None else getattr(lib, f"kiln_gemm_{SUFFIX[a.dtype]}")
    run(M, n, K, a.data_ptr(), a.stride(0), packed_b.data_ptr(), out.data_ptr(), out.stride(0),
        ctypes.byref(post) if post is not None else None, K_BLOCK)
    return result if result is not None else out


def quant_pack(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, bits: int, group_size: int,
               in_features: int, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """A weight quantized as kiln/quant/weights.py makes it ([N, K] int8, or [N, ceil(K / 2)] int4
    bytes with its scales and zeros) in the quantized GEMM's packed layout (kiln_gemm_quant.h)."""
    lib = lib or library()
    n, k = qweight.shape[0], in_features
    group = k if bits == 8 else group_size
    q, s = qweight.contiguous(), scales.float().contiguous()
    z = zeros.float().contiguous() if zeros is not None else None
    out = torch.empty(lib.kiln_gemm_quant_packed_bytes(bits, k, n, group), dtype=torch.uint8)
    lib.kiln_gemm_quant_pack(bits, k, n, group, q.data_ptr(), s.data_ptr(), z.data_ptr() if z is not None else None,
                             out.data_ptr())
    return out


def gated_halves_width(width: int, lib: ctypes.CDLL | None = None) -> int:
    """A gated product's half of B's columns: `width` padded to whole panels."""
    panel = (lib or library()).kiln_gemm_panel_columns()
    return -(-width // panel) * panel


def gated_halves(t: torch.Tensor, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """A gated product's quantized weight, scales or zeros (the gate's rows, then up's) with each
    half padded by zero rows to whole panels, as kiln::mm_quant_gated packs them."""
    width = t.shape[0] // 2
    pad = t.new_zeros((gated_halves_width(width, lib) - width, *t.shape[1:]))
    return torch.cat([t[:width], pad, t[width:], pad])


# The quantized products' paths at 4 rows or fewer, by kiln_gemm_quant.h's number (`QuantPath`):
# bf16_pairs is int4's only.
QUANT_PATHS = ("float32", "bf16_pairs", "int8_digits")
# "amx": more rows on AMX's tiles (int8's levels with A in three bfloat16 parts, int4's weights in
# two: where AMX is the CPU's bfloat16 product), and int8 and int4 at 4 rows on its integer tiles
# (2 and 3 when asked for; the digits' path's digits: the same bits); more rows elsewhere "float32"
# (over dequantized blocks).
QUANT_PATH_NAMES = QUANT_PATHS + ("amx",)


def quant_path(bits: int, m: int, k: int, n: int, group_size: int, lib: ctypes.CDLL | None = None) -> str:
    """The path a product of `m` rows over a `bits`-bit weight runs here (QUANT_PATH_NAMES). At 4
    rows: amx where the CPU and kernel give AMX's integer tiles (int4 in groups of a multiple of
    64). Otherwise at 4 rows or fewer, int4: the fastest this CPU measured of those it has
    (bf16_pairs: avx512_bf16; int8_digits: a dot4, groups of a multiple of 8) at one row or at
    four, else float32; int8: int8_digits where the CPU has a one-instruction dot4 (VNNI, AVX-VNNI,
    aarch64's dot products), at one row where it has AVX2's, else float32. More: amx where AMX is
    the CPU's bfloat16 product (int8 from 16 rows, int4 from 32; in bfloat16 fast math from 5),
    else float32."""
    group = k if bits == 8 else group_size
    return QUANT_PATH_NAMES[(lib or library()).kiln_gemm_quant_path_of(bits, m, k, n, group)]


def quant_digits(bits: int, lib: ctypes.CDLL | None = None) -> int:
    """How many int8 digits the int8_digits path carries each activation in over `bits`-bit weights
    in this build: 2 (levels up to 127) at int4's, 3 (up to 64) at int8's; 0 where the build has no
    such path."""
    return int((lib or library()).kiln_gemm_quant_digits(bits))


def int8_dot_applies(m: int, k: int, n: int, group_size: int, lib: ctypes.CDLL | None = None) -> bool:
    """Whether an int4 product with int8 activations of `m` rows runs kiln_gemm_quant.h's integer
    (`dot4`) path here: a CPU with AVX512-VNNI, AVX-VNNI or AVX2 (aarch64 with dot products), groups of
    a multiple of 8, at most 4 rows."""
    return bool((lib or library()).kiln_gemm_quant_a8_integer(m, k, n, group_size))


def mm_quant(a: torch.Tensor, packed: torch.Tensor, n: int, bits: int, group_size: int,
             bias: torch.Tensor | None = None, unary: str = "none", scalars: list | tuple = (),
             residual: torch.Tensor | None = None, algorithm: str | None = None, row_norm: RowNorm | tuple | None = None,
             lib: ctypes.CDLL | None = None, path: str | None = None,
             int8_activations: str | None = None, bf16_math: bool = False, gated_width: int = 0) -> torch.Tensor:
    """epilogue(a [M, K] (float32, or bfloat16: a bfloat16 model's, out in bfloat16) @ dequantize(B))
    with B packed by `quant_pack`: the epilogues of `mm`, out in a's dtype. `path` (at 4 rows or fewer, one of QUANT_PATH_NAMES; "amx": 2 to 4 rows on AMX's integer tiles):
    run that path (where the CPU has it; amx the digits' path elsewhere, the others float32) rather than the one this CPU takes by default (`quant_path`).
    `int8_activations` (int4): a's rows quantized to int8 per group first (kiln.quantize's
    activations="int8"), multiplied by the "integer" path where it applies or the "float" one.
    `bf16_math`: in bfloat16 fast math (kiln::mm_quant's impl "kiln_bf16": a prompt's rows on AMX
    where it is this CPU's bfloat16 product, the weights and a rounded to bfloat16).
    `gated_width` h: a gated MLP's gate and up (kiln::mm_quant_gated), B's n columns their two
    halves as `gated_halves` pads them; out [M, h] = unary(gate + bias[:h]) * (up + bias[h:])."""
    lib = lib or library()
    a = a.contiguous()
    M, K = a.shape
    if residual is not None:
        residual = residual.contiguous()
    if gated_width and (residual is not None or row_norm is not None or n != 2 * gated_halves_width(gated_width, lib)):
        raise ValueError("a gated product takes no residual or row norm, over gated_halves' columns")
    out = torch.empty((M, gated_width or n), dtype=a.dtype)
    post = epilogue(bias, unary, scalars, algorithm, residual, a.dtype)
    if row_norm is not None:
        post = _with_row_norm(post, torch.float32, *RowNorm(*row_norm))
    if gated_width:
        made = Epilogue(unary=UNARY_CODES["none"])
        if post is not None:
            ctypes.pointer(made)[0] = post  # (a copy: `post` may be a shared, cached struct)
        made.gated_width, post = gated_width, made
    ldc = out.shape[1]
    post_ref = ctypes.byref(post) if post is not None else None
    if int8_activations is not None:
        if bits != 4 or int8_activations not in ("integer", "float") or path is not None:
            raise ValueError("int8_activations ('integer' or 'float') applies to int4 weights, without path")
        lib.kiln_gemm_quant_a8_f32(int(int8_activations == "integer"), M, n, K, group_size, a.data_ptr(), K,
                                   packed.data_ptr(), out.data_ptr(), ldc, post_ref, K_BLOCK)
    elif a.dtype == torch.bfloat16:
        if path is not None or bf16_math or row_norm is not None:
            raise ValueError("bfloat16 rows take the path their own entry takes, without path, bf16_math or row_norm")
        lib.kiln_gemm_quant_bf16_rows(bits, M, n, K, K if bits == 8 else group_size, a.data_ptr(), K,
                                      packed.data_ptr(), out.data_ptr(), ldc, post_ref, K_BLOCK)
    elif bf16_math:
        if path is not None:
            raise ValueError("bf16_math takes the path bfloat16 fast math takes, without path")
        lib.kiln_gemm_quant_bf16_math(bits, M, n, K, K if bits == 8 else group_size, a.data_ptr(), K,
                                      packed.data_ptr(), out.data_ptr(), ldc, post_ref, K_BLOCK)
    elif path is None:
        lib.kiln_gemm_quant_f32(bits, M, n, K, K if bits == 8 else group_size, a.data_ptr(), K, packed.data_ptr(),
                                out.data_ptr(), ldc, post_ref, K_BLOCK)
    else:
        if M > 4:
            raise ValueError(f"path chooses among the paths at 4 rows or fewer ({', '.join(QUANT_PATH_NAMES)})")
        if path not in QUANT_PATH_NAMES:
            raise ValueError(f"path must be one of {', '.join(QUANT_PATH_NAMES)}, got {path!r}")
        lib.kiln_gemm_quant_path(bits, QUANT_PATH_NAMES.index(path), M, n, K, K if bits == 8 else group_size, a.data_ptr(), K,
                                 packed.data_ptr(), out.data_ptr(), ldc, post_ref)
    return out


def _with_row_norm(post: Epilogue | None, out_dtype: torch.dtype, weight: torch.Tensor | None,
                   bias: torch.Tensor | None, eps: float, normed: torch.Tensor | None = None,
                   kind: str = "layer_norm") -> Epilogue:
    """A copy of `post` (which may be a shared, cached struct) that also normalizes C's rows as
    `kind` says (ROW_NORMS), in place or into `normed`."""
    if kind not in ROW_NORMS:
        raise ValueError(f"kiln's GEMM: row norm kind {kind!r}, not one of {sorted(ROW_NORMS)}")
    if out_dtype != torch.float32 or any(t is not None and (t.dtype != torch.float32 or t.stride(-1) != 1)
                                         for t in (weight, bias)):
        raise RuntimeError("kiln's GEMM normalizes rows of a float32 C, with float32 weight and bias of unit stride")
    if normed is not None and (normed.dtype not in DTYPES or normed.stride(-1) != 1):
        raise RuntimeError("kiln's GEMM writes normalized rows as float32 or bfloat16 of unit stride, "
                           f"not {normed.dtype} of stride {normed.stride(-1)}")
    if kind == "rms_norm" and bias is not None:
        raise RuntimeError("kiln's GEMM: an RMS norm takes no bias")
    if kind in ("softmax", "log_softmax") and (weight is not None or bias is not None):
        raise RuntimeError(f"kiln's GEMM: a {kind} takes no weight or bias")
    made = Epilogue()
    if post is not None:
        ctypes.pointer(made)[0] = post
    made.row_norm, made.norm_eps = ROW_NORMS[kind], eps
    made.norm_weight = weight.data_ptr() if weight is not None else None
    made.norm_bias = bias.data_ptr() if bias is not None else None
    if normed is not None:
        made.norm_out, made.ld_norm_out = normed.data_ptr(), normed.stride(0)
        made.norm_out_bf16 = normed.dtype == torch.bfloat16
    return made


class _Gemms(dict):
    """dtype -> this machine's GEMM function, bound on first use (building the library then)."""

    def __missing__(self, dtype: torch.dtype):
        self[dtype] = getattr(library(), f"kiln_gemm_{SUFFIX[dtype]}")
        return self[dtype]


_GEMMS = _Gemms()


_NO_POST_OP = Epilogue()  # all zero: no bias, no residual, the identity


def depthwise_pack(weight: torch.Tensor, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """weight [C, 1, KH, KW] as [KH * KW, C]: each tap's channels one vector load. `lib`: kiln's
    kernels built for another ISA (tests), else this machine's."""
    c, _, kh, kw = weight.shape
    w = weight.contiguous()
    out = torch.empty(kh * kw * c, dtype=torch.float32)
    (lib or library()).kiln_depthwise_pack_f32(w.data_ptr(), c, kh * kw, out.data_ptr())
    return out


def _output_size(size: int, kernel: int, stride: int, before: int, after: int, dilation: int) -> int:
    return (size + before + after - dilation * (kernel - 1) - 1) // stride + 1


def depthwise_conv(x: torch.Tensor, packed_weight: torch.Tensor, kernel: tuple[int, int], bias: torch.Tensor | None,
         stride, padding, dilation, unary: str = "none", scalars=(), algorithm: str | None = None,
         other: torch.Tensor | None = None, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """unary(depthwise_conv(x) + bias + other), channels-last, as kiln::conv's "kiln" computes it."""
    n, c, h, w = x.shape
    if x.dtype != torch.float32 or packed_weight.numel() != c * kernel[0] * kernel[1]:
        raise RuntimeError(f"kiln::conv: kiln's kernel runs float32 depthwise convolutions only (input {tuple(x.shape)} "
                           f"{x.dtype}, {packed_weight.numel()} packed weights for a {kernel} kernel)")
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    # [ph, pw], or [top, left, bottom, right]: the kernel reads inside the image only, so padding
    # after it is only in the output's size.
    top, left, bottom, right = padding if len(padding) == 4 else (*padding, *padding)
    oh, ow = _output_size(h, kh, sh, top, bottom, dh), _output_size(w, kw, sw, left, right, dw)
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.empty((n, c, oh, ow), memory_format=torch.channels_last)
    if other is not None:
        other = other.contiguous(memory_format=torch.channels_last)
    if bias is not None:
        bias = bias.contiguous()
    post = epilogue(None, unary, scalars, algorithm, None, torch.float32) or _NO_POST_OP
    shape = (ctypes.c_int64 * 14)(n, h, w, c, kh, kw, oh, ow, sh, sw, top, left, dh, dw)
    (lib or library()).kiln_depthwise_f32(shape, x.data_ptr(), packed_weight.data_ptr(),
                                           bias.data_ptr() if bias is not None else None,
                                           other.data_ptr() if other is not None else None, y.data_ptr(),
                                           ctypes.byref(post))
    return y


# ---- convolutions of non-overlapping windows as kiln's GEMM (kiln/externs/kiln_conv_gemm.py) ----

def conv_gemm_pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [K, C, KH, KW] as the GEMM's packed B [KH*KW*C, K], rows in the windows' order."""
    k, c, kh, kw = weight.shape
    return pack(weight.permute(2, 3, 1, 0).reshape(kh * kw * c, k))


def conv_windows(x: torch.Tensor, kernel: tuple[int, int], stride) -> torch.Tensor:
    """Channels-last x's windows as rows [N*OH*OW, KH*KW*C]: a view for a 1x1 kernel of stride 1,
    else a copy (each input pixel in it at most once)."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw) = kernel, stride
    oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
    pixels = x.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1)
    rows = pixels.as_strided((n, oh, ow, kh, kw, c), (h * w * c, sh * w * c, sw * c, w * c, c, 1))
    return rows.reshape(n * oh * ow, kh * kw * c)


def conv_gemm(x: torch.Tensor, packed_weight: torch.Tensor, out_channels: int, bias: torch.Tensor | None,
         unary: str = "none", scalars=(), algorithm: str | None = None, other: torch.Tensor | None = None,
         kernel: tuple[int, int] = (1, 1), stride=(1, 1)) -> torch.Tensor:
    """unary(conv(x) + bias + other), channels-last, as kiln::conv computes it."""
    n, h, w = x.shape[0], x.shape[2], x.shape[3]
    oh, ow = (h - kernel[0]) // stride[0] + 1, (w - kernel[1]) // stride[1] + 1
    y = torch.empty((n, out_channels, oh, ow), dtype=x.dtype, memory_format=torch.channels_last)
    residual = None
    if other is not None:
        residual = other.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1).reshape(n * oh * ow, out_channels)
    mm(conv_windows(x, kernel, stride), packed_weight, out_channels, bias, unary, scalars,
                 residual=residual, algorithm=algorithm, residual_first=True,
                 out=y.permute(0, 2, 3, 1).view(n * oh * ow, out_channels))
    return y
