"""The tolerance rule: is a compiled result the same as eager's?

1. Every output has eager's shape and dtype; integer and bool outputs are equal exactly.
2. A float output passes if `|compiled - eager32| <= RTOL * |eager32| + ATOL * max|eager32|`
   elementwise: eager float32 is the reference, and the absolute part scales with the tensor so that
   logits and tiny gradients are judged alike.
3. Otherwise a float64 run of the same weights and inputs arbitrates: the output still passes if its
   RMS error against float64 is at most FP64_FACTOR times eager float32's own RMS error (plus a
   floor of FLOOR * max|float64|), i.e. the compiled run is about as exact as eager itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

RTOL = 1e-3
ATOL = 1e-3
FP64_FACTOR = 3.0
FLOOR = 1e-6


def flatten_tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in a nested output (tensors, tuples, lists, dicts, HF `ModelOutput`s), in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in flatten_tensors(item)]
    return []


@dataclass
class Verdict:
    passed: bool
    rule: str  # "fp32", "fp64" or "mismatch"
    max_abs_err: float
    detail: str = ""


def _fp32_close(actual: torch.Tensor, ref: torch.Tensor) -> bool:
    scale = ref.abs().max().item() if ref.numel() else 0.0
    return bool(((actual - ref).abs() <= RTOL * ref.abs() + ATOL * scale).all())


def _infinities(t: torch.Tensor) -> torch.Tensor:
    return torch.where(t.isinf(), t, torch.zeros_like(t))


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).pow(2).mean().sqrt().item() if a.numel() else 0.0


def compare(
    actual: list[torch.Tensor],
    ref32: list[torch.Tensor],
    ref64: Callable[[], list[torch.Tensor]],
) -> Verdict:
    """Apply the tolerance rule to flat lists of outputs; `ref64()` is called only when needed."""
    if len(actual) != len(ref32):
        return Verdict(False, "mismatch", float("inf"), f"{len(actual)} outputs, eager has {len(ref32)}")
    worst, rule, fp64 = 0.0, "fp32", None
    for i, (a, r) in enumerate(zip(actual, ref32)):
        if a.shape != r.shape or a.dtype != r.dtype:
            detail = f"output {i}: {a.dtype}{list(a.shape)} vs eager {r.dtype}{list(r.shape)}"
            return Verdict(False, "mismatch", float("inf"), detail)
        a, r = a.detach(), r.detach()
        if not r.is_floating_point():
            if not torch.equal(a, r):
                return Verdict(False, "mismatch", float("inf"), f"output {i}: integer values differ")
            continue
        if not torch.equal(a.isnan(), r.isnan()) or not torch.equal(_infinities(a), _infinities(r)):
            return Verdict(False, "mismatch", float("inf"), f"output {i}: NaN or infinity where eager has none")
        finite = torch.isfinite(r)
        a, r = a[finite], r[finite]
        err = (a.double() - r.double()).abs().max().item() if a.numel() else 0.0
        worst = max(worst, err)
        if _fp32_close(a, r):
            continue
        fp64 = ref64() if fp64 is None else fp64
        truth = fp64[i].detach()[finite]
        floor = FLOOR * (truth.abs().max().item() if truth.numel() else 0.0)
        ours, eagers = _rmse(a, truth), _rmse(r, truth)
        rule = "fp64"
        if ours > FP64_FACTOR * eagers + floor:
            detail = f"output {i}: rms error vs float64 {ours:.3g}, eager float32's {eagers:.3g}"
            return Verdict(False, "fp64", worst, detail)
    return Verdict(True, rule, worst)


def relative_error(actual: list[torch.Tensor], reference: list[torch.Tensor],
                   pooled_from: int | None = None) -> float | None:
    """The largest `|actual - reference|` of a float output, as a fraction of that output's largest
    `|reference|`: the worst output's figure (0.0 when all agree exactly). Outputs from index
    `pooled_from` on count as one output (a training step's gradients: their largest difference over
    the largest gradient; alone, a gradient that is zero but for rounding, as an attention key's
    bias, would turn float32's noise against bfloat16's into a ratio of thousands).

    What a lowered-precision run (bfloat16 weights, autocast) is stated as against float32: the
    outputs may differ in dtype, never in count or shape (None then: nothing to compare). Values
    are compared in float64 where the reference is finite; a NaN or infinity there is an infinite
    error. An output whose reference is all zeros has no scale and is left out."""
    if len(actual) != len(reference) or any(a.shape != r.shape for a, r in zip(actual, reference)):
        return None
    largest = [(i, *_largest_difference_and_value(a, r))
               for i, (a, r) in enumerate(zip(actual, reference)) if r.is_floating_point()]
    alone = [(difference, scale) for i, difference, scale in largest if pooled_from is None or i < pooled_from]
    pooled = [(difference, scale) for i, difference, scale in largest if pooled_from is not None and i >= pooled_from]
    if pooled:
        alone.append((max(d for d, _ in pooled), max(s for _, s in pooled)))
    return max((difference / scale for difference, scale in alone if scale > 0), default=0.0)


def _largest_difference_and_value(actual: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    """max |actual - reference| and max |reference| where the reference is finite (NaN: infinite)."""
    finite = torch.isfinite(reference)
    a, r = actual.detach()[finite].double(), reference.detach()[finite].double()
    if not r.numel():
        return 0.0, 0.0
    difference = torch.nan_to_num((a - r).abs(), nan=float("inf")).max().item()
    return difference, r.abs().max().item()
