"""Which kernel runs a graph's attention, by measurement: ATen's CPU flash kernel or kiln's own
(kiln/externs/kiln_attention.py), timed on random tensors of the node's shapes and strides, as the
GEMM questions are (kiln/autotune/gemm.py)."""

from __future__ import annotations

import torch

from kiln.autotune.choose import choose
from kiln.autotune.gemm import BUDGET, ROUNDS, Inputs, no_grad
from kiln.autotune.record import spec
from kiln.externs import kiln_attention

aten = torch.ops.aten


def _layout(t: torch.Tensor | None) -> tuple | None:
    return None if t is None else (tuple(t.shape), tuple(t.stride()))


def choose_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
                     causal: bool, mode: str = "default") -> str:
    """"kiln" or "aten": the faster attention for fake values q, k, v and mask (kiln's kernel
    offered only where it applies)."""
    r = Inputs(q=(q, None), k=(k, None), v=(v, None), mask=(mask, None))
    candidates = {"aten": lambda: aten._scaled_dot_product_flash_attention_for_cpu(
        r.q, r.k, r.v, is_causal=causal, attn_mask=r.mask, scale=scale)}
    if kiln_attention.applies(q, k, v, mask):
        candidates["kiln"] = lambda: kiln_attention.attention(r.q, r.k, r.v, r.mask, scale, causal)
    signature = (_layout(q), _layout(k), _layout(v), _layout(mask), str(q.dtype), causal)
    question = lambda: {"op": "attention", "q": spec(q), "k": spec(k), "v": spec(v), "mask": spec(mask),  # noqa: E731
                        "scale": scale, "causal": causal}
    return choose("attention", signature, no_grad(candidates), BUDGET[mode], ROUNDS[mode], question=question,
                  default="aten")
