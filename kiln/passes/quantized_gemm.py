"""A weight-only quantized Linear (kiln/quant, `kiln_quant::linear`) with frozen weights runs
kiln's GEMM over its packed quantized weight, `kiln::mm_quant`, with what follows it inside the
GEMM's store: the unary op that is all it feeds (oneDNN's post-op names, as gemm_prepack fuses
them) and then a residual added to that (a transformer's `h + o_proj(...)`, `h + down_proj(...)`).

    kiln_quant::linear(x, q, s, z, bits, g, bias, a8)             -> kiln::mm_quant(x, q, s, z, bits, g, bias, None, "none", [], None, a8)
    silu(kiln_quant::linear(...))                                  -> kiln::mm_quant(..., None, "swish", [], None)
    add(kiln_quant::linear(...), r)                                -> kiln::mm_quant(..., r, "none", [], None)

Before that, quantized Linears that read the same input (an attention's q, k and v projections, a
gated MLP's gate and up) become one (sibling_products.py), their weights, scales and zero points
concatenated: three calls of a third of the size each paid the call's fixed cost (on 2 cores
~11 us of 21 for a 768 x 768 int4 weight). A gated MLP's merged gate and up whose halves feed
only `U(gate) * up` become one `kiln::mm_quant_gated` (`U` any unary op the store applies), whose
store multiplies each output's two sums, so that no kernel after the product reads its 2h
columns back (a Qwen2-0.5B decode step's 24 of them took 7-10 us each on 2 cores):

    y = kiln_quant::linear(x, cat[gate; up], ...); silu(y[..., :h]) * y[..., h:]
                                                   -> kiln::mm_quant_gated(x, cat[gate; up], ..., "swish", [], None)

The quantized weight's packing is made on the first call and kept per weight (kiln_runtime.cpp
`mm_quant`). Float32 activations, or a bfloat16 model's (its output bfloat16, as eager's linear
makes it; not with int8 activations); elsewhere (a float16 model, freezing off) the operator
stays eager's reference, which dequantizes the weight on every call. With backend.fp32_gemm at
"bf16" (bfloat16 fast math) a float32 weight-only product takes `impl="kiln_bf16"`: a prompt's
rows on AMX's tiles (kiln_gemm_quant.h `gemm_quant_bf16_math`); int8 activations keep their own
path.
"""

from __future__ import annotations

import torch
from torch import fx

from kiln import logs
from kiln.externs import native_ops
from kiln.externs.prepacked import BF16_MATH_IMPL, fp32_gemm
from kiln.ir.target import Target
from kiln.passes.constants import ConstantSet, has_frozen_inputs
from kiln.passes.pattern import arguments, insert, remove_dead
from kiln.passes.post_ops import NO_POST_OP, PostOp, only_user, unary_after
from kiln.passes.sibling_products import MergedOf, concatenated, merge_siblings

aten = torch.ops.aten


def _is_quantized_linear(node: fx.Node) -> bool:
    target = node.target
    return node.op == "call_function" and isinstance(target, torch._ops.OpOverload) and target.name() == "kiln_quant::linear"


def reference_products(gm: fx.GraphModule) -> int:
    """How many quantized Linears of `gm` (after the rewrites) still run eager's reference, which
    dequantizes its whole weight on every call: the driver tells the user of them."""
    return sum(1 for node in gm.graph.nodes if _is_quantized_linear(node))


def _dtype(value: object) -> torch.dtype | None:
    val = value.meta.get("val") if isinstance(value, fx.Node) else None
    return val.dtype if isinstance(val, torch.Tensor) else None


def _residual(last: fx.Node) -> tuple[fx.Node, fx.Node] | None:
    """(the add, the tensor it adds) when all `last` feeds is `last + r`, r of its shape and dtype."""
    add = only_user(last)
    if add is None or add.target is not aten.add.Tensor:
        return None
    args = arguments(add)
    if args[2] != 1 or args[0] is args[1]:
        return None
    other = args[1] if args[0] is last else args[0]
    if _dtype(other) != _dtype(last) or tuple(other.meta["val"].shape) != tuple(last.meta["val"].shape):
        return None
    return add, other


def _half(node: fx.Node, source: fx.Node, start: int, end: int) -> bool:
    """Whether `node` is `source[..., start:end]`."""
    if node.target is not aten.slice.Tensor:
        return False
    _, dim, first, last, step = arguments(node)
    rank = source.meta["val"].dim()
    return dim in (-1, rank - 1) and first == start and last == end and step == 1


def _gate_and_up(node: fx.Node) -> tuple[fx.Node, PostOp, bool] | None:
    """(the mul, the gate's post-op, whether the gate is the first half) where all `node` (a product
    of 2h columns) feeds is `U(gate) * up`, the gate and up its two halves: a gated MLP's, merged."""
    width = node.meta["val"].shape[-1]
    if len(node.users) != 2 or not isinstance(width, int) or width % 2:
        return None
    half = width // 2
    firsts = [u for u in node.users if _half(u, node, 0, half)]
    seconds = [u for u in node.users if _half(u, node, half, width)]
    if len(firsts) != 1 or len(seconds) != 1:
        return None
    for gate, up in ((firsts[0], seconds[0]), (seconds[0], firsts[0])):
        found = unary_after(gate)
        if found is None:
            continue
        activation, post_op = found
        mul = only_user(activation)
        if mul is not None and mul.target is aten.mul.Tensor and only_user(up) is mul \
                and {*arguments(mul)[:2]} == {activation, up}:
            return mul, post_op, gate is firsts[0]
    return None


