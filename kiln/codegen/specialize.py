"""Graphs with symbolic sizes, compiled once per set of concrete sizes they are called with.

kiln's kernels are generated for static sizes. When Dynamo hands over a graph with symbolic sizes
(after a recompile, or `dynamic=True`), the graph is re-traced at each new set of input sizes into
a static ATen graph and compiled for it; later calls with those sizes reuse it. Each
specialization is logged (`KILN_LOGS=recompiles`).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

from kiln import logs


def has_symbolic_sizes(gm: fx.GraphModule, inputs_only: bool = False) -> bool:
    """Whether any size (or stride) in the graph is symbolic; with `inputs_only`, any of its inputs'.

    Inputs' symbolic sizes go away when the graph is traced again at concrete inputs. Sizes that
    an op computes from tensor values (nonzero, unique, boolean masks) stay symbolic however the
    inputs are given."""
    for node in gm.graph.nodes:
        if inputs_only and node.op != "placeholder":
            continue
        val = node.meta.get("val")
        values = val if isinstance(val, (tuple, list)) else [val]
        for v in values:
            if isinstance(v, torch.SymInt):
                return True
            if isinstance(v, torch.Tensor) and any(not isinstance(s, int) for s in (*v.shape, *v.stride())):
                return True
    return False


def _signature(args: Sequence[Any]) -> tuple:
    return tuple((tuple(a.shape), tuple(a.stride()), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)


def _scalar_inputs(gm: fx.GraphModule) -> list[int]:
    """Positions of the inputs whose value the graph reads as a Python number (`x.item()`, e.g. a
    tensor start of narrow). A graph is specialized to those values too, so they are part of the
    key. A number read from a computed tensor cannot be known before the graph runs: declined."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    positions = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.aten._local_scalar_dense.default:
            source = node.args[0]
            if source not in placeholders:
                raise NotImplementedError("a size or index computed from tensor data inside the graph")
            positions.append(placeholders.index(source))
    return sorted(set(positions))


def reads_input_values(gm: fx.GraphModule) -> bool:
    """Whether the graph reads a Python number out of one of its inputs (and only inputs)."""
    try:
        return bool(_scalar_inputs(gm))
    except NotImplementedError:
        return False


def _with_values(gm: fx.GraphModule, values: dict[int, Any]) -> fx.GraphModule:
    """A copy of `gm` where reading input k's value (`x.item()`) is the constant `values[k]`."""
    if not values:
        return gm
    gm = fx.GraphModule(gm, copy.deepcopy(gm.graph))
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten._local_scalar_dense.default:
            node.replace_all_uses_with(values[placeholders.index(node.args[0])])  # type: ignore[arg-type]
            gm.graph.erase_node(node)
    gm.recompile()
    return gm


def _is_symbolic_value(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return any(not isinstance(s, int) for s in value.shape)
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


class Specialized:
    """Calls `compile_static` on `gm` traced at each new set of argument sizes."""

    def __init__(self, gm: fx.GraphModule, compile_static: Callable[[fx.GraphModule, list], Callable]) -> None:
        self.gm, self.compile_static = gm, compile_static
        self.scalar_inputs = _scalar_inputs(gm)
        self.compiled: dict[tuple, Callable] = {}
        # The inputs whose sizes are symbolic: the ones a specialization's log line names.
        self.symbolic_inputs = [i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")
                                if _is_symbolic_value(n.meta.get("val"))]

    def __call__(self, *args: Any) -> Any:
        values = tuple(args[i].item() for i in self.scalar_inputs)
        key = (_signature(args), values)
        compiled = self.compiled.get(key)
        if compiled is None:
            shown = self.symbolic_inputs or range(len(args))
            sizes = [tuple(args[i].shape) if isinstance(args[i], torch.Tensor) else args[i] for i in shown]
            logs.log("recompiles", "kiln backend: graph with symbolic sizes specialized to %s%s", sizes,
                     f" and input values {values}" if values else "")
            with torch.no_grad():
                static = make_fx(_with_values(self.gm, dict(zip(self.scalar_inputs, values))), tracing_mode="fake")(*args)
            compiled = self.compiled[key] = self.compile_static(static, list(args))
        return compiled(*args)
