"""Size specialization, the pass half: a graph with symbolic input sizes traced again as a static
graph at concrete sizes.

kiln's kernels are generated for static sizes. When a graph with symbolic sizes arrives (after a
recompile, or `dynamic=True`), the driver does not compile it now: the runtime
(kiln/runtime/specialized.py) calls `specialize` at each new set of input sizes it meets and has
the result compiled then, through the whole pipeline. A graph that reads a Python number out of
an input (`x.item()` feeding `narrow`) is specialized to that value too.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx



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


def scalar_inputs(gm: fx.GraphModule) -> list[int]:
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
        return bool(scalar_inputs(gm))
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


def needs_specialization(gm: fx.GraphModule) -> bool:
    """Whether `gm` is compiled per concrete input sizes (and input values) at call time."""
    return has_symbolic_sizes(gm, inputs_only=True) or reads_input_values(gm)


def symbolic_inputs(gm: fx.GraphModule) -> list[int]:
    """Positions of the inputs whose sizes are symbolic: the ones a specialization's log names."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return [i for i, n in enumerate(placeholders) if _is_symbolic_value(n.meta.get("val"))]


def _is_symbolic_value(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return any(not isinstance(s, int) for s in value.shape)
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


def specialize(gm: fx.GraphModule, args: Sequence[Any], values: dict[int, Any]) -> fx.GraphModule:
    """`gm` traced again as a static ATen graph at `args`' sizes, input k's value read as `values[k]`."""
    with torch.no_grad():
        return make_fx(_with_values(gm, values), tracing_mode="fake")(*args)
