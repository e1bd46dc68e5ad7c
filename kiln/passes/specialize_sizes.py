"""Graphs with symbolic sizes: compiled once with kernels over symbolic sizes where kiln can, and
otherwise, the pass half of size specialization, traced again as a static graph per size.

When a graph with symbolic input sizes arrives (after a recompile, or `dynamic=True`), the driver
first compiles it as it is: kernels take the sizes as arguments (kiln/ir/sizes.py) and the wrapper
reads them off the inputs. `symbolic_declined` says why a graph cannot be: it reads a Python
number out of an input (`x.item()` feeding `narrow`), a size is not one of an input's dims, or
the setting is off; a stage that finds a symbolic size it cannot handle says so by raising
NotImplementedError. The graph is then compiled per size: the runtime
(kiln/runtime/specialized.py) calls `specialize` at each new set of input sizes (and read values)
it meets and has the static result compiled through the whole pipeline.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

from kiln import config
from kiln.ir.graph_meta import MODULE_STATE, WRITTEN_BACK_FROM
from kiln.ir.sizes import is_size_symbol, size_expr

# What the AOT layer wrote on a graph's inputs for the backend (kiln/ir/graph_meta.py): a traced
# copy keeps it, or the copy would lose freezing (a quantized model's products back to eager's
# dequantizing reference) and the in-place write-back of a KV cache.
_INPUT_FACTS = (MODULE_STATE, WRITTEN_BACK_FROM)



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


def reads_computed_values(gm: fx.GraphModule) -> bool:
    """Whether the graph reads a Python number out of a tensor it computes (`x.sum().item()` kept
    in the graph by capture.scalar_outputs or fullgraph=True): known only when the graph runs."""
    try:
        scalar_inputs(gm)
    except NotImplementedError:
        return True
    return False


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


def bound_symbols(gm: fx.GraphModule) -> set[Any]:
    """The size symbols an input gives as they are: one of its dims, or an integer input."""
    bound = set()
    for node in gm.graph.nodes:
        val = node.meta.get("val") if node.op == "placeholder" else None
        for size in val.shape if isinstance(val, torch.Tensor) else [val]:
            if isinstance(size, torch.SymInt) and is_size_symbol(expr := size_expr(size)):
                bound.add(expr)
    return bound


def symbolic_declined(gm: fx.GraphModule, target: Any) -> str | None:
    """Why `gm` cannot be compiled once for all its sizes, or None when it can be tried."""
    if not config.backend.symbolic_kernels:
        return "backend.symbolic_kernels (KILN_SYMBOLIC_KERNELS) is off"
    if not target.codegen.symbolic_sizes:
        return f"the {target.codegen.name} code generator prints kernels for one size only"
    if any(n.target is torch.ops.aten._local_scalar_dense.default for n in gm.graph.nodes):
        return "the graph reads a number out of a tensor"
    bound = bound_symbols(gm)
    for node in gm.graph.nodes:
        if node.op != "placeholder" or _sizes_read_only(node):
            continue
        val = node.meta.get("val")
        values = [*val.shape, *val.stride(), val.storage_offset()] if isinstance(val, torch.Tensor) else [val]
        for v in values:
            try:
                expr = size_expr(v)
            except NotImplementedError as error:
                return str(error)
            free = getattr(expr, "free_symbols", set())
            if any(s not in bound for s in free):
                return f"input {node.name}'s size {expr} is not an input's dim"
    return None


def _sizes_read_only(placeholder: fx.Node) -> bool:
    """Whether the graph reads input `placeholder`'s sizes only (each a dim, so bound), never its
    values or strides: then its strides need no binding. A growing KV cache's view (kiln/capture/
    hf_generation.py) is read so, for its length, beside the buffer it views: its strides are the
    buffer's, symbols no dim gives."""
    return bool(placeholder.users) and all(user.target is torch.ops.aten.sym_size.int for user in placeholder.users)


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
        traced = make_fx(_with_values(gm, values), tracing_mode="fake")(*args)
    inputs = [n for n in traced.graph.nodes if n.op == "placeholder"]
    for source, node in zip([n for n in gm.graph.nodes if n.op == "placeholder"], inputs, strict=True):
        node.meta.update({key: source.meta[key] for key in _INPUT_FACTS if key in source.meta})
    return traced
