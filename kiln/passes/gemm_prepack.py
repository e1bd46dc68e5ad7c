"""A matrix product with a frozen right operand runs the implementation measured fastest for its
shapes: ATen as it is, a contiguous copy of the weight in either order, MKL's packed GEMM or
oneDNN's blocked weights (`kiln::mm`, kiln/externs/prepacked.py). When ATen wins, the node is
left as it is.

    mm(a, b)              -> kiln::mm(a, b, None, "none", impl)
    addmm(bias, a, b)     -> kiln::mm(a, b, bias, "none", impl)     (beta = alpha = 1, bias of shape [N])

A unary op that is all the product feeds (after a constant bias add and reshapes, as linear
layers leave them) is timed with it, and when oneDNN with the op inside its GEMM wins, it runs
there as a post-op instead of as a kernel of its own: the GEMM's output is written once, activated.

    gelu(view(mm(a, b) + bias))  -> view(kiln::mm(a, b, bias, "gelu", "onednn"))

A graph whose products read more weight bytes a call than the last-level cache holds (a decoder's
step) has its memory-bound products timed on weights from DRAM (kiln/autotune/gemm.py).

With the setting `backend.fp32_gemm` at "bf16" (bfloat16 fast math), every float32 product here
runs kiln's GEMM over bfloat16 operands, its unary op inside, whatever `backend.autotune` says:
the user asked for it, and it is never timed against the float32 implementations.

    gelu(view(mm(a, b) + bias))  -> view(kiln::mm(a, b, bias, "gelu", "kiln_bf16"))
"""

from __future__ import annotations

import sympy
import torch
from torch import fx

from kiln import logs
from kiln.autotune import mode as autotune_mode
from kiln.autotune.gemm import FUSED_POST_OPS, choose_mm, streams_weights, timing_value
from kiln.externs import native_ops
from kiln.externs.prepacked import BF16_MATH_IMPL, fp32_gemm
from kiln.ir.sizes import size_expr
from kiln.ir.target import Target
from kiln.passes.constants import ConstantSet, has_frozen_inputs
from kiln.passes.pattern import Op, Var, arguments, insert, matches, remove_dead, replace
from kiln.passes.post_ops import NO_POST_OP, PostOp, only_user, unary_after

aten = torch.ops.aten

_MM = Op(aten.mm.default, Var("a"), Var("b"))
_ADDMM = Op(aten.addmm.default, Var("bias"), Var("a"), Var("b"), 1, 1)
_RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _suitable(a: fx.Node, b: fx.Node, bias: fx.Node | None) -> bool:
    va, vb = a.meta.get("val"), b.meta.get("val")
    if not (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor)) or va.dtype != vb.dtype:
        return False
    # Rows may be symbolic (a batch, a sequence): the weight, K and N may not.
    if va.dtype not in (torch.float32, torch.bfloat16) or not all(isinstance(s, int) for s in (*va.shape[1:], *vb.shape)):
        return False
    vbias = bias.meta.get("val") if bias is not None else None
    return bias is None or (isinstance(vbias, torch.Tensor) and tuple(vbias.shape) == (vb.shape[1],) and vbias.dtype == va.dtype)


def _matches(gm: fx.GraphModule):
    for pattern in (_MM, _ADDMM):
        yield from matches(gm, pattern)


def _bias_add(mm: fx.Node, constants: ConstantSet) -> fx.Node | None:
    """The constant bias that `mm(a, b) + bias` adds, when that add is all the product feeds."""
    add = only_user(mm)
    if add is None or add.target is not aten.add.Tensor:
        return None
    args = arguments(add)
    other = args[1] if args[0] is mm else args[0]
    return other if args[2] == 1 and other is not mm and other in constants else None


def _post_op(node: fx.Node, bias: fx.Node | None,
             constants: ConstantSet) -> tuple[fx.Node | None, fx.Node, PostOp, fx.Node] | None:
    """(bias, the unary node, its post-op, the value the unary reads) when the product, its bias add
    and reshapes feed nothing but a unary op oneDNN applies."""
    last = node
    if bias is None and (added := _bias_add(node, constants)) is not None:
        bias, last = added, only_user(node)
    while (user := only_user(last)) is not None and user.target in _RESHAPES:
        last = user
    found = unary_after(last)
    return (bias, *found, last) if found is not None else None


