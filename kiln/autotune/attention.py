"""Which kernel runs a graph's attention, by measurement: ATen's CPU flash kernel or kiln's own
(kiln/externs/kiln_attention.py), timed on random tensors of the node's shapes and strides, as the
GEMM questions are (kiln/autotune/gemm.py)."""

from __future__ import annotations

import torch

from kiln.autotune.choose import choose
from kiln.autotune.gemm import BUDGET, ROUNDS, Inputs, no_grad
from kiln.autotune.record import spec
from kiln.externs import kiln_attention
from kiln.ir.sizes import size_examples

aten = torch.ops.aten


def _layout(t: torch.Tensor | None) -> tuple | None:
    return None if t is None else (tuple(t.shape), tuple(t.stride()))


def timing_values(*vals: torch.Tensor | None) -> list[torch.Tensor | None] | None:
    """`vals`, or where their sizes are symbolic, meta tensors with every size symbol at the size
    bucket (the next power of two) of its example value, in shapes and strides alike (a key
    view's strides name the cache's capacity): a graph compiled once for all sizes is timed at
    the bucket of the call that compiled it, and the answer kept per bucket, as a GEMM's is
    (kiln/autotune/gemm.py `timing_value`). None where a size has no example value."""
    sizes = [s for val in vals if val is not None for s in (*val.shape, *val.stride())]
    symbolic = [s.node for s in sizes if isinstance(s, torch.SymInt)]
    if not symbolic:
        return list(vals)
    examples = {symbol: size_examples(node.shape_env).get(symbol) for node in symbolic for symbol in node.expr.free_symbols}
    if any(example is None for example in examples.values()):
        return None  # a size computed from tensor data: no example to time at
    bucket = {symbol: 1 << max(0, int(example) - 1).bit_length() for symbol, example in examples.items()}

    def at_bucket(size: int | torch.SymInt) -> int:
        return size if isinstance(size, int) else int(size.node.expr.xreplace(bucket))

    return [None if val is None else torch.empty_strided([at_bucket(s) for s in val.shape],
                                                         [at_bucket(s) for s in val.stride()],
                                                         dtype=val.dtype, device="meta") for val in vals]


def choose_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
                     causal: bool, mode: str = "default") -> str:
    """"kiln" or "aten": the faster attention for fake values q, k, v and mask (kiln's kernel
    offered only where it applies), timed at the size bucket of symbolic sizes (`timing_values`)."""
    timed = timing_values(q, k, v, mask) if kiln_attention.applies(q, k, v, mask) else None
    if timed is None:
        return "aten"
    q, k, v, mask = timed
    r = Inputs(q=(q, None), k=(k, None), v=(v, None), mask=(mask, None))
    candidates = {"aten": lambda: aten._scaled_dot_product_flash_attention_for_cpu(
        r.q, r.k, r.v, is_causal=causal, attn_mask=r.mask, scale=scale),
                  "kiln": lambda: kiln_attention.attention(r.q, r.k, r.v, r.mask, scale, causal)}
    signature = (_layout(q), _layout(k), _layout(v), _layout(mask), str(q.dtype), causal)
    question = lambda: {"op": "attention", "q": spec(q), "k": spec(k), "v": spec(v), "mask": spec(mask),  # noqa: E731
                        "scale": scale, "causal": causal}
    return choose("attention", signature, no_grad(candidates), BUDGET[mode], ROUNDS[mode], question=question,
                  default="aten")
