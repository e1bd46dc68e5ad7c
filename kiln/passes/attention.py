"""Attention written out in eager ops, rewritten to one call of a fused attention kernel.

    softmax(q @ kᵀ · scale [+ mask]) @ v   ->   _scaled_dot_product_flash_attention_for_cpu(q, k, v,
                                                      attn_mask=mask, scale=scale)[0]      (CPU)
                                           ->   scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                      scale=scale)                          (CUDA)

On CUDA, `scaled_dot_product_attention` picks ATen's flash, memory-efficient or cuDNN kernel for
the call's dtype and mask at run time (the math fallback where none applies).

The scale may multiply or divide the scores, or have been applied to q before the product (then
it stays there and the call's scale is 1); a tensor that scales each row of scores alike (Swin V2's
per-head logit scale, [heads, 1, 1]) moves onto q, and the call's scale is 1. Masks added in five
dimensions between two views (Swin's shifted windows, [images, windows, heads, N, N]) become one
four-dimensional mask. Eval-mode dropout is already gone from the graph. In
core ATen each 4-d matmul is `view(bmm(view(expand(a)), view(expand(b))))`, which is what is
matched (with a copy before the bmm where an operand is a permuted view), for float32 tensors of
4 dims (on CUDA also bfloat16 and float16) and an additive mask broadcastable to the scores. The kernel computes the same sum in another order, in blocks, never storing the scores.
"""

from __future__ import annotations

import numbers
import operator

import torch
from torch import fx

from kiln.ir.target import Target
from kiln.passes.pattern import Op, Var, arguments, insert, match, remove_dead

aten = torch.ops.aten
FLASH = aten._scaled_dot_product_flash_attention_for_cpu.default


def inference_flash_calls(gm: fx.GraphModule):
    """(node, (q, k, v, dropout, causal, mask, scale)) for each of ATen's CPU flash attention calls
    whose output alone is read (not the log-sum-exp a training forward saves for its backward): what
    the later attention passes may rewrite. A list, so that they may edit the graph meanwhile."""
    return [(node, arguments(node)) for node in gm.graph.nodes
            if node.op == "call_function" and node.target is FLASH and node.users
            and all(u.target is operator.getitem and u.args[1] == 0 for u in node.users)]

_VIEW = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _operand(name: str, copied: bool) -> Op:
    """One side of a 4-d matmul: `view(expand(x))`, or `view(clone(expand(x)))` where x is not
    contiguous (a permuted head view: core ATen copies it before the bmm)."""
    expanded = Op(aten.expand.default, Var(name), Var(f"{name}_size"))
    if copied:
        expanded = Op(aten.clone.default, expanded, ...)
    return Op(_VIEW, expanded, Var(f"{name}_flat"))


def _matmuls(name_a: str, name_b: str) -> list[Op]:
    """A 4-d matmul as core ATen writes it, `view(bmm(operand, operand))`, each operand copied or not."""
    return [Op(_VIEW, Op(aten.bmm.default, _operand(name_a, copy_a), _operand(name_b, copy_b)), Var("shape"))
            for copy_a in (False, True) for copy_b in (False, True)]


_SCORES = _matmuls("q", "kt")
_OUTPUT = _matmuls("probs", "v")


def _match_any(patterns: list[Op], node: fx.Node):
    return next((found for pattern in patterns if (found := match(pattern, node)) is not None), None)


def _float4d(dtypes: tuple, *nodes: fx.Node) -> bool:
    vals = [n.meta.get("val") for n in nodes]
    return all(isinstance(v, torch.Tensor) and v.dim() == 4 and v.dtype in dtypes for v in vals)


# The fused kernel each device's graphs call, and the dtypes it takes.
_KERNELS = {
    "cpu": (aten._scaled_dot_product_flash_attention_for_cpu.default, (torch.float32,)),
    "cuda": (aten.scaled_dot_product_attention.default, (torch.float32, torch.bfloat16, torch.float16)),
}