def _halves_swapped(gm: fx.GraphModule, before: fx.Node, constants: ConstantSet, value: fx.Node | None) -> fx.Node | None:
    """Constant `value` (a merged weight's, scales', zeros' or bias's rows) with its second half of
    rows first, computed at freezing."""
    if value is None:
        return None
    rows = value.meta["val"].shape[0]
    halves = [insert(gm, before, aten.slice.Tensor, value, 0, start, start + rows // 2) for start in (rows // 2, 0)]
    for half in halves:
        constants.add(half)
    return concatenated(gm, before, constants, halves, 0)


def _qualifies(node: fx.Node, constants: ConstantSet) -> bool:
    """Whether kiln's GEMM takes this quantized Linear: frozen weights; float32 activations, or a
    bfloat16 model's (without int8 activations); a bias of their dtype."""
    x, qweight, scales, zeros, bits, group_size, bias, int8_activations = arguments(node)
    dtype = _dtype(x)
    return qweight in constants and constants.all(scales, zeros, bias) and \
        (dtype == torch.float32 or (dtype == torch.bfloat16 and not int8_activations)) and \
        (bias is None or _dtype(bias) == dtype)


def _quantized_groups(gm: fx.GraphModule, constants: ConstantSet) -> list[list[fx.Node]]:
    """The quantized Linears kiln's GEMM takes, grouped by the input they read and their scheme
    (bits, group size, int8 activations or not, a bias or none)."""
    groups: dict[tuple, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        if _is_quantized_linear(node) and _qualifies(node, constants):
            x, _, _, _, bits, group_size, bias, int8_activations = arguments(node)
            groups.setdefault((x, bits, group_size, int8_activations, bias is None), []).append(node)
    return list(groups.values())


def _merged_quantized_linear(gm: fx.GraphModule, constants: ConstantSet) -> MergedOf:
    """Weights, scales, zeros and biases concatenated along the output features."""
    def merged_of(first: fx.Node, siblings: list[fx.Node]) -> fx.Node:
        x, _, _, _, bits, group_size, _, int8_activations = arguments(first)
        columns = [arguments(n) for n in siblings]
        parts = [concatenated(gm, first, constants, [c[i] for c in columns], 0) for i in (1, 2, 3, 6)]
        return insert(gm, first, first.target, x, *parts[:3], bits, group_size, parts[3], int8_activations)
    return merged_of


def quantized_gemm(gm: fx.GraphModule, target: Target) -> bool:
    if target.device != "cpu" or not has_frozen_inputs(gm):
        return False
    constants = ConstantSet(gm)
    bf16_math = fp32_gemm() == "bf16"
    changed = merge_siblings(gm, constants, _quantized_groups(gm, constants), _merged_quantized_linear(gm, constants),
                             "kiln_quant::linear")
    for node in list(gm.graph.nodes):
        if not _is_quantized_linear(node):
            continue
        if not _qualifies(node, constants):
            continue
        x, qweight, scales, zeros, bits, group_size, bias, int8_activations = arguments(node)
        # (the impl only where it is not the default, so float32 graphs are as before)
        impl = {"impl": BF16_MATH_IMPL} if bf16_math and not int8_activations and _dtype(x) == torch.float32 else {}
        gated = _gate_and_up(node)
        if gated is not None:
            mul, (name, scalars, algorithm), gate_first = gated
            if not gate_first:  # (up's Linear ran first: the gate's rows go first)
                qweight, scales, zeros, bias = (_halves_swapped(gm, mul, constants, v) for v in (qweight, scales, zeros, bias))
            fused = insert(gm, mul, native_ops.op("mm_quant_gated"), x, qweight, scales, zeros, bits, group_size, bias,
                           name, scalars, algorithm or None, int8_activations, **impl)
            mul.replace_all_uses_with(fused)
            remove_dead(gm, [mul])
            logs.log("freezing", "%s int%d %s: kiln::mm_quant_gated (%s of the gate times up)", node.name, bits,
                     tuple(x.meta["val"].shape), name)
            changed = True
            continue
        last, post_op = node, NO_POST_OP
        found = unary_after(node)
        if found is not None:
            last, post_op = found
        residual = _residual(last)
        end, added = (residual if residual is not None else (last, None))
        name, scalars, algorithm = post_op
        fused = insert(gm, end, native_ops.op("mm_quant"), x, qweight, scales, zeros, bits, group_size, bias, added,
                       name, scalars, algorithm or None, int8_activations, **impl)
        end.replace_all_uses_with(fused)
        remove_dead(gm, [end])
        logs.log("freezing", "%s int%d%s %s%s%s: kiln::mm_quant", node.name, bits,
                 " (int8 activations)" if int8_activations else " (bfloat16 fast math)" if impl else "", tuple(x.meta["val"].shape),
                 f" + {name}" if name != "none" else "", " + residual" if added is not None else "")
        changed = True
    return changed