def _fuse(gm: fx.GraphModule, unary: fx.Node, source: fx.Node, a: fx.Node, b: fx.Node, bias: fx.Node | None,
          post_op: PostOp, impl: str) -> bool:
    """`unary`'s value (an op over `source`) as one call of GEMM `impl` with the op inside,
    reshaped to the unary's shape."""
    name, scalars, algorithm = post_op
    fused = insert(gm, unary, native_ops.op("mm"), a, b, bias, name, scalars, algorithm or None, impl)
    shape = [size_expr(s) for s in unary.meta["val"].shape]
    if [size_expr(s) for s in fused.meta["val"].shape] != shape:
        # A symbolic shape is the reshape's own size arguments (graph nodes that compute it).
        sizes = source.args[1] if isinstance(source, fx.Node) and source.target in _RESHAPES else shape
        if any(not isinstance(s, (int, fx.Node)) and not s.is_Integer for s in sizes):
            return False
        fused = insert(gm, unary, aten.view.default, fused, [int(s) if isinstance(s, sympy.Integer) else s for s in sizes])
    unary.replace_all_uses_with(fused)
    remove_dead(gm, [unary])
    return True


def gemm_prepack(gm: fx.GraphModule, target: Target) -> bool:
    mode = autotune_mode()
    bf16_math = fp32_gemm() == "bf16"
    if target.device != "cpu" or not has_frozen_inputs(gm) or (mode == "off" and not bf16_math):
        return False
    constants = ConstantSet(gm)
    from_dram = streams_weights(_weight_bytes(gm, constants))
    changed = False
    for node, bound in _matches(gm):
        a, b, bias = bound["a"], bound["b"], bound.get("bias")
        if b not in constants or not constants.all(bias) or not _suitable(a, b, bias):
            continue
        chain = _post_op(node, bias, constants)
        if chain is not None and not _suitable(a, b, chain[0]):
            chain = None
        timed_bias, post_op = (chain[0], chain[2]) if chain is not None else (bias, NO_POST_OP)
        fast = bf16_math and a.meta["val"].dtype == torch.float32
        if fast:
            impl, fused = BF16_MATH_IMPL, chain is not None
            choice = f"{impl} (backend.fp32_gemm=bf16)"
        elif mode == "off":
            continue
        else:
            choice = choose_mm(timing_value(a.meta["val"]), b.meta["val"], _val(timed_bias), mode, post_op, from_dram)
            impl, fused = FUSED_POST_OPS.get(choice, choice), choice in FUSED_POST_OPS
        logs.log("freezing", "%s %s x %s%s: %s", node.name, _shape(a), _shape(b),
                 f" + {post_op[0]}" if chain is not None else "", choice)
        if fused and _fuse(gm, chain[1], chain[3], a, b, chain[0], post_op, impl):
            changed = True
            continue
        if fused and not fast:
            continue  # (the timed choice was the GEMM with the op inside; without it, ATen's)
        if impl != "aten":
            replace(gm, node, native_ops.op("mm"), a, b, bias, *NO_POST_OP[:2], None, impl)
            changed = True
    return changed


def _weight_bytes(gm: fx.GraphModule, constants: ConstantSet) -> int:
    """The bytes of the frozen weights this graph's products read a call (each weight once)."""
    weights = {bound["b"] for _, bound in _matches(gm) if bound["b"] in constants}
    return sum(w.meta["val"].numel() * w.meta["val"].element_size() for w in weights if isinstance(w.meta.get("val"), torch.Tensor))


def _val(node: fx.Node | None) -> torch.Tensor | None:
    return node.meta["val"] if node is not None else None


def _shape(node: fx.Node) -> tuple[int, ...]:
    return tuple(node.meta["val"].shape)
