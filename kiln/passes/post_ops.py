"""The unary ops oneDNN applies inside a GEMM or convolution ("post-ops"), found after a node.

Shared by conv_prepack and gemm_prepack: each unary ATen op, the oneDNN post-op that means the
same (kiln::post_op runs it in ATen: kiln/native/src/kiln_runtime.cpp), silu in the two forms
graphs hold (`aten.silu`, or `y * sigmoid(y)` as the core-ATen table writes it), and GELU's tanh form written
out in eager ops (GPT-2's activation), which becomes the GEMM's `gelu` post-op, "tanh" algorithm.
"""

from __future__ import annotations

import math

import torch
from torch import fx

from kiln.passes.pattern import Op, Var, arguments, match

aten = torch.ops.aten

PostOp = tuple[str, list, str]  # (oneDNN post-op name, its scalars, its algorithm)
NO_POST_OP: PostOp = ("none", [], "")

# ATen unary op -> its post-op, from the node's arguments.
UNARY = {
    aten.relu.default: lambda args: ("relu", [], ""),
    aten.sigmoid.default: lambda args: ("sigmoid", [], ""),
    aten.tanh.default: lambda args: ("tanh", [], ""),
    aten.silu.default: lambda args: ("swish", [], ""),
    aten.hardswish.default: lambda args: ("hardswish", [], ""),
    aten.gelu.default: lambda args: ("gelu", [], args[1]),
    aten.leaky_relu.default: lambda args: ("leaky_relu", [args[1]], ""),
    aten.hardtanh.default: lambda args: ("hardtanh", [args[1], args[2]], ""),
}

_SILU = Op(aten.mul.Tensor, Var("y"), Op(aten.sigmoid.default, Var("y")), commutative=True)


def _near(value: float):
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v - value) <= 1e-6 * abs(value)


# GELU's tanh form written out, as GPT-2's `NewGELUActivation` (transformers' "gelu_new") does:
# 0.5 y (1 + tanh(sqrt(2/pi) (y + 0.044715 y^3))).
_MUL = aten.mul.Tensor
_GELU_TANH = Op(_MUL, Op(_MUL, Var("y"), Var("half", _near(0.5)), commutative=True),
                Op(aten.add.Tensor,
                   Op(aten.tanh.default,
                      Op(_MUL, Op(aten.add.Tensor, Var("y"),
                                  Op(_MUL, Op(aten.pow.Tensor_Scalar, Var("y"), Var("three", _near(3.0))),
                                     Var("c", _near(0.044715)), commutative=True), commutative=True),
                         Var("k", _near(math.sqrt(2 / math.pi))), commutative=True)),
                   Var("one", _near(1.0)), commutative=True),
                commutative=True)


def only_user(node: fx.Node) -> fx.Node | None:
    if len(node.users) != 1:
        return None
    user = next(iter(node.users))
    return user if user.op == "call_function" else None




def _written_out(value: fx.Node, pattern: Op, reads: int, depth: int) -> fx.Node | None:
    """The last node of `pattern` (an op written out in eager ops, reading its input `reads` times,
    its last node `depth` steps from `value`) over `value`, if that is all `value` feeds."""
    if len(value.users) != reads:
        return None
    frontier = set(value.users)
    for _ in range(depth - 1):
        frontier = {root for node in frontier for root in node.users}
    for root in frontier:
        found = match(pattern, root) if root.op == "call_function" else None
        if found is not None and found["y"] is value:
            return root
    return None


def unary_after(value: fx.Node) -> tuple[fx.Node, PostOp] | None:
    """The unary op that is all `value` feeds, as (its node, its post-op)."""
    user = only_user(value)
    if user is not None and user.target in UNARY:
        return user, UNARY[user.target](arguments(user))
    silu = _written_out(value, _SILU, reads=2, depth=1)  # y * sigmoid(y)
    if silu is not None:
        return silu, ("swish", [], "")
    gelu = _written_out(value, _GELU_TANH, reads=3, depth=2)  # 0.5 y (...), the last mul two steps on
    return (gelu, ("gelu", [], "tanh")) if gelu is not None else None
