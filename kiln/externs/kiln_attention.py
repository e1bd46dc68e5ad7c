"""kiln's own attention (kiln/native/include/kiln_attention.h): `kiln::attention`, the inference
form of ATen's `_scaled_dot_product_flash_attention_for_cpu` (its output, not its log-sum-exp),
float32, called through ctypes from the Python wrapper (the C++ wrapper calls the same function
in kiln's runtime). The attention pass gives a graph's attention to it where the autotuner timed
it faster than ATen's kernel for those shapes (kiln/passes/kiln_attention.py).
"""

from __future__ import annotations

import ctypes
import functools
import math

import torch

from kiln.externs import kiln_gemm

_lib = torch.library.Library("kiln", "FRAGMENT")
_lib.define("attention(Tensor q, Tensor k, Tensor v, Tensor? attn_mask, float scale, bool is_causal) -> Tensor")


@functools.cache
def lanes() -> int:
    """float32 lanes of this machine's vectors (v's head size must be a multiple)."""
    return kiln_gemm.library().kiln_vec_lanes()


def applies(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether kiln's kernel computes this attention: float32 [B, H, S, D] operands of one batch
    and head count, v's head size a multiple of the vector width, and an additive float32 mask
    broadcastable to the scores, or none."""
    if not all(t.dim() == 4 and t.dtype == torch.float32 for t in (q, k, v)):
        return False
    (b, h, sq, d), (bk, hk, sk, dk), (bv, hv, sv, dv) = q.shape, k.shape, v.shape
    if (bk, hk, dk) != (b, h, d) or (bv, hv, sv) != (b, h, sk) or dv % lanes() or 0 in (b, h, sq, sk, d, dv):
        return False
    if mask is None:
        return True
    return (mask.dtype == torch.float32 and mask.dim() == 4
            and all(m in (1, s) for m, s in zip(mask.shape, (b, h, sq, sk))))


def output_like(q: torch.Tensor, dv: int) -> torch.Tensor:
    """The output as ATen's CPU kernel makes it (its meta function: `empty_like(query)`), so that
    the graph's later views of it stay valid: q's order of dimensions, v's head size."""
    if dv == q.shape[-1]:
        return torch.empty_like(q)
    order = sorted(range(4), key=lambda i: -q.stride(i))
    return torch.empty_permuted((*q.shape[:3], dv), order, dtype=q.dtype, device=q.device)


def _rows_unit(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
              scale: float | None = None, is_causal: bool = False, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """softmax(q · kᵀ · scale + attn_mask) · v ([B, H, Sq, Dv], laid out as ATen's CPU kernel lays
    it out: `output_like`); `is_causal`: query i sees keys 0..i. `lib`: the kernels built with
    other flags (tests of other ISAs), else this machine's."""
    if not applies(q, k, v, attn_mask):
        raise RuntimeError(f"kiln::attention: kiln's kernel takes float32 [B, H, S, D] q, k, v with v's head size a "
                           f"multiple of {lanes()} and a float32 mask broadcastable to the scores, not q "
                           f"{tuple(q.shape)} {q.dtype}, k {tuple(k.shape)}, v {tuple(v.shape)} "
                           f"{None if attn_mask is None else (tuple(attn_mask.shape), attn_mask.dtype)}")
    result = output_like(q, v.shape[3])
    # The kernel writes rows of unit stride (where q's last dimension is not its innermost, into a
    # copy first).
    out = result if result.stride(-1) == 1 else torch.empty_like(result, memory_format=torch.contiguous_format)
    q, k, v = _rows_unit(q), _rows_unit(k), _rows_unit(v)
    b, h, sq, d = q.shape
    sk, dv = k.shape[2], v.shape[3]
    mask_strides = (0, 0, 0)
    if attn_mask is not None:
        attn_mask = attn_mask.expand(b, h, sq, sk)
        if attn_mask.stride(3) != 1:
            attn_mask = attn_mask.contiguous()
        mask_strides = tuple(attn_mask.stride()[:3])
    shape = (ctypes.c_int64 * 21)(b, h, sq, sk, d, dv, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                                  *out.stride()[:3], *mask_strides)
    (lib or kiln_gemm.library()).kiln_attention_f32(shape, q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                                    attn_mask.data_ptr() if attn_mask is not None else None,
                                                    out.data_ptr(),
                                                    1.0 / math.sqrt(d) if scale is None else float(scale),
                                                    int(is_causal))
    return out if out is result else result.copy_(out)


def _fake(q, k, v, attn_mask, scale, is_causal):
    return output_like(q, v.shape[3])


_lib.impl("attention", attention, "CPU")
torch.library.register_fake("kiln::attention", _fake, lib=_lib)
