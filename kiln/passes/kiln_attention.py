"""ATen's CPU flash attention -> kiln's own attention kernel, where the autotuner timed it faster:

    getitem(_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=m, scale=s), 0)
        -> kiln::attention(q, k, v, m, s (or 1/sqrt(head size)), causal)

Inference only: a graph that reads the log-sum-exp (a training forward saves it for its backward)
keeps ATen's kernel, as does dropout. float32, v's head size a multiple of the vector width and
a mask, if any, of float32 (kiln/externs/kiln_attention.py: `applies`); symbolic sizes (a decode
step's growing cache) are timed at their size bucket (kiln/autotune/attention.py). The
`attention` pass runs first, so attention written out in eager ops is offered too.
"""

from __future__ import annotations

import math

import torch
from torch import fx

from kiln import logs
from kiln.autotune import mode as autotune_mode
from kiln.autotune.attention import choose_attention
from kiln.externs import kiln_attention as kernel
from kiln.ir.target import Target
from kiln.passes.attention import inference_flash_calls
from kiln.passes.pattern import insert, remove_dead



def _value(node: object) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def kiln_attention(gm: fx.GraphModule, target: Target) -> bool:
    mode = autotune_mode()
    if target.device != "cpu" or mode == "off":
        return False
    changed = False
    for node, (q, k, v, dropout, causal, mask, scale) in inference_flash_calls(gm):
        vals = [_value(n) for n in (q, k, v)]
        mask_val = _value(mask) if mask is not None else None
        if dropout != 0 or any(val is None for val in vals) or (mask is not None and mask_val is None):
            continue
        if not kernel.applies(*vals, mask_val):
            continue
        scale = 1.0 / math.sqrt(vals[0].shape[-1]) if scale is None else float(scale)
        impl = choose_attention(*vals, mask_val, scale, bool(causal), mode)
        logs.log("autotune", "attention %s %s%s%s: %s", node.name, tuple(vals[0].shape), " causal" if causal else "",
                 " masked" if mask is not None else "", impl)
        if impl != "kiln":
            continue
        call = insert(gm, node, kernel.op(), q, k, v, mask, scale, bool(causal))
        for user in list(node.users):
            user.replace_all_uses_with(call)
        remove_dead(gm, list(node.users))
        changed = True
    return changed
