"""A layer norm over the rows of kiln's GEMM (plus a bias and a residual) runs inside the GEMM:

    layer_norm(view(kiln::mm(a, b, None, "none", "kiln")) + bias + residual, [N], w, beta, eps)
        -> view(kiln::mm_layer_norm(a, b, bias, view(residual, [M, N]), w, beta, eps))

as in a post-norm transformer's two sublayer outputs (BERT, DistilBERT); where the sum is read
again (a pre-norm model's residual stream: GPT-2, ViT), `kiln::mm_add_layer_norm` returns it
too. An RMS norm as T5's and Llama's decompose, `weight * (x * rsqrt(mean(x^2, [-1]) + eps))`
(the weight optional, either operand order), is fused the same way with `rms=True`; a softmax or
log-softmax over the last dimension (a classifier's probabilities, an MoE router's weights over
its experts) whose sum nothing else reads becomes `kiln::mm_softmax`. kiln's GEMM normalizes each
row in its own parallel region once every thread has stored its tiles (kiln_gemm.h), while the
product is in the caches, instead of a reduction kernel reading it back after the GEMM returns.
Only where the autotuner gave the product to kiln's GEMM (gemm_prepack runs first), in float32 or
bfloat16 (HF's bfloat16 RMS norms, which convert to float32 and back around the norm, taken with
their casts), with static sizes; the terms of the sum in any order. A float32 product in bfloat16
fast math (`kiln_bf16`, backend.fp32_gemm) is fused the same way, the fused call with its `impl`.
A layer or RMS norm after a weight-only quantized product (`kiln::mm_quant`, quantized_gemm.py,
which may have taken the residual already) becomes `kiln::mm_quant_layer_norm` or
`kiln::mm_quant_add_layer_norm`, float32 only: a quantized decoder's two norms a layer.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch import fx

from kiln import logs
from kiln.externs import native_ops
from kiln.externs.prepacked import BF16_MATH_IMPL, KILN_GEMM_IMPLS
from kiln.ir.target import Target
from kiln.passes.constants import ConstantSet, has_frozen_inputs
from kiln.passes.pattern import Op, Var, arguments, insert, match, remove_dead
from kiln.passes.post_ops import only_user

aten = torch.ops.aten
# The sums normalized: bfloat16 ones from their float32 values inside the GEMM, as eager's norms
# compute in float32 (kiln_gemm.h `norm_out_bf16`).
_DTYPES = (torch.float32, torch.bfloat16)
_RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _val(node: object) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _beneath(node: fx.Node) -> fx.Node:
    """`node`'s value under single-use reshapes and clones that keep its layout (an inference
    graph's dropout is a clone): the same elements in the same order."""
    while node.op == "call_function" and len(node.users) == 1 and (
            node.target in _RESHAPES or (node.target is aten.clone.default
                                         and node.kwargs.get("memory_format") in (None, torch.preserve_format))):
        node = node.args[0]
    return node


