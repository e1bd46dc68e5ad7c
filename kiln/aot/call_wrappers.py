"""The calls around compiled functional graphs: they restore eager's semantics at each call.

A functional graph returns new values instead of mutating, and fresh tensors instead of views. The
wrappers copy mutated inputs' new values back, hand aliasing outputs back as views of their bases,
and for training run the forward and backward graphs inside one `torch.autograd.Function`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import sympy
import torch
from torch.autograd.function import once_differentiable

from kiln.aot.signature import Alias, Signature, TensorMeta


def _symbol_values(sig: Signature, args: Sequence[Any]) -> dict[Any, Any]:
    """Each symbol an input's size (or an integer input) is, with its value in this call."""
    values: dict[Any, Any] = {}
    for traced, arg in zip(sig.input_sizes, args):
        pairs = zip(traced, arg.shape) if isinstance(traced, tuple) and isinstance(arg, torch.Tensor) else [(traced, arg)]
        for size, value in pairs:
            expr = _expr(size)
            if isinstance(expr, sympy.Symbol):
                values.setdefault(expr, sympy.Integer(int(value)))
    return values


def _expr(value: Any) -> Any:
    """A traced size as sympy: a SymInt's expression (in the tracing process) or the expression
    itself (a signature loaded from the AOT graph cache); an integer stays one."""
    return sympy.sympify(value.node.expr) if isinstance(value, torch.SymInt) else value


def _evaluate(value: Any, symbols: dict[Any, Any]) -> int | None:
    expr = _expr(value)
    if not isinstance(expr, sympy.Basic):
        return int(expr)
    expr = expr.xreplace(symbols)
    return int(expr) if expr.is_Integer else None


def _layout(alias: Alias, symbols: dict[Any, Any]) -> tuple[Any, Any, Any]:
    # Sizes known at trace time are exact; symbolic ones are evaluated at this call's input sizes.
    if all(isinstance(v, int) for v in (*alias.size, *alias.stride, alias.storage_offset)):
        return alias.size, alias.stride, alias.storage_offset
    size = [_evaluate(v, symbols) for v in alias.size]
    stride = [_evaluate(v, symbols) for v in alias.stride]
    offset = _evaluate(alias.storage_offset, symbols)
    if None in (*size, *stride, offset):
        raise RuntimeError(f"kiln: the layout of an output viewing an input, {alias.size} {alias.stride}, "
                           "depends on a size no input gives")
    return size, stride, offset


def _as_view_of(base: torch.Tensor, alias: Alias, graph_output: torch.Tensor, symbols: dict[Any, Any]) -> torch.Tensor:
    if alias.same_tensor:
        return base
    if graph_output.untyped_storage().data_ptr() == base.untyped_storage().data_ptr():
        return graph_output  # the graph already returned a view of the right storage
    size, stride, offset = _layout(alias, symbols)
    return base.as_strided(size, stride, offset)


def restore_aliases(sig: Signature, args: Sequence[Any], outputs: list[Any]) -> list[Any]:
    """Outputs that were views of inputs (or of other outputs) in eager become views again."""
    symbols = _symbol_values(sig, args) if sig.aliases else {}
    for k, alias in sig.aliases.items():
        base = args[alias.base] if alias.of == "input" else outputs[alias.base]
        if alias.of == "output" and _function_view(base) and not outputs[k]._is_view():
            # The output chosen as the base is a view the autograd.Function returned, of the other
            # (`return t.view(-1), t`): the other is the base, and the view is made of it here, so
            # the user may write to it in place as eager allows.
            outputs[alias.base] = outputs[k].as_strided(base.size(), base.stride(), base.storage_offset())
            continue
        outputs[k] = _as_view_of(base, alias, outputs[k], symbols)
    return outputs


