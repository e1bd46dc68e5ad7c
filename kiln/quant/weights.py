"""Weight-only quantization of a Linear's weight [N, K], and its inverse.

- int8: per output channel (row), symmetric: scale = max |w| / 127, q = round(w / scale) in
  -127..127, w ≈ q * scale. scales [N, 1].
- int4: per group of `group_size` consecutive k of a row, asymmetric (min-max): scale =
  (max - min) / 15, zero = round(-min / scale) in 0..15, q = clamp(round(w / scale) + zero, 0, 15),
  w ≈ (q - zero) * scale. Two k per byte, even k in the low nibble: qweight [N, ceil(K / 2)]
  uint8; scales and zeros [N, ceil(K / group_size)] float32 (a zero is a whole number kept as a
  float, so that dequantizing is one subtraction and one product, the same in eager and in kiln's
  GEMM, kiln/native/include/kiln_gemm_quant.h). Each scale is rounded to 19 bits of mantissa
  (2^-20 of itself at most, against an int4 step's 2^-5 of the group's range): kiln's packed
  weight keeps the zero point in the scale's 4 low bits, one table read a group, not two.

`dequantize` is the reference: eager's quantized Linear computes with its result.

- int8 activations (int4 weights only, `kiln.quantize(..., activations="int8")`): at every call each
  row's groups of `group_size` k are quantized symmetrically, scale = max |x| / 127, q =
  round(x * (127 * (1 / max |x|))) in -127..127, and the product is taken with q * scale
  (`quantize_activations`; kiln's GEMM makes the same levels, kiln_gemm_quant.h `quantize_group`).
"""

from __future__ import annotations

import torch

INT4_LEVELS = 15


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(qweight int8 [N, K], scales float32 [N, 1]) of a float weight [N, K]."""
    w = weight.detach().to(torch.float32)
    scales = w.abs().amax(dim=1, keepdim=True) / 127.0
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))  # an all-zero row: any scale
    q = torch.round(w / scales).clamp(-127, 127).to(torch.int8)
    return q, scales


def round_int4_scales(scales: torch.Tensor) -> torch.Tensor:
    """float32 `scales` (positive, finite) rounded to nearest at 19 bits of mantissa: their 4 low
    bits zero, as kiln's packed int4 weight stores them (kiln_gemm_quant.h `int4_table_word`)."""
    bits = scales.to(torch.float32).contiguous().view(torch.int32)
    return ((bits + 8) & ~15).view(torch.float32)


def quantize_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(qweight uint8 [N, ceil(K / 2)], scales [N, groups], zeros [N, groups]) of a float weight
    [N, K], groups of `group_size` k (the last one shorter where K is not a multiple)."""
    w = weight.detach().to(torch.float32)
    n, k = w.shape
    groups = -(-k // group_size)
    padded = torch.nn.functional.pad(w, (0, groups * group_size - k))
    # The padding must not widen a short last group's range: take it from the real values only.
    valid = torch.nn.functional.pad(torch.ones_like(w, dtype=torch.bool), (0, groups * group_size - k))
    g = padded.view(n, groups, group_size)
    mask = valid.view(n, groups, group_size)
    low = torch.where(mask, g, torch.full_like(g, float("inf"))).amin(dim=2).clamp(max=0.0)
    high = torch.where(mask, g, torch.full_like(g, float("-inf"))).amax(dim=2).clamp(min=0.0)
    scales = (high - low) / INT4_LEVELS
    scales = round_int4_scales(torch.where(scales > 0, scales, torch.ones_like(scales)))
    zeros = torch.round(-low / scales).clamp(0, INT4_LEVELS)
    q = (torch.round(g / scales[..., None]) + zeros[..., None]).clamp(0, INT4_LEVELS)
    q = q.view(n, groups * group_size)[:, :k].to(torch.uint8)
    if k % 2:
        q = torch.nn.functional.pad(q, (0, 1))
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous(), scales, zeros


def unpack_int4(qweight: torch.Tensor, in_features: int) -> torch.Tensor:
    """The 0..15 values [N, K] of a packed int4 qweight [N, ceil(K / 2)]."""
    both = torch.stack([qweight & 15, qweight >> 4], dim=2)
    return both.view(qweight.shape[0], -1)[:, :in_features]


def dequantize(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor | None, bits: int, group_size: int,
               in_features: int) -> torch.Tensor:
    """The float32 weight [N, K] a quantized weight stands for."""
    if bits == 8:
        return qweight.to(torch.float32) * scales
    q = unpack_int4(qweight, in_features).to(torch.float32)
    per_k = lambda t: t.repeat_interleave(group_size, dim=1)[:, :in_features]  # noqa: E731
    return (q - per_k(zeros)) * per_k(scales)


def quantize_activations(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """x [..., K] float32 as the int8 levels of each row's groups of `group_size` k stand for it
    (the module docstring), float32. Each step is the one kiln's GEMM takes (a reciprocal then a
    product, not a division by a scalar, which ATen may take as a product by the reciprocal), so
    that both make the same levels."""
    k = x.shape[-1]
    groups = -(-k // group_size)
    g = torch.nn.functional.pad(x, (0, groups * group_size - k)).unflatten(-1, (groups, group_size))
    amax = g.abs().amax(dim=-1, keepdim=True)
    nonzero = amax > 0
    inverse = torch.where(nonzero, torch.reciprocal(amax) * 127.0, torch.zeros_like(amax))
    scale = torch.where(nonzero, amax * (1.0 / 127.0), torch.ones_like(amax))
    q = torch.round(g * inverse).clamp(-127, 127)
    return (q * scale).flatten(-2)[..., :k]