def _is_add(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is aten.add.Tensor and arguments(node)[2] == 1


def _terms(node: fx.Node) -> list[fx.Node]:
    """The addends of a tree of single-use `add`s (through reshapes and clones) rooted at `node`."""
    if not _is_add(node) or not all(isinstance(a, fx.Node) for a in node.args[:2]):
        return [node]
    terms = []
    for operand in node.args[:2]:
        inner = _beneath(operand) if len(operand.users) == 1 else operand
        terms += _terms(inner) if _is_add(inner) and len(inner.users) == 1 else [operand]
    return terms


def _kiln_product(node: fx.Node, whole: bool = False) -> fx.Node | None:
    """The plain kiln-GEMM `kiln::mm` that `node` is (under single-use reshapes), in float32 or
    bfloat16 fast math, or a weight-only quantized `kiln::mm_quant` with no post-op (its bias and
    residual kept), else None. `whole`: `node` is the normalized sum itself, which others may read
    too (an `mm_quant` that quantized_gemm.py gave the residual already)."""
    node = _beneath(node)
    if node.op != "call_function":
        return None
    if native_ops.is_op(node.target, "mm_quant"):
        return node if arguments(node)[8] == "none" and (whole or len(node.users) == 1) else None
    if len(node.users) != 1:
        return None
    if not native_ops.is_op(node.target, "mm"):
        return None
    a, b, bias, unary, _, _, impl = arguments(node)
    return node if impl in KILN_GEMM_IMPLS and unary == "none" and bias is None else None


def _quantized(product: fx.Node) -> bool:
    return native_ops.is_op(product.target, "mm_quant")


def _vector(node: object, n: int, constants: ConstantSet, dtype: torch.dtype = torch.float32) -> bool:
    val = _val(node)
    return val is not None and node in constants and tuple(val.shape) == (n,) and val.dtype == dtype


@dataclass
class _Norm:
    """A normalization over the last dimension of `x`, found in the graph."""
    x: fx.Node
    weight: object  # a node, or None
    bias: object
    eps: float
    out: fx.Node  # the node whose value is the normalized x
    readers: tuple[fx.Node, ...]  # the norm's own readers of x (any other reads the sum again)
    kind: str  # "layer_norm", "rms_norm", "softmax" or "log_softmax"


def _layer_norm(norm: fx.Node) -> _Norm | None:
    """`norm`, a native_layer_norm over the last dimension whose statistics nothing reads."""
    x, shape, weight, norm_bias, eps = arguments(norm)
    getitems = list(norm.users)
    if len(getitems) != 1 or getitems[0].target is not operator.getitem or getitems[0].args[1] != 0:
        return None  # (mean and rstd are read: training, or a norm whose statistics are reused)
    if _val(x) is None or list(shape) != list(_val(x).shape[-1:]):
        return None
    return _Norm(x, weight, norm_bias, eps, getitems[0], (norm,), "layer_norm")


def _cast_of(node: object, dtype: torch.dtype) -> fx.Node | None:
    """What `node` converts to `dtype` (a `.to(dtype)` as HF writes it in its norms), else None."""
    if not isinstance(node, fx.Node) or node.op != "call_function" or _val(node) is None or _val(node).dtype != dtype:
        return None
    if node.target is aten._to_copy.default and set(node.kwargs) == {"dtype"} and len(node.args) == 1:
        return node.args[0]
    if node.target is torch.ops.prims.convert_element_type.default:
        return node.args[0]
    return None


def _rms_scaled(squared: object) -> Op:
    """x * rsqrt(mean(squared^2, dims, keepdim) + eps), each inner step read only by the next
    (pattern.py): `squared` is x itself, or a bfloat16 x's float32 copy (T5LayerNorm)."""
    mean_square = Op(aten.mean.dim, Op(aten.pow.Tensor_Scalar, squared, 2), Var("dims"), True)
    rstd = Op(aten.rsqrt.default, Op((aten.add.Tensor, aten.add.Scalar), mean_square,
                                     Var("eps", lambda eps: isinstance(eps, float))))
    return Op(aten.mul.Tensor, Var("x"), rstd, commutative=True)


_RMS_SCALED = _rms_scaled(Var("x"))
_WIDENED = (aten._to_copy.default, torch.ops.prims.convert_element_type.default)
_RMS_SCALED_WIDENED = _rms_scaled(Op(_WIDENED, Var("x"), ...))


def _rms_norm(scaled: fx.Node, constants: ConstantSet) -> _Norm | None:
    """The RMS norm whose `x * rsqrt(...)` is `scaled`, times a weight where its one reader is that
    product (HF's T5LayerNorm, LlamaRMSNorm: weight * (x * rsqrt(mean(x^2, [-1], keepdim) + eps))).
    A bfloat16 sum's norm as HF computes it, in float32 and back, is taken whole: LlamaRMSNorm's
    `weight * (x32 * rsqrt(mean(x32^2)...)).to(bf16)` with x32 = x.to(float32), and T5LayerNorm's
    `weight * (x * rsqrt(mean(x.to(float32)^2)...)).to(bf16)`."""
    found = match(_RMS_SCALED, scaled) or match(_RMS_SCALED_WIDENED, scaled)
    x = found["x"] if found is not None else None
    if x is None or _val(x) is None or list(found["dims"]) not in ([-1], [_val(x).dim() - 1]):
        return None
    square = next(node for node in found.nodes if node.target is aten.pow.Tensor_Scalar)
    if square.args[0] is not x and _cast_of(square.args[0], torch.float32) is not x:
        return None  # (T5's form squares x's float32 copy, nothing else)
    readers = (square.args[0] if square.args[0] is not x else square, scaled)
    narrow = _cast_of(x, torch.float32)
    if narrow is not None and _val(narrow) is not None and _val(narrow).dtype == torch.bfloat16:
        if any(user not in readers for user in x.users):
            return None  # (the float32 copy read elsewhere too)
        x, readers = narrow, (x,)  # (Llama: the norm reads the sum through its float32 copy only)
    out = scaled
    if _val(x).dtype == torch.bfloat16:
        out = only_user(scaled)
        if _cast_of(out, torch.bfloat16) is not scaled:
            return None  # (the result must come back to the sum's dtype, as HF's norms end)
    weight, user = None, only_user(out)
    if user is not None and user.target is aten.mul.Tensor:
        other = user.args[1] if user.args[0] is out else user.args[0]
        if _vector(other, _val(x).shape[-1], constants, _val(x).dtype):
            out, weight = user, other
    return _Norm(x, weight, None, found["eps"], out, readers, "rms_norm")


def _softmax(node: fx.Node) -> _Norm | None:
    """`node`, a softmax or log-softmax over the last dimension of a float32 x."""
    x, dim, half_to_float = arguments(node)
    if _val(x) is None or half_to_float or dim not in (-1, _val(x).dim() - 1):
        return None
    kind = "softmax" if node.target is aten._softmax.default else "log_softmax"
    return _Norm(x, None, None, 0.0, node, (node,), kind)


def _fusion(norm: _Norm, constants: ConstantSet) -> dict | None:
    """What the fused call takes, when `norm` normalizes a kiln product's sum."""
    x, weight, norm_bias = norm.x, norm.weight, norm.bias
    sum_val = _val(x)
    if sum_val is None or sum_val.dtype not in _DTYPES or not all(isinstance(s, int) for s in sum_val.shape):
        return None
    n, dtype = sum_val.shape[-1], sum_val.dtype
    if not all(v is None or _vector(v, n, constants, dtype) for v in (weight, norm_bias)):
        return None
    terms = _terms(_beneath(x) if len(x.users) == 1 else x)  # (a classifier's softmax reads a view of the sum)
    products = [p for p in map(_kiln_product, terms) if p is not None]
    if terms == [x] and not products:
        products = [p for p in [_kiln_product(x, whole=True)] if p is not None and _quantized(p)]
    if len(terms) > 3 or len(products) != 1:
        return None
    (product,) = products
    if _val(product).numel() != sum_val.numel() or _val(product).shape[-1] != n:
        return None  # (the product broadcast against a larger addend, or its rows cut: [M, h * d] as [M, h, d])
    others = [t for t in terms if t is not product and _kiln_product(t) is None]
    bias = [t for t in others if _vector(t, n, constants, dtype)]
    residual = [t for t in others if t not in bias and _val(t) is not None and _val(t).numel() == sum_val.numel()
                and _val(t).shape[-1] == n and _val(t).dtype == dtype and _val(t).is_contiguous()]
    if len(bias) > 1 or len(residual) > 1 or len(bias) + len(residual) != len(others):
        return None
    if _quantized(product):
        # (float32 only, as kiln::mm_quant; its own bias or residual and an added one would be two)
        own_bias, own_residual = arguments(product)[6:8]
        if dtype != torch.float32 or (bias and own_bias is not None) or (residual and own_residual is not None):
            return None
        residual = residual or ([own_residual] if own_residual is not None else [])
        if norm.kind not in ("layer_norm", "rms_norm"):
            return None
    # The fused call goes before the sum's first reader; the norm's weight and bias must be there.
    order = {node: k for k, node in enumerate(x.graph.nodes)}
    first = min(x.users, key=order.__getitem__)
    if any(isinstance(v, fx.Node) and order[v] > order[first] for v in (weight, norm_bias)):
        return None
    if _quantized(product):
        a, qweight, scales, zeros, bits, group_size, own_bias, _, _, _, _, int8_activations, impl = arguments(product)
        return {"a": a, "quantized": (qweight, scales, zeros, bits, group_size), "int8_activations": int8_activations,
                "bias": bias[0] if bias else own_bias, "residual": residual[0] if residual else None,
                "shape": list(sum_val.shape), "same_shape": list(_val(product).shape) == list(sum_val.shape),
                "first": first, "impl": impl}
    a, b = product.args[:2]
    return {"a": a, "b": b, "bias": bias[0] if bias else None, "residual": residual[0] if residual else None,
            "shape": list(sum_val.shape), "rows": _val(product).shape[0], "first": first,
            "impl": arguments(product)[6]}


def _float_call(gm: fx.GraphModule, norm: _Norm, found: dict, keep_sum: bool) -> tuple[fx.Node, fx.Node | None]:
    """kiln::mm_layer_norm, mm_add_layer_norm or mm_softmax over [rows, N] for `found`: (the norm,
    the sum where kept), each viewed as the sum's shape."""
    at, n, residual = found["first"], found["shape"][-1], found["residual"]
    if residual is not None:
        residual = insert(gm, at, aten.view.default, residual, [found["rows"], n])
    operands = (found["a"], found["b"], found["bias"], residual, norm.weight, norm.bias, norm.eps)
    # (the product's impl only where it is not the default, so float32 graphs are as before)
    impl = {"impl": found["impl"]} if found["impl"] == BF16_MATH_IMPL else {}
    flags = {"rms": True, **impl} if norm.kind == "rms_norm" else impl
    kept = None
    if norm.kind in ("softmax", "log_softmax"):
        fused = insert(gm, at, native_ops.op("mm_softmax"), *operands[:4],
                       **({"log": True} if norm.kind == "log_softmax" else {}), **impl)
    elif keep_sum:
        both = insert(gm, at, native_ops.op("mm_add_layer_norm"), *operands, **flags)
        fused = insert(gm, at, operator.getitem, both, 1)
        kept = insert(gm, at, aten.view.default, insert(gm, at, operator.getitem, both, 0), found["shape"])
    else:
        fused = insert(gm, at, native_ops.op("mm_layer_norm"), *operands, **flags)
    return insert(gm, at, aten.view.default, fused, found["shape"]), kept


def _quantized_call(gm: fx.GraphModule, norm: _Norm, found: dict, keep_sum: bool) -> tuple[fx.Node, fx.Node | None]:
    """kiln::mm_quant_layer_norm or mm_quant_add_layer_norm for `found`: as `_float_call`. Their
    results have a's leading sizes, as mm_quant's: a view only where the sum's differ."""
    at = found["first"]
    operands = (found["a"], *found["quantized"], found["bias"], found["residual"], norm.weight, norm.bias, norm.eps)
    flags = {"rms": norm.kind == "rms_norm", "int8_activations": found["int8_activations"]}
    if found["impl"] == BF16_MATH_IMPL:
        flags["impl"] = found["impl"]

    def shaped(value: fx.Node) -> fx.Node:
        return value if found["same_shape"] else insert(gm, at, aten.view.default, value, found["shape"])

    if not keep_sum:
        return shaped(insert(gm, at, native_ops.op("mm_quant_layer_norm"), *operands, **flags)), None
    both = insert(gm, at, native_ops.op("mm_quant_add_layer_norm"), *operands, **flags)
    return shaped(insert(gm, at, operator.getitem, both, 1)), shaped(insert(gm, at, operator.getitem, both, 0))


_NAMES = {"layer_norm": "layer norm", "rms_norm": "RMS norm", "softmax": "softmax", "log_softmax": "log-softmax"}


def gemm_layer_norm(gm: fx.GraphModule, target: Target) -> bool:
    if target.device != "cpu" or not has_frozen_inputs(gm):
        return False
    constants = ConstantSet(gm)
    changed = False
    for node in list(gm.graph.nodes):
        if getattr(node, "_erased", False) or node.op != "call_function":
            continue
        if node.target is aten.native_layer_norm.default:
            norm = _layer_norm(node)
        elif node.target is aten.mul.Tensor:
            norm = _rms_norm(node, constants)
        elif node.target in (aten._softmax.default, aten._log_softmax.default):
            norm = _softmax(node)
        else:
            continue
        found = _fusion(norm, constants) if norm is not None else None
        # (a pre-norm model's residual stream reads the sum again)
        keep_sum = found is not None and any(user not in norm.readers for user in norm.x.users)
        if found is None or (keep_sum and norm.kind in ("softmax", "log_softmax")):
            continue
        fused, kept = (_quantized_call if "quantized" in found else _float_call)(gm, norm, found, keep_sum)
        norm.out.replace_all_uses_with(fused)
        if keep_sum:
            norm.x.replace_all_uses_with(kept, delete_user_cb=lambda user: user not in norm.readers)
        remove_dead(gm, [norm.out])
        logs.log("freezing", "%s: %s inside kiln's %sGEMM %s%s%s", node.name, _NAMES[norm.kind],
                 "quantized " if "quantized" in found else "", tuple(found["shape"]),
                 ", the sum kept" if keep_sum else "", " (bfloat16 fast math)" if found["impl"] == BF16_MATH_IMPL else "")
        changed = True
    return changed
