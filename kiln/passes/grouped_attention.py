"""A decode step's grouped-query attention without copies of its keys and values.

Grouped-query attention (Llama 2/3, Mistral, Qwen2, TinyLlama) has fewer key/value heads than
query heads; HuggingFace repeats each key/value head for its group before the attention
(`repeat_kv`: unsqueeze, expand, then a copy to [B, H, S, D]), so each step copies the whole
cache, n_rep times over, and the attention reads the copies (TinyLlama, 32 heads over 4, at 160
positions: 2.9 MB copied and 2.6 MB read a layer where the cache holds 0.33 MB). With one query
row (a decode step) the group's queries can instead be the rows of one attention over the
unrepeated head: q [B, H, 1, D] viewed as [B, Hkv, n_rep, D], each row its own query, the mask
(the same for every head) broadcast over them:

    getitem(flash_for_cpu(q, repeat(k), repeat(v), 0.0, False, attn_mask=m, scale=s), 0)
        -> view(getitem(flash_for_cpu(view(q, [B, Hkv, n_rep, D]), k, v, 0.0, False, attn_mask=m, scale=s), 0),
                [B, H, 1, Dv])

ATen's call may also be handed the unrepeated heads (SDPA's `enable_gqa`: HuggingFace asks for it
where it passes no mask, a dynamic cache's decode step); ATen's CPU kernel then reads each head's
keys once per query head, and kiln's kernel does not take such a call. It is viewed the same way.

The attention stays ATen's operator, so the kiln_attention pass after this one still chooses
between ATen's kernel and kiln's for the new shapes. Prefill (more query rows) keeps the copies:
its rows of one head would not be one stride apart in the view. The cache's length may be
symbolic (a growing cache's graph serves every length); the query's sizes are static.
"""

from __future__ import annotations

import operator
import sys

import torch
from torch import fx

from kiln import logs
from kiln.ir.sizes import shape_key
from kiln.ir.target import Target
from kiln.passes.attention import FLASH, inference_flash_calls
from kiln.passes.pattern import insert, remove_dead

aten = torch.ops.aten


def _shape(node: object) -> tuple | None:
    """`node`'s sizes, symbolic ones as expressions (a growing cache's length: kiln/ir/sizes.py `shape_key`)."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return shape_key(val) if isinstance(val, torch.Tensor) else None


def _static(shape: tuple | None) -> bool:
    return shape is not None and all(isinstance(s, int) for s in shape)


def _past_whole_slices(node: object) -> object:
    """`node`'s source past slices that keep every element (`x[:, :, None, :, :]` of a cache whose
    length is symbolic keeps `slice(x, 3, 0, 2**63 - 1)`; a static one drops it)."""
    while (isinstance(node, fx.Node) and node.target is aten.slice.Tensor and node.args[2:3] in ((), (0,), (None,))
           and node.args[3:4] in ((), (None,), (sys.maxsize,)) and node.args[4:5] in ((), (1,))):
        node = node.args[0]
    return node


def _unrepeated(node: object) -> tuple[fx.Node, int] | None:
    """(the [B, Hkv, S, D] head, n_rep) when `node` is HuggingFace's repeat_kv of it:
    view(clone(expand(unsqueeze(head, 2), [B, Hkv, n_rep, S, D])), [B, Hkv * n_rep, S, D]), whole
    slices between the unsqueeze and the expand passed over."""
    if not isinstance(node, fx.Node) or node.target not in (aten.view.default, aten._unsafe_view.default):
        return None
    inner = node.args[0]
    if isinstance(inner, fx.Node) and inner.target is aten.clone.default:
        inner = inner.args[0]
    if not isinstance(inner, fx.Node) or inner.target is not aten.expand.default:
        return None
    unsqueezed = _past_whole_slices(inner.args[0])
    if not isinstance(unsqueezed, fx.Node) or unsqueezed.target is not aten.unsqueeze.default or unsqueezed.args[1] != 2:
        return None
    head = unsqueezed.args[0]
    expanded, repeated, base = _shape(inner), _shape(node), _shape(head)
    if expanded is None or repeated is None or base is None or len(base) != 4 or len(expanded) != 5:
        return None
    b, kv_heads, s, d = base
    n_rep = expanded[2]
    if (not isinstance(n_rep, int) or expanded != (b, kv_heads, n_rep, s, d)
            or repeated != (b, kv_heads * n_rep, s, d)):
        return None
    return head, n_rep


def _shared_heads(node: object, q_shape: tuple) -> tuple[fx.Node, int] | None:
    """(`node`, n_rep) when `node` is a [B, Hkv, S, D] head that ATen's call itself shares among
    n_rep query heads each (SDPA's `enable_gqa`, which HuggingFace asks for where no mask is
    passed: a decode step of a dynamic cache); None for a head per query head."""
    shape = _shape(node)
    if shape is None or len(shape) != 4 or shape[0] != q_shape[0] or not isinstance(shape[1], int):
        return None
    heads, kv_heads = q_shape[1], shape[1]
    return (node, heads // kv_heads) if kv_heads < heads and heads % kv_heads == 0 else None


def _viewable(node: fx.Node, shape: tuple) -> bool:
    try:
        node.meta["val"].view(shape)
    except RuntimeError:
        return False
    return True


def grouped_attention(gm: fx.GraphModule, target: Target) -> bool:
    if target.device != "cpu":
        return False
    changed = False
    for node, (q, k, v, dropout, causal, mask, scale) in inference_flash_calls(gm):
        q_shape = _shape(q)
        if not _static(q_shape) or len(q_shape) != 4 or dropout != 0 or causal:
            continue
        keys, values = _unrepeated(k), _unrepeated(v)
        if keys is None and values is None:
            keys, values = _shared_heads(k, q_shape), _shared_heads(v, q_shape)
        if keys is None or values is None or keys[1] != values[1]:
            continue
        (k_head, n_rep), (v_head, _) = keys, values
        b, heads, rows, d = q_shape
        mask_shape = _shape(mask) if mask is not None else None
        if rows != 1 or (mask is not None and (mask_shape is None or len(mask_shape) != 4 or mask_shape[1] != 1)):
            continue  # more than one query row, or a mask per head
        out_shape = tuple(node.meta["val"][0].shape)
        q_grouped = insert(gm, node, aten.view.default, q, [b, heads // n_rep, n_rep, d])
        grouped = insert(gm, node, FLASH, q_grouped, k_head, v_head, 0.0, False, attn_mask=mask, scale=scale)
        out = insert(gm, node, operator.getitem, grouped, 0)
        if not _viewable(out, out_shape):  # ATen's CPU kernel lays its output out [B, rows, H, D]
            out = insert(gm, node, aten.clone.default, out, memory_format=torch.contiguous_format)
        merged = insert(gm, node, aten.view.default, out, list(out_shape))
        for user in list(node.users):
            user.replace_all_uses_with(merged)
        remove_dead(gm, list(node.users))
        logs.log("passes", "%s: grouped-query attention, %d heads over %d, without the copies of k and v", node.name,
                 heads, heads // n_rep)
        changed = True
    return changed
