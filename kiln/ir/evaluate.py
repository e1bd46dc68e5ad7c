"""A reference executor: a node's body run once over whole tensors with PyTorch's kernels.

Each index symbol becomes an `arange` shaped to broadcast along its own dimension, so one run of
the body computes every element. Slow and memory-hungry, but independent of any code generator:
lowerings and fusion are checked against it without compiling anything.
"""

from __future__ import annotations

from typing import Any, Callable

import sympy
import torch

from kiln.ir.indexing import REMAINDERS, FloorDiv, Mod
from kiln.ir.nodes import Layout, Node, Reduction, Scatter
from kiln.ir.philox import philox_uniform
from kiln.ir.ops import BINARY_OPS, SPECIAL_FUNCTION_BINARY_OPS, SPECIAL_FUNCTION_UNARY_OPS, UNARY_OPS, use_handler

_UNARY: dict[str, Callable] = {name: getattr(torch, name) for name in UNARY_OPS}
_BINARY: dict[str, Callable] = {name: getattr(torch, name) for name in BINARY_OPS if hasattr(torch, name)}
_BINARY.update(
    add=torch.add, sub=torch.sub, mul=torch.mul, truediv=torch.true_divide,
    floordiv=lambda a, b: torch.div(a, b, rounding_mode="floor"),
)  # fmt: skip


def _special(name: str) -> Callable:
    return getattr(torch.special, name, None) or getattr(torch, name)


# The special functions: torch.special's (or torch's) function of the same name.
_UNARY.update({name: _special(name) for name in SPECIAL_FUNCTION_UNARY_OPS if not name.startswith("frexp")})
_UNARY.update(frexp_mantissa=lambda x: torch.frexp(x).mantissa, frexp_exponent=lambda x: torch.frexp(x).exponent)
_BINARY.update({name: _special(name) for name in SPECIAL_FUNCTION_BINARY_OPS if name != "polygamma"})
_BINARY.update(polygamma=lambda n, x: torch.special.polygamma(int(n), x))  # n is a constant
_BINARY.update(rand=philox_uniform)
_REDUCE: dict[str, Callable] = {
    "sum": lambda v, dims: v.sum(dims),
    "prod": lambda v, dims: v.flatten(-len(dims)).prod(-1),
    "max": lambda v, dims: v.amax(dims),
    "min": lambda v, dims: v.amin(dims),
    "any": lambda v, dims: v.flatten(-len(dims)).any(-1),
    "all": lambda v, dims: v.flatten(-len(dims)).all(-1),
    "argmax": lambda v, dims: v.flatten(-len(dims)).argmax(-1),
    "argmin": lambda v, dims: v.flatten(-len(dims)).argmin(-1),
    "welford": lambda v, dims: (v - v.mean(dims, keepdim=True)).square().sum(dims) if v.numel() else v.sum(dims),
}


