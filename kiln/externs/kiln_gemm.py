"""kiln's own GEMM: the micro-kernel GEMM of kiln/native/include/kiln_gemm.h, built for this
machine once (`-march=native`, kept in the C++ cache) and called through ctypes.

`pack(b)` makes the weight's packed panels (at freezing, through `prepacked.packed`, so once per
weight and version); `mm(a, packed_b, n, ...)` runs the GEMM with its epilogue: bias, one of the
unary post-ops oneDNN also offers, a residual added after it, the output's dtype, and a normalization
of each row (`RowNorm`: layer or RMS norm, softmax, log-softmax). float32 and
bfloat16 operands, float32 accumulation.
"""

from __future__ import annotations

import ctypes
import functools
from typing import NamedTuple

import torch

from kiln.native import header_text
from kiln.native.build import load_library

# kiln_gemm::Unary, by the post-op names kiln::mm uses (kiln/externs/prepacked.py: UNARY).
UNARY_CODES = {"none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "swish": 4, "sigmoid": 5, "tanh": 6,
               "hardswish": 7, "leaky_relu": 8, "hardtanh": 9}
DTYPES = (torch.float32, torch.bfloat16)
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_CTYPE = {"f32": "float", "bf16": "kiln_bf16"}

# K longer than this is cut in blocks of equal size, none longer: each block of A stays in L2 while
# the thread's panels stream past (blocks of 1024 beat 768 and 1536 at K = 2048 and 3072 with the
# weights out of cache, 2048^3 included; shorter blocks cost more in C's partial sums).
K_BLOCK = 1024

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
                ("ld_sum_out", ctypes.c_int64)]


def _entries() -> str:
    lines = ['extern "C" {', "int kiln_gemm_nr() { return kiln_gemm::NR; }", "int kiln_vec_lanes() { return kiln::L; }",
             "int kiln_gemm_ahead_shift(int64_t tiles, int64_t steps, int64_t lines) "
             "{ return kiln_gemm::ahead_shift(tiles, steps, lines); }",
             "int kiln_gemm_split(int64_t panels, int64_t row_blocks, int last_vectors, int threads) "
             "{ int tn, tm; kiln_gemm::split(panels, row_blocks, last_vectors, threads, tn, tm); return tn; }"]
    for suffix, ctype in _CTYPE.items():
        lines += [
            f"int64_t kiln_gemm_packed_elements_{suffix}(int64_t K, int64_t N) "
            f"{{ return kiln_gemm::packed_elements<{ctype}>(K, N); }}",
            f"void kiln_gemm_pack_{suffix}(const {ctype}* b, int64_t K, int64_t N, int64_t sk, int64_t sn, {ctype}* out) "
            "{ kiln_gemm::pack_b(b, K, N, sk, sn, out); }",
            f"void kiln_gemm_{suffix}(int64_t M, int64_t N, int64_t K, const {ctype}* a, int64_t lda, const {ctype}* bp, "
            "void* c, int64_t ldc, const kiln_gemm::Epilogue* e, int64_t kc) "
            "{ kiln_gemm::gemm(M, N, K, a, lda, bp, c, ldc, e, kc); }",
        ]
    # kiln's depthwise convolution (kiln/externs/kiln_depthwise.py) shares the GEMM's vectors and
    # epilogue code, so it lives in this unit.
    lines += [
        "void kiln_depthwise_pack_f32(const float* w, int64_t C, int64_t taps, float* out) "
        "{ kiln_depthwise::pack_weight(w, C, taps, out); }",
        "void kiln_depthwise_f32(const int64_t* d, const float* x, const float* wp, const float* bias, "
        "const float* other, float* y, const kiln_gemm::Epilogue* e) { kiln_depthwise::conv(kiln_depthwise::Shape{"
        "d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12], d[13]}, x, wp, bias, other, y, *e); }",
    ]
    # kiln's attention (kiln::attention, kiln/native/src/kiln_runtime.cpp) is built on the GEMM's
    # register tiles; the runtime calls it through this entry.
    lines += [
        "void kiln_attention_f32(const int64_t* shape, const float* q, const float* k, const float* v, "
        "const float* mask, float* out, float scale, int32_t causal) { kiln_attention::Shape z; "
        "std::memcpy(&z, shape, sizeof z); kiln_attention::attention(z, q, k, v, mask, out, scale, causal != 0); }",
    ]
    return "\n".join([*lines, "}"])


def source(defines_flag: bool = True) -> str:
    """The translation unit of kiln's own CPU kernels: the GEMM and the depthwise convolution;
    `defines_flag` False where another unit of the same library defines the index-error flag (an
    exported model's kernels, kiln/deploy/export.py)."""
    return "\n".join([header_text(defines_flag=defines_flag), header_text(("kiln_gemm.h", "kiln_depthwise.h", "kiln_attention.h")),
                      _entries()])


@functools.cache
def library() -> ctypes.CDLL:
    """The GEMM built for this machine (once; then from the C++ cache)."""
    return bind(load_library(source()))


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """`lib` (the GEMM source built with any flags: tests build other ISAs) with its functions typed."""
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for suffix in _CTYPE:
        getattr(lib, f"kiln_gemm_packed_elements_{suffix}").restype = i64
        getattr(lib, f"kiln_gemm_packed_elements_{suffix}").argtypes = [i64, i64]
        getattr(lib, f"kiln_gemm_pack_{suffix}").argtypes = [ptr, i64, i64, i64, i64, ptr]
        getattr(lib, f"kiln_gemm_{suffix}").argtypes = [i64, i64, i64, ptr, i64, ptr, ptr, i64, ptr, i64]
    lib.kiln_gemm_ahead_shift.argtypes = [i64, i64, i64]
    lib.kiln_gemm_split.argtypes = [i64, i64, ctypes.c_int, ctypes.c_int]
    lib.kiln_depthwise_pack_f32.argtypes = [ptr, i64, i64, ptr]
    lib.kiln_depthwise_f32.argtypes = [ptr, ptr, ptr, ptr, ptr, ptr, ptr]
    return lib


def pack(b: torch.Tensor, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """B [K, N] (any strides) in the GEMM's panel layout, a flat tensor of b's dtype."""
    suffix = _SUFFIX[b.dtype]
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
    run = _GEMMS[a.dtype] if lib is None else getattr(lib, f"kiln_gemm_{_SUFFIX[a.dtype]}")
    run(M, n, K, a.data_ptr(), a.stride(0), packed_b.data_ptr(), out.data_ptr(), out.stride(0),
        ctypes.byref(post) if post is not None else None, K_BLOCK)
    return result if result is not None else out


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
        self[dtype] = getattr(library(), f"kiln_gemm_{_SUFFIX[dtype]}")
        return self[dtype]


_GEMMS = _Gemms()
