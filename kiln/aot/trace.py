"""Tracing to functional core-ATen graphs with fake tensors: the inference graph and the joint graph.

Functionalization (functional.py) runs under the tracer, so every in-place op becomes its
functional form and each mutated input's final value becomes an extra graph output.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import fx
from torch._dispatch.python import enable_python_dispatcher
from torch.fx.experimental.proxy_tensor import make_fx

from kiln.aot.decompositions import decomposition_table
from kiln.aot.functional import from_functional, functional_mode, to_functional
from kiln.aot.signature import Signature, view_from_base


def functionalized(fn: Callable[..., Sequence[Any]], sig: Signature, views_from_bases: bool = False) -> Callable[..., tuple]:
    """`fn` made functional: returns `(*outputs, *new values of the mutated inputs)`.

    views_from_bases: an output that views an input, with a layout the call wrapper can work out
    from the inputs' sizes, is returned as that input (no work): the wrapper makes the view of the
    input at each call (call_wrappers.AliasRestorer). Computed, it would be a copy: a growing KV
    cache's view of its buffer, the whole cache each token."""
    from_base = {k: a.base for k, a in sig.aliases.items() if views_from_bases and view_from_base(sig, k)}

    def run(*args: Any) -> tuple:
        with functional_mode():
            wrapped = [to_functional(a) for a in args]
            results = [args[from_base[k]] if k in from_base else from_functional(o) for k, o in enumerate(fn(*wrapped))]
            updates = [from_functional(wrapped[i]) for i in sig.mutated_inputs]
        return (*results, *updates)

    return run


def has_side_effects(node: fx.Node) -> bool:
    """Kept though nothing reads its result: a `with_effects` call (an error check that raises)."""
    return node.is_impure() or node.target is torch.ops.higher_order.with_effects


def _rename_placeholders(gm: fx.GraphModule, names: list[str]) -> fx.GraphModule:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, name in zip(placeholders, names):
        node.target = node.name = name
    gm.recompile()
    return gm


def _trace(fn: Callable, fake_args: Sequence[Any], fake_mode: Any) -> fx.GraphModule:
    with fake_mode, enable_python_dispatcher():
        gm = make_fx(fn, decomposition_table=decomposition_table())(*fake_args)
    # make_fx leaves a pytree output spec; kiln's contract is a flat tuple, which it already is.
    gm.graph.eliminate_dead_code(is_impure_node=has_side_effects)
    gm.recompile()
    return gm


def trace_inference(fn: Callable, fake_args: Sequence[Any], sig: Signature, fake_mode: Any) -> fx.GraphModule:
    """Functional ATen graph of `fn`: `(*args) -> (*outputs, *mutated input values)`."""
    with torch.no_grad():
        gm = _trace(functionalized(fn, sig, views_from_bases=True), fake_args, fake_mode)
    return _rename_placeholders(gm, [f"arg{i}" for i in range(len(fake_args))])


def differentiable_outputs(sig: Signature) -> list[int]:
    """Outputs that receive a tangent: tensors that require grad."""
    return [k for k, rg in enumerate(sig.output_requires_grad) if rg]


def trace_joint(fn: Callable, fake_args: Sequence[Any], sig: Signature, fake_mode: Any) -> fx.GraphModule:
    """Joint forward+backward graph, the partitioner's input.

    Placeholders: `primals_1..P` (the inputs) then `tangents_1..T` (one per differentiable output).
    Output: `(*outputs, *mutated input values, *gradients)`, one gradient (or None) per primal.
    """
    diff_outputs = differentiable_outputs(sig)
    needs_grad = [i for i, a in enumerate(fake_args) if isinstance(a, torch.Tensor) and a.requires_grad]
    num_primals = len(fake_args)

    def joint(*args: Any) -> tuple:
        primals, tangents = args[:num_primals], args[num_primals:]
        forward = list(fn(*primals))
        grads = torch.autograd.grad(
            [forward[k] for k in diff_outputs],
            [primals[i] for i in needs_grad],
            list(tangents),
            allow_unused=True,
        )
        per_primal: list[Any] = [None] * num_primals
        for i, g in zip(needs_grad, grads):
            per_primal[i] = g
        return (*forward, *per_primal)

    def functional_joint(*args: Any) -> tuple:
        # Mutated-input values are returned between outputs and gradients (see functionalized()).
        out = functionalized(joint, _with_inputs(sig, len(args)))(*args)
        n_fwd = sig.num_outputs
        return (*out[:n_fwd], *out[n_fwd + num_primals :], *out[n_fwd : n_fwd + num_primals])

    with fake_mode:
        tangents = [sig.output_metas[k].for_gradient().empty() for k in diff_outputs]
    with torch.enable_grad():
        gm = _trace(functional_joint, [*fake_args, *tangents], fake_mode)
    names = [f"primals_{i + 1}" for i in range(num_primals)] + [f"tangents_{j + 1}" for j in range(len(tangents))]
    return _rename_placeholders(gm, names)


def _with_inputs(sig: Signature, num_args: int) -> Signature:
    # The joint takes tangents after the primals; mutated indices refer to primals and stay valid.
    return Signature(num_inputs=num_args, mutated_inputs=sig.mutated_inputs)
