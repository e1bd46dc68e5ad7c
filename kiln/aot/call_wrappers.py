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

from kiln.aot.signature import Alias, Signature, TensorMeta, size_symbol_positions, traced_expr
from kiln.native import python_door


class AliasRestorer:
    """`(args, outputs) -> outputs`: outputs that were views of inputs (or of other outputs) in
    eager become views again. Made once per signature: a view's symbolic layout is compiled into
    a Python function of the inputs' sizes, evaluated at each call in ~1 µs (sympy's own
    evaluation took ~30 µs a view: a decode step hands back two views of its KV cache per layer).

    Where every alias views an input, those of one layout (a decode step's keys and values, each
    of its own room of one size) are made together: the layout evaluated once and the views in one
    C loop (kiln/native/python_door.py `views_function`). Run after a step's weights streamed
    through the caches, Qwen2-0.5B's 48 views took ~240 µs one by one in Python."""

    def __init__(self, sig: Signature) -> None:
        self.sig = sig
        self.where = size_symbol_positions(sig)
        self.layouts = {k: self._compile(alias) for k, alias in sig.aliases.items()}
        self.groups = self._by_layout()
        self._views: Callable[..., list[torch.Tensor] | None] | None = None  # (resolved at the first call)

    def _by_layout(self) -> list[tuple[Callable[[Sequence[Any]], tuple], tuple[int, ...], tuple[int, ...]]] | None:
        """(layout, outputs, their bases' input positions) per distinct layout, where every alias
        is a view of an input with a layout the inputs give; None otherwise (the one-by-one loop)."""
        aliases = self.sig.aliases
        if not aliases or any(a.of != "input" or a.same_tensor or a.retyped or self.layouts[k] is None
                              for k, a in aliases.items()):
            return None
        groups: dict[str, list[int]] = {}
        for k, a in aliases.items():
            groups.setdefault(repr((a.size, a.stride, a.storage_offset)), []).append(k)
        return [(self.layouts[ks[0]], tuple(ks), tuple(aliases[k].base for k in ks)) for ks in groups.values()]

    def _compile(self, alias: Alias) -> Callable[[Sequence[Any]], tuple] | None:
        """`args -> (size, stride, offset)`; None where no input gives a symbol of the layout."""
        values = [traced_expr(v) for v in (*alias.size, *alias.stride, alias.storage_offset)]
        if all(isinstance(v, int) or getattr(v, "is_Integer", False) for v in values):
            layout = (tuple(int(v) for v in alias.size), tuple(int(v) for v in alias.stride), int(alias.storage_offset))
            return lambda args: layout
        where = self.where
        free = set().union(*(sympy.sympify(v).free_symbols for v in values))
        if not free <= where.keys():
            return None
        n = len(alias.size)
        exprs = [sympy.sympify(v) for v in values]
        if not all(_sum_of_products(e) for e in exprs):  # (Min, floor, ...: evaluated by sympy)
            def evaluate(args: Sequence[Any]) -> tuple:
                known = {s: int(args[i] if d is None else args[i].shape[d]) for s, (i, d) in where.items() if s in free}
                ints = [int(e.xreplace(known)) for e in exprs]
                return tuple(ints[:n]), tuple(ints[n:2 * n]), ints[-1]

            return evaluate
        names = {symbol: f"args[{i}]" if d is None else f"args[{i}].shape[{d}]" for symbol, (i, d) in where.items()}
        text = [str(e.xreplace({s: sympy.Symbol(names[s]) for s in free})) for e in exprs]
        body = f"(({', '.join(text[:n])},), ({', '.join(text[n:2 * n])},), {text[-1]})"
        return eval(f"lambda args: {body}")  # noqa: S307 - sums and products of integers and input sizes

    def __call__(self, args: Sequence[Any], outputs: list[Any]) -> list[Any]:
        if self.groups is not None:
            return self._grouped(args, outputs)
        for k, alias in self.sig.aliases.items():
            base = args[alias.base] if alias.of == "input" else outputs[alias.base]
            if alias.of == "output" and _function_view(base) and not outputs[k]._is_view():
                # The output chosen as the base is a view the autograd.Function returned, of the other
                # (`return t.view(-1), t`): the other is the base, and the view is made of it here, so
                # the user may write to it in place as eager allows.
                outputs[alias.base] = _typed_view(outputs[k], base.dtype, base.size(), base.stride(), base.storage_offset())
                continue
            outputs[k] = self._as_view_of(base, k, alias, outputs[k], args)
        return outputs

    def _grouped(self, args: Sequence[Any], outputs: list[Any]) -> list[Any]:
        if self._views is None:
            self._views = python_door.views_function()
        for layout, ks, positions in self.groups:
            bases = [args[i] for i in positions]
            # A graph that hands the base itself back for the view (kiln's: the functional graph
            # returns the mutated input) leaves nothing to compare; any other output goes one by one.
            views = self._views(bases, *layout(args)) if all(outputs[k] is b for k, b in zip(ks, bases)) else None
            if views is None:
                for k, base in zip(ks, bases):
                    outputs[k] = self._as_view_of(base, k, self.sig.aliases[k], outputs[k], args)
            else:
                for k, view in zip(ks, views):
                    outputs[k] = view
        return outputs

    def _as_view_of(self, base: torch.Tensor, k: int, alias: Alias, graph_output: torch.Tensor,
                    args: Sequence[Any]) -> torch.Tensor:
        if alias.same_tensor:
            return base
        if graph_output is not base and graph_output.untyped_storage().data_ptr() == base.untyped_storage().data_ptr():
            return graph_output  # the graph already returned a view of the right storage (the base: trace.functionalized)
        if self.layouts[k] is None:
            raise RuntimeError(f"kiln: the layout of an output viewing an input, {alias.size} {alias.stride}, "
                               "depends on a size no input gives")
        size, stride, offset = self.layouts[k](args)
        return _typed_view(base, self.sig.output_metas[k].dtype, size, stride, offset)


