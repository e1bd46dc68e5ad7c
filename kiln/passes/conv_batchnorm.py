"""Inference batch norm after a convolution, folded into the convolution's weight and bias.

    batch_norm(conv(x, w, b)) = conv(x, w * s, (b - mean) * s + beta),  s = gamma / sqrt(var + eps)

when w, b and the norm's statistics and affine parameters are frozen: the new weight and bias are
computed once by the frozen graph (kiln/runtime/frozen.py), and the norm's pass over the
activations disappears. The fold is exact up to float rounding.
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from kiln.passes.constants import ConstantSet, has_frozen_inputs
from kiln.passes.pattern import Op, Var, insert, matches, remove_dead

aten = torch.ops.aten

_CONV = Op(aten.convolution.default, Var("x"), Var("w"), Var("b"), Var("stride"), Var("padding"), Var("dilation"),
           False, Var("output_padding"), Var("groups"), name="conv")
_NORM = Op(operator.getitem,
           Op(aten._native_batch_norm_legit_no_training.default, _CONV, Var("gamma"), Var("beta"), Var("mean"),
              Var("var"), Var("momentum"), Var("eps"), name="norm"),
           0)


def _same_dtype(found) -> bool:
    # Mixed precision (a bf16 convolution, fp32 statistics) would change the convolution's dtype.
    vals = [found[k].meta.get("val") for k in ("x", "w", "mean", "var")]
    return len({getattr(v, "dtype", None) for v in vals}) == 1


def conv_batchnorm(gm: fx.GraphModule) -> bool:
    if not has_frozen_inputs(gm):
        return False
    constants = ConstantSet(gm)
    changed = False
    for root, found in matches(gm, _NORM):
        if not constants.all(*(found[k] for k in ("w", "b", "gamma", "beta", "mean", "var"))) or not _same_dtype(found):
            continue
        g = lambda target, *args: insert(gm, root, target, *args)  # noqa: E731
        w, b, mean, eps = found["w"], found["b"], found["mean"], found["eps"]
        scale = g(aten.rsqrt.default, g(aten.add.Tensor, found["var"], eps))
        if found["gamma"] is not None:
            scale = g(aten.mul.Tensor, scale, found["gamma"])
        new_w = g(aten.mul.Tensor, w, g(aten.view.default, scale, [-1] + [1] * (w.meta["val"].dim() - 1)))
        shifted = g(aten.neg.default, mean) if b is None else g(aten.sub.Tensor, b, mean)
        new_b = g(aten.mul.Tensor, shifted, scale)
        if found["beta"] is not None:
            new_b = g(aten.add.Tensor, new_b, found["beta"])
        conv = found["conv"]
        folded = g(aten.convolution.default, found["x"], new_w, new_b, *conv.args[3:])
        root.replace_all_uses_with(folded)
        remove_dead(gm, [root])
        changed = True
    return changed