def _function_view(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad and t._is_view() and t.grad_fn is not None


def copy_back_mutations(sig: Signature, args: Sequence[Any], new_values: Sequence[torch.Tensor]) -> None:
    # A graph that wrote the input in place returns that tensor: copying it onto itself does nothing
    # but cost a dispatch (a decode step's 24-44 KV-cache tensors, every token), and where every
    # input was written so, no grad mode is entered either.
    pending = [(args[i], value) for i, value in zip(sig.mutated_inputs, new_values) if value is not args[i]]
    if pending:
        with torch.no_grad():
            for target, value in pending:
                target.copy_(value)


def without_autocast(compiled: Callable) -> Callable:
    """`compiled` run with autocast off: a graph traced under autocast holds its casts, and an
    extern op of it (an `aten.mm` the trace kept in float32) must not be cast again by the
    caller's autocast at run time (found on an H200: a float32 result arrived as bfloat16)."""

    def run(*args: Any) -> Any:
        if not torch._C._is_any_autocast_enabled():
            return compiled(*args)
        with torch._C._DisableAutocast():
            return compiled(*args)

    return run


def inference_runner(compiled: Callable, sig: Signature) -> Callable[..., Sequence[Any]]:
    """`(*args) -> outputs` for a graph `(*args) -> (*outputs, *mutated input values)`."""
    n = sig.num_outputs
    compiled = without_autocast(compiled)
    if not sig.mutated_inputs and not sig.aliases:  # the common case: the graph's own outputs, as they come
        return compiled

    def run(*args: Any) -> list[Any]:
        out = list(compiled(*args))
        copy_back_mutations(sig, args, out[n:])
        return restore_aliases(sig, args, out[:n])

    return run


def _as_traced(grad: torch.Tensor, meta: TensorMeta | None) -> torch.Tensor:
    # The backward graph was traced for tangents with the output's strides; give it those.
    if meta is None or grad.numel() <= 1:
        return grad
    if not all(isinstance(s, int) for s in meta.stride):
        return grad.contiguous()  # symbolic strides: tangents were traced contiguous-like
    if tuple(grad.stride()) == meta.stride:
        return grad
    return torch.empty_strided(grad.size(), meta.stride, dtype=grad.dtype, device=grad.device).copy_(grad)


def training_runner(
    forward: Callable,
    backward: Callable,
    sig: Signature,
    differentiable: list[int],
    num_saved_tensors: int,
) -> Callable[..., list[Any]]:
    """`(*args) -> outputs` with autograd: forward graph now, backward graph when grads are asked for.

    forward: `(*args) -> (*outputs, *mutated input values, *saved tensors, *saved symbols)`;
    backward: `(*saved tensors, *saved symbols, *tangents) -> (one gradient or None per arg)`.
    """
    n_out = sig.num_outputs + len(sig.mutated_inputs)
    forward, backward = without_autocast(forward), without_autocast(backward)
    non_differentiable = [k for k in range(n_out) if k not in differentiable]
    gradient_metas = {k: sig.output_metas[k].for_gradient() for k in differentiable}

    class CompiledFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *args: Any) -> tuple:
            out = forward(*args)
            saved = out[n_out:]
            ctx.save_for_backward(*saved[:num_saved_tensors])
            ctx.saved_symbols = saved[num_saved_tensors:]
            ctx.mark_non_differentiable(*[out[k] for k in non_differentiable if isinstance(out[k], torch.Tensor)])
            return tuple(out[:n_out])

        @staticmethod
        @once_differentiable
        def backward(ctx: Any, *grads: Any) -> tuple:
            tangents = [_as_traced(grads[k], gradient_metas[k]) for k in differentiable]
            return tuple(backward(*ctx.saved_tensors, *ctx.saved_symbols, *tangents))

    detached = list(getattr(sig, "inputs_without_gradient", ()))

    def run(*args: Any) -> list[Any]:
        if detached:  # (autograd would otherwise call, with no gradient, the backward of the graph that made them)
            args = list(args)
            for i in detached:
                if isinstance(args[i], torch.Tensor) and args[i].requires_grad:
                    args[i] = args[i].detach()
        out = list(CompiledFunction.apply(*args))
        copy_back_mutations(sig, args, out[sig.num_outputs :])
        return restore_aliases(sig, args, out[: sig.num_outputs])

    return run