def flat_storage(t: torch.Tensor) -> torch.Tensor:
    """All of `t`'s storage as a 1-D tensor: what a layout's flat index addresses."""
    return t.as_strided((t.untyped_storage().nbytes() // t.element_size(),), (1,), 0)


def eval_index(expr: sympy.Expr, env: dict[sympy.Symbol, torch.Tensor]) -> torch.Tensor | int:
    """An integer index expression evaluated on tensors of index values."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return env[expr]
    args = [eval_index(a, env) for a in expr.args]
    if expr.is_Add:
        return sum(args[1:], args[0])
    if expr.is_Mul:
        out = args[0]
        for a in args[1:]:
            out = out * a
        return out
    if isinstance(expr, REMAINDERS):
        return torch.remainder(args[0], args[1])
    if isinstance(expr, FloorDiv):
        return torch.div(args[0], args[1], rounding_mode="floor")
    if isinstance(expr, (sympy.Min, sympy.Max)):  # clamps that keep every load in bounds
        pick = torch.minimum if isinstance(expr, sympy.Min) else torch.maximum
        out = torch.as_tensor(args[0])
        for a in args[1:]:
            out = pick(out, torch.as_tensor(a))
        return out
    raise NotImplementedError(f"index expression {expr} ({type(expr).__name__})")


class TorchEvaluator:
    """The ops protocol on whole tensors."""

    def __init__(self, storages: dict[str, torch.Tensor], env: dict[sympy.Symbol, torch.Tensor], reduced_dims: tuple[int, ...]) -> None:
        self.storages = {name: flat_storage(t) for name, t in storages.items()}
        self.env, self.reduced_dims = env, reduced_dims

    def __getattr__(self, name: str) -> Any:
        if name in _UNARY:
            return _UNARY[name]
        if name in _BINARY:
            return _BINARY[name]
        raise AttributeError(name)

    def load(self, name: str, index: sympy.Expr) -> torch.Tensor:
        return self.storages[name][torch.as_tensor(eval_index(index, self.env))]

    def store(self, name: str, index: sympy.Expr, value: torch.Tensor) -> None:
        raise NotImplementedError("the evaluator returns values; it does not write buffers")

    def constant(self, value: Any, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(value, dtype=dtype)

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(eval_index(sympy.sympify(expr), self.env)).to(dtype)

    def to_dtype(self, value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return value.to(dtype)

    def indirect_indexing(self, value: torch.Tensor, size: Any) -> sympy.Symbol:
        symbol = sympy.Symbol(f"ind{len(self.env)}", integer=True)
        value = torch.as_tensor(value).long()
        self.env[symbol] = torch.where(value < 0, value + int(size), value)
        return symbol

    def where(self, condition: torch.Tensor, if_true: torch.Tensor, if_false: torch.Tensor) -> torch.Tensor:
        return torch.where(condition, if_true, if_false)

    def reduction(self, reduction_type: str, dtype: torch.dtype, value: torch.Tensor) -> torch.Tensor:
        return _REDUCE[reduction_type](value, self.reduced_dims).to(dtype)


def _grid(symbols, sizes) -> dict[sympy.Symbol, torch.Tensor]:
    """Each symbol as an arange along its own dim of the grid `sizes`."""
    rank = len(symbols)
    return {sym: torch.arange(n).view([n if d == k else 1 for k in range(rank)])
            for d, (sym, n) in enumerate(zip(symbols, sizes))}


# Eager's own scatter_reduce defines the combines (NaN propagation of max and min included).
_SCATTER_REDUCE = {"prod": "prod", "max": "amax", "min": "amin"}


def _evaluate_scatter(node: Scatter, storages: dict[str, torch.Tensor]) -> torch.Tensor:
    sizes, sources = [int(r) for r in node.ranges], [int(r) for r in node.source_ranges]
    with use_handler(TorchEvaluator(storages, _grid(node.index_vars(), sizes), ())):
        # A copy: a load may return a view of an input, which the writes below must not change.
        out = torch.as_tensor(node.init()).to(node.dtype).expand(sizes).clone(memory_format=torch.contiguous_format)
    with use_handler(TorchEvaluator(storages, _grid(node.source_vars(), sources), ())) as handler:
        target, value = node.scattered()
        flat = torch.as_tensor(eval_index(Layout.contiguous(sizes, node.dtype).flat_index(target), handler.env))
    flat = flat.expand(sources).reshape(-1)
    value = torch.as_tensor(value).to(node.dtype).expand(sources).reshape(-1)
    flat_out = out.view(-1)
    if node.mode in _SCATTER_REDUCE:
        flat_out.scatter_reduce_(0, flat, value, _SCATTER_REDUCE[node.mode], include_self=True)
    else:
        flat_out.index_put_((flat,), value, accumulate=node.mode == "sum")
    return out


def evaluate(node: Node, storages: dict[str, torch.Tensor]) -> torch.Tensor:
    """The node's result as a contiguous tensor; `storages` maps buffer names to tensors, whose
    flat storage is what `ops.load` indexes through the buffer's layout."""
    if isinstance(node, Scatter):
        return _evaluate_scatter(node, storages)
    sizes = [int(r) for r in node.ranges]
    rsizes = [int(r) for r in node.reduction_ranges] if isinstance(node, Reduction) else []
    symbols = list(node.index_vars()) + (list(node.reduction_vars()) if isinstance(node, Reduction) else [])
    rank = len(symbols)
    env = _grid(symbols, sizes + rsizes)
    full = sizes + rsizes
    reduced = tuple(range(len(sizes), rank))
    with use_handler(TorchEvaluator(storages, env, reduced)):
        if isinstance(node, Reduction):
            # Broadcast the element body to the whole iteration space before reducing it.
            value = node.inner_fn(node.index_vars(), node.reduction_vars())
            value = torch.as_tensor(value).expand(full)
            from kiln.ir.ops import ops

            result = ops.reduction(node.reduction_type, node.dtype, value)
        else:
            result = torch.as_tensor(node.body())
    return result.to(node.dtype).expand(sizes).contiguous()