def _window_masks(node: fx.Node) -> tuple[fx.Node, list[fx.Node], tuple] | None:
    """Swin's shifted windows add their mask in five dimensions between two views,
    `view(add(... add(view(x, [B/nW, nW, H, N, N]), m1) ..., mk), [B, H, N, N])`: (x, [m1, ...,
    mk], the five dimensions), or None."""
    if node.op != "call_function" or node.target not in _VIEW or len(node.users) != 1:
        return None
    masks, inner = [], node.args[0]
    while (isinstance(inner, fx.Node) and inner.op == "call_function" and inner.target is aten.add.Tensor
           and len(inner.users) == 1 and len(inner.args) == 2 and not inner.kwargs and isinstance(inner.args[1], fx.Node)):
        masks.append(inner.args[1])
        inner = inner.args[0]
    if not masks or not isinstance(inner, fx.Node) or inner.op != "call_function" or inner.target not in _VIEW:
        return None
    x = inner.args[0]
    vx, v5, vn = x.meta.get("val"), inner.meta.get("val"), node.meta.get("val")
    if len(inner.users) != 1 or not all(isinstance(v, torch.Tensor) for v in (vx, v5, vn)):
        return None
    if vx.dim() != 4 or v5.dim() != 5 or vx.shape != vn.shape or v5.shape[0] * v5.shape[1] != vx.shape[0]:
        return None
    if tuple(v5.shape[2:]) != tuple(vx.shape[1:]):
        return None
    for mask in masks:
        vm = mask.meta.get("val")
        if not isinstance(vm, torch.Tensor) or vm.dtype != vx.dtype or vm.dim() != 5:
            return None
        if any(m not in (1, s) for m, s in zip(vm.shape, v5.shape)):
            return None
    return x, masks[::-1], tuple(v5.shape)


def _window_mask(gm: fx.GraphModule, before: fx.Node, mask: fx.Node | None, masks: list[fx.Node],
                 shape: tuple) -> fx.Node:
    """`mask` plus each five-dimensional window mask as a four-dimensional one, [B, H or 1, N, N]
    (expanded over the images, copied where that repeats it), added in the graph's order."""
    images, windows, _, n, m = shape
    for window in masks:
        heads = window.meta["val"].shape[2]
        expanded = insert(gm, before, aten.expand.default, window, [images, windows, heads, n, m])
        copied = insert(gm, before, aten.clone.default, expanded, memory_format=torch.contiguous_format)
        flat = insert(gm, before, aten.view.default, copied, [images * windows, heads, n, m])
        mask = flat if mask is None else insert(gm, before, aten.add.Tensor, mask, flat)
    return mask


def _unwrap_scores(node: fx.Node) -> tuple[fx.Node, fx.Node | None, float | fx.Node, tuple | None] | None:
    """(the q·kᵀ node, the additive mask, the scale, Swin's window masks or None) behind a
    softmax's input."""
    windowed = _window_masks(node)
    if windowed is not None:
        node = windowed[0]
    unwrapped = _unwrap_scaled_scores(node)
    return None if unwrapped is None else (*unwrapped, None if windowed is None else windowed[1:])


def _unwrap_scaled_scores(node: fx.Node) -> tuple[fx.Node, fx.Node | None, float | fx.Node] | None:
    """(the q·kᵀ node, the additive mask, the scale) behind `node`."""
    mask, scale = None, 1.0
    if node.op == "call_function" and node.target is aten.add.Tensor and len(node.users) == 1:
        a, b = node.args[:2]
        if len(node.args) > 2 or node.kwargs or not isinstance(b, fx.Node):
            return None
        node, mask = a, b
    if node.op == "call_function" and node.target in (aten.mul.Tensor, aten.div.Tensor) and len(node.users) == 1:
        a, c = node.args[:2]
        if node.target is aten.mul.Tensor and isinstance(a, fx.Node) and isinstance(c, fx.Node):
            if _scales_rows(a, c):
                a, c = c, a
            return (a, mask, c) if _scales_rows(c, a) else None
        if not isinstance(c, numbers.Number) or isinstance(c, bool) or c == 0:
            return None
        scale = float(c) if node.target is aten.mul.Tensor else 1.0 / float(c)
        node = a
    return node, mask, scale


