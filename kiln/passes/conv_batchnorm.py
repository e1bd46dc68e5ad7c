"""Inference batch norm after a convolution, folded into the convolution's weight and bias.

    batch_norm(conv(x, w, b)) = conv(x, w * s, (b - mean) * s + beta),  s = gamma / sqrt(var + eps)

when w, b and the norm's statistics and affine parameters are frozen: the new weight and bias are
computed once by the frozen graph (kiln/runtime/frozen.py), and the norm's pass over the
activations disappears. The fold is exact up to float rounding. Under autocast (a bfloat16
convolution, float32 statistics) it is computed in float32 from the float32 weight and cast.
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from kiln.ir.target import Target
from kiln.passes.constants import ConstantSet, has_frozen_inputs
from kiln.passes.pattern import Op, Var, insert, matches, remove_dead

aten = torch.ops.aten

_CONV = Op(aten.convolution.default, Var("x"), Var("w"), Var("b"), Var("stride"), Var("padding"), Var("dilation"),
           False, Var("output_padding"), Var("groups"), name="conv")
_NORM = Op(operator.getitem,
           Op(aten._native_batch_norm_legit_no_training.default, _CONV, Var("gamma"), Var("beta"), Var("mean"),
              Var("var"), Var("momentum"), Var("eps"), name="norm"),
           0)


def _dtypes(found) -> tuple[torch.dtype | None, torch.dtype | None] | None:
    """(the convolution's dtype, the statistics') when the fold applies: the same, or a bfloat16
    convolution under float32 statistics (autocast), which is folded in float32 and cast."""
    conv, stats = (found[k].meta.get("val") for k in ("w", "mean"))
    x, var = (found[k].meta.get("val") for k in ("x", "var"))
    conv_dtype, stats_dtype = getattr(conv, "dtype", None), getattr(stats, "dtype", None)
    if getattr(x, "dtype", None) != conv_dtype or getattr(var, "dtype", None) != stats_dtype:
        return None
    if conv_dtype == stats_dtype or (conv_dtype, stats_dtype) == (torch.bfloat16, torch.float32):
        return conv_dtype, stats_dtype
    return None


def _in_dtype(g, node: fx.Node | None, dtype: torch.dtype) -> fx.Node | None:
    """`node` as `dtype`: the tensor an autocast cast was made from when it has that dtype (the
    fold then starts from the float32 weight, not its rounded bfloat16 copy), else a cast."""
    if node is None or node.meta["val"].dtype == dtype:
        return node
    if node.target is aten._to_copy.default and set(node.kwargs) == {"dtype"} and node.args[0].meta["val"].dtype == dtype:
        return node.args[0]
    return g(aten._to_copy.default, node, dtype=dtype)


def conv_batchnorm(gm: fx.GraphModule, target: Target) -> bool:
    if not has_frozen_inputs(gm):
        return False
    constants = ConstantSet(gm)
    changed = False
    for root, found in matches(gm, _NORM):
        dtypes = _dtypes(found)
        if not constants.all(*(found[k] for k in ("w", "b", "gamma", "beta", "mean", "var"))) or dtypes is None:
            continue
        g = lambda target, *args, **kwargs: insert(gm, root, target, *args, **kwargs)  # noqa: E731
        conv_dtype, stats_dtype = dtypes
        w, b = _in_dtype(g, found["w"], stats_dtype), _in_dtype(g, found["b"], stats_dtype)
        mean, eps = found["mean"], found["eps"]
        scale = g(aten.rsqrt.default, g(aten.add.Tensor, found["var"], eps))
        if found["gamma"] is not None:
            scale = g(aten.mul.Tensor, scale, found["gamma"])
        new_w = g(aten.mul.Tensor, w, g(aten.view.default, scale, [-1] + [1] * (w.meta["val"].dim() - 1)))
        shifted = g(aten.neg.default, mean) if b is None else g(aten.sub.Tensor, b, mean)
        new_b = g(aten.mul.Tensor, shifted, scale)
        if found["beta"] is not None:
            new_b = g(aten.add.Tensor, new_b, found["beta"])
        if conv_dtype != stats_dtype:
            new_w, new_b = (g(aten._to_copy.default, v, dtype=conv_dtype) for v in (new_w, new_b))
        conv = found["conv"]
        folded = g(aten.convolution.default, found["x"], new_w, new_b, *conv.args[3:])
        root.replace_all_uses_with(folded)
        remove_dead(gm, [root])
        changed = True
    return changed
