"""A matrix product with a frozen right operand runs the implementation measured fastest for its
shapes: ATen as it is, a contiguous copy of the weight in either order, MKL's packed GEMM or
oneDNN's blocked weights (`kiln::mm`, kiln/runtime/prepacked.py). When ATen wins, the node is
left as it is.

    mm(a, b)              -> kiln::mm(a, b, None, impl)
    addmm(bias, a, b)     -> kiln::mm(a, b, bias, impl)     (beta = alpha = 1, bias of shape [N])
"""

from __future__ import annotations

import torch
from torch import fx

from kiln import logs
from kiln.autotune import mode as autotune_mode
from kiln.autotune.gemm import choose_mm
from kiln.passes.constants import ConstantSet, has_frozen_inputs
from kiln.passes.pattern import Op, Var, matches, replace

aten = torch.ops.aten

_MM = Op(aten.mm.default, Var("a"), Var("b"))
_ADDMM = Op(aten.addmm.default, Var("bias"), Var("a"), Var("b"), 1, 1)


def _suitable(a: fx.Node, b: fx.Node, bias: fx.Node | None) -> bool:
    va, vb = a.meta.get("val"), b.meta.get("val")
    if not (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor)) or va.dtype != vb.dtype:
        return False
    if va.dtype not in (torch.float32, torch.bfloat16) or not all(isinstance(s, int) for s in (*va.shape, *vb.shape)):
        return False
    vbias = bias.meta.get("val") if bias is not None else None
    return bias is None or (isinstance(vbias, torch.Tensor) and tuple(vbias.shape) == (vb.shape[1],) and vbias.dtype == va.dtype)


def _matches(gm: fx.GraphModule):
    for pattern in (_MM, _ADDMM):
        yield from matches(gm, pattern)


def gemm_prepack(gm: fx.GraphModule) -> bool:
    mode = autotune_mode()
    if not has_frozen_inputs(gm) or mode == "off":
        return False
    constants = ConstantSet(gm)
    changed = False
    for node, bound in _matches(gm):
        a, b, bias = bound["a"], bound["b"], bound.get("bias")
        if b not in constants or not constants.all(bias) or not _suitable(a, b, bias):
            continue
        impl = choose_mm(a.meta["val"], b.meta["val"], bias.meta["val"] if bias is not None else None, mode)
        logs.log("freezing", "%s %s x %s: %s", node.name, tuple(a.meta["val"].shape), tuple(b.meta["val"].shape), impl)
        if impl == "aten":
            continue
        replace(gm, node, torch.ops.kiln.mm.default, a, b, bias, impl)
        changed = True
    return changed