def _scales_rows(scale: fx.Node, scores: fx.Node) -> bool:
    """Whether tensor `scale` multiplies every key's score of a row alike (size 1 along the keys,
    broadcastable to the scores without growing them): Swin V2's per-head logit scale, [heads,
    1, 1]. Such a scale moves onto q (q · s) · kᵀ = s (q · kᵀ)."""
    vs, vc = scores.meta.get("val"), scale.meta.get("val")
    if not isinstance(vs, torch.Tensor) or not isinstance(vc, torch.Tensor) or vc.dtype != vs.dtype:
        return False
    if vc.dim() > vs.dim() or vc.dim() == 0 or vc.shape[-1] != 1:
        return False
    return all(c in (1, s) for c, s in zip(reversed(vc.shape), reversed(vs.shape)))


def _mask_fits(mask: fx.Node | None, scores: fx.Node) -> bool:
    if mask is None:
        return True
    vm, vs = mask.meta.get("val"), scores.meta.get("val")
    if not isinstance(vm, torch.Tensor) or vm.dtype != vs.dtype or vm.dim() != 4:
        return False
    return all(m in (1, s) for m, s in zip(vm.shape, vs.shape))


def attention(gm: fx.GraphModule, target: Target) -> bool:
    if target.device not in _KERNELS:
        return False
    kernel, dtypes = _KERNELS[target.device]
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten._softmax.default or node.args[1:] not in ((-1, False), (3, False)):
            continue
        if getattr(node, "_erased", False) or len(node.users) != 1:
            continue
        unwrapped = _unwrap_scores(node.args[0])
        if unwrapped is None:
            continue
        scores, mask, scale, windowed = unwrapped
        found = _match_any(_SCORES, scores) if scores.op == "call_function" and len(scores.users) == 1 else None
        consumer = _consumer(node)
        out = _match_any(_OUTPUT, consumer) if consumer is not None else None
        if found is None or out is None or _through_dropout(out["probs"]) is not node:
            continue
        q, kt, v = found["q"], found["kt"], out["v"]
        if not _float4d(dtypes, q, kt, v, scores) or not _mask_fits(mask, scores):
            continue
        if isinstance(scale, fx.Node):  # a tensor scale of rows: onto q, where it joins q's kernel
            q, scale = insert(gm, consumer, aten.mul.Tensor, q, scale), 1.0
        if windowed is not None:  # the window masks join the mask (constants: folded once)
            mask = _window_mask(gm, consumer, mask, *windowed)
        k = insert(gm, consumer, aten.transpose.int, kt, -2, -1)
        with gm.graph.inserting_before(consumer):
            call = gm.graph.call_function(kernel, (q, k, v), {"attn_mask": mask, "scale": scale})
        with q.meta["val"].fake_mode:
            call.meta["val"] = kernel(q.meta["val"], k.meta["val"], v.meta["val"],
                                      attn_mask=mask.meta["val"] if mask is not None else None, scale=scale)
        # The CPU kernel returns (output, log-sum-exp); scaled_dot_product_attention the output.
        result = insert(gm, consumer, operator.getitem, call, 0) if isinstance(call.meta["val"], tuple) else call
        consumer.replace_all_uses_with(result)
        remove_dead(gm, [consumer])
        changed = True
    return changed


def _through_dropout(node: fx.Node) -> fx.Node:
    """Eval-mode dropout is a clone in core ATen: look through it."""
    if node.op == "call_function" and node.target is aten.clone.default and len(node.users) == 1:
        return node.args[0]
    return node


def _consumer(softmax: fx.Node) -> fx.Node | None:
    """The view after the bmm that reads the probabilities (the root of the second matmul)."""
    node = softmax
    if len(node.users) == 1 and next(iter(node.users)).target is aten.clone.default:
        node = next(iter(node.users))
    for _ in range(3):  # expand, view, bmm
        if len(node.users) != 1:
            return None
        node = next(iter(node.users))
    if node.target is not aten.bmm.default or len(node.users) != 1:
        return None
    return next(iter(node.users))
