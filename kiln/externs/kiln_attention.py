"""kiln's own attention (kiln/native/include/kiln_attention.h): `kiln::attention`, the inference
form of ATen's `_scaled_dot_product_flash_attention_for_cpu` (its output, not its log-sum-exp),
float32. The operator is defined in C++ by kiln's runtime (kiln/native/src/kiln_runtime.cpp,
with its fake function in native_ops.py); this module is the autotuner's and the passes' view of
it: what the kernel takes (`applies`) and a call of the operator (`attention`). The attention pass
gives a graph's attention to it where the autotuner timed it faster than ATen's kernel for those
shapes (kiln/passes/kiln_attention.py).
"""

from __future__ import annotations

import functools
import math

import torch

from kiln.externs import native_ops
from kiln.ir.sizes import shape_key
from kiln.native import libkiln


@functools.cache
def lanes() -> int:
    """float32 lanes of this machine's vectors (v's head size must be a multiple)."""
    return libkiln.library().kiln_vector_lanes()


def applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether kiln's kernel computes this attention: float32 [B, H, S, D] operands of one batch
    and head count, v's head size a multiple of the vector width, and an additive float32 mask
    broadcastable to the scores, or none (as kiln_runtime.cpp `attention_applies` checks).

    Fake values may have symbolic sizes, compared as expressions (comparing SymInts would guard
    on their values). Where kiln's kernel asks no more than ATen's (keys and values of one length,
    head sizes alike, a mask broadcastable to the scores), two sizes that are symbolic in different
    symbols are taken as the call will find them — each layer's keys and values are inputs with a
    length symbol of their own — since a call where they differ fails in ATen's kernel as in
    kiln's (whose check at run time names the operands). Where kiln's asks more (as many key heads
    as query heads: ATen's shares key heads among query heads), the sizes must be the same."""
    if not all(t.dim() == 4 and t.dtype == torch.float32 for t in (q, k, v)):
        return False
    (b, h, sq, d), (bk, hk, sk, dk), (bv, hv, sv, dv) = shape_key(q), shape_key(k), shape_key(v)
    if ((bk, hk) != (b, h) or (bv, hv) != (b, h) or not _as_aten_requires(sv, sk) or not _as_aten_requires(dk, d)
            or not isinstance(d, int) or not isinstance(dv, int) or dv % lanes() or 0 in (b, h, sq, sk, d, dv)):
        return False
    if mask is None:
        return True
    return (mask.dtype == torch.float32 and mask.dim() == 4
            and all(m == 1 or _as_aten_requires(m, s) for m, s in zip(shape_key(mask), (b, h, sq, sk))))


def _as_aten_requires(size: object, other: object) -> bool:
    """Whether `size` is `other` in every call ATen's kernel accepts: the same, or a symbolic size
    (of a symbol of its own) where ATen's kernel requires them equal."""
    return size == other or not (isinstance(size, int) and isinstance(other, int))


def op() -> torch._ops.OpOverload:
    """kiln::attention(q, k, v, attn_mask, scale, is_causal), defined first where it is not yet."""
    return native_ops.op("attention")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
              scale: float | None = None, is_causal: bool = False) -> torch.Tensor:
    """softmax(q · kᵀ · scale + attn_mask) · v ([B, H, Sq, Dv], laid out as ATen's CPU kernel lays
    it out); `is_causal`: query i sees keys 0..i; `scale` by default 1/sqrt(head size). The
    operator, through the dispatcher (an error naming the operands where `applies` is False)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return native_ops.op("attention")(q, k, v, attn_mask, scale, bool(is_causal))