def _typed_view(base: torch.Tensor, dtype: torch.dtype, size: Any, stride: Any, offset: int) -> torch.Tensor:
    """The view of `base`'s storage with this layout, counted in elements of `dtype`: an output that
    reinterprets its base (`buffer[a:b].view(torch.float32)` of a byte buffer, `view_as_real`)
    keeps its own dtype, where `base.as_strided` alone would hand back the base's (bytes)."""
    if base.dtype == dtype:
        return base.as_strided(size, stride, offset)
    # The whole storage as one row of the base's elements (a view, so writes reach the base and
    # autograd sees a view), as many as make whole elements of `dtype`, then reinterpreted.
    itemsize = dtype.itemsize
    count = base.untyped_storage().nbytes() // itemsize * itemsize // base.dtype.itemsize
    return base.as_strided((count,), (1,), 0).view(dtype).as_strided(size, stride, offset)


def _sum_of_products(expr: Any) -> bool:
    """Whether `expr` is made of integers and symbols by + and * alone (Python evaluates its text)."""
    return all(isinstance(e, (sympy.Add, sympy.Mul, sympy.Symbol, sympy.Integer)) for e in sympy.preorder_traversal(expr))


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
    restore_aliases = AliasRestorer(sig)

    def run(*args: Any) -> list[Any]:
        out = list(compiled(*args))
        copy_back_mutations(sig, args, out[n:])
        return restore_aliases(args, out[:n])

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
    restore_aliases = AliasRestorer(sig)

    def run(*args: Any) -> list[Any]:
        if detached:  # (autograd would otherwise call, with no gradient, the backward of the graph that made them)
            args = list(args)
            for i in detached:
                if isinstance(args[i], torch.Tensor) and args[i].requires_grad:
                    args[i] = args[i].detach()
        out = list(CompiledFunction.apply(*args))
        copy_back_mutations(sig, args, out[sig.num_outputs :])
        return restore_aliases(args, out[: sig.num_outputs])

    return run
