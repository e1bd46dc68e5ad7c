"""Split a joint forward+backward graph into a forward and a backward graph (min-cut remat).

The joint graph takes ``(primals_1.., tangents_1..)`` and returns ``(*forward outputs, *grads)``.
The backward can only see tangents and what the forward hands over, so every forward value it
uses is either *saved* (kept alive between the two) or *recomputed* in the backward from saved
values. Choosing which is a minimum cut: each forward node becomes an edge whose capacity is the
bytes it would cost to save, primals and ops that must not be recomputed hang off the source,
forward values the backward reads hang off the sink, and the cheapest set of edges separating
them is the set of values to save. What may be recomputed is decided in
:mod:`kiln.aot.partition_cost`::

    split = partition(joint, num_forward_outputs=1)
    outs = split.forward(*primals)                       # (*outputs, *saved tensors, *symints)
    saved = outs[1:]
    grads = split.backward(*saved, *tangents)            # one entry (or None) per joint grad
    print(split.summary())
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

import networkx as nx
import torch
import torch.fx as fx

from kiln.aot.partition_cost import (
    PartitionPolicy,
    can_recompute,
    is_scalar_value,
    is_tensor_value,
    recompute_kind,
    value_bytes,
)

__all__ = ["Partition", "PartitionPolicy", "partition"]

# Capacities are integers: bytes scaled by _BYTE, plus tie-breaks worth far less than a byte.
# Among cuts saving the same bytes, prefer (a) not recomputing an op the forward runs anyway,
# via a _RECOMPUTE_PENALTY edge from the source to each such op, which the cut crosses when the
# op lands in the backward; then (b) saving a value early in a chain (its depth is added), which
# leaves the forward lean and lets the backward fuse the chain; and (c) saving a base rather
# than a view of it. Saving a SymInt costs the least of anything.
_BYTE = 1 << 20
_RECOMPUTE_PENALTY = 1 << 10
_MAX_DEPTH_TIE = 1 << 9
_SCALAR_COST = 1
_SOURCE, _SINK = "source", "sink"


@dataclasses.dataclass
class Partition:
    """A joint graph split in two; see :func:`partition`.

    ``forward(*primals)`` returns ``(*forward outputs, *saved tensors, *saved symints)``;
    ``backward(*saved tensors, *saved symints, *tangents)`` returns the joint's gradients, in
    order, ``None`` entries included.
    """

    forward: fx.GraphModule
    backward: fx.GraphModule
    num_forward_outputs: int
    saved: list[str]  # saved tensors, then saved symints, in the order the graphs pass them
    recomputed: list[str]  # forward nodes the backward computes again
    saved_bytes: int  # of the saved tensors, symbolic sizes at their hints
    num_saved_tensors: int
    num_saved_symints: int

    @property
    def activation_bytes(self) -> int:
        """Bytes of saved tensors that are not graph inputs (those stay alive anyway)."""
        saved = [n for n in self.backward.graph.nodes if n.op == "placeholder"][: self.num_saved_tensors]
        return sum(value_bytes(n.meta["val"]) for n in saved if not n.name.startswith("primals"))

    def summary(self) -> str:
        """What is saved (name, shape, dtype, bytes), what is recomputed, and the totals.

        Example::

            >>> print(partition(joint, 1).summary())     # doctest: +SKIP
            saved 1 tensor(s) (128 B) and 0 symint(s); recomputed 2 op(s)
            saved tensors:
              primals_1  float32[4, 8]  128 B
            saved symints:
              (none)
            recomputed in backward:
              sin  aten.sin.default
              neg  aten.neg.default
            total saved: 128 bytes
        """
        saved_nodes = [n for n in self.backward.graph.nodes if n.op == "placeholder"][: len(self.saved)]
        by_name = {n.name: n for n in self.backward.graph.nodes}
        lines = [
            f"saved {self.num_saved_tensors} tensor(s) ({_human(self.saved_bytes)}) and "
            f"{self.num_saved_symints} symint(s); recomputed {len(self.recomputed)} op(s)",
            "saved tensors:",
        ]
        tensors, symints = saved_nodes[: self.num_saved_tensors], saved_nodes[self.num_saved_tensors :]
        for node in tensors:
            val = node.meta["val"]
            lines.append(f"  {node.name}  {_describe(val)}  {_human(value_bytes(val))}")
        lines += ["  (none)"] * (not tensors) + ["saved symints:"]
        lines += [f"  {n.name}  {n.meta.get('val')}" for n in symints]
        lines += ["  (none)"] * (not symints) + ["recomputed in backward:"]
        lines += [f"  {name}  {_target_name(by_name[name])}" for name in self.recomputed]
        lines += ["  (none)"] * (not self.recomputed)
        lines.append(f"total saved: {self.saved_bytes} bytes")
        return "\n".join(lines)


def partition(
    joint: fx.GraphModule, num_forward_outputs: int, *, policy: PartitionPolicy | None = None
) -> Partition:
    """Split ``joint`` into forward and backward graphs, recomputing what is cheaper than saving.

    ``joint`` takes ``primals_*`` then ``tangents_*`` placeholders and returns a flat tuple whose
    first ``num_forward_outputs`` entries depend on primals only and whose rest are gradients.

    Example::

        split = partition(joint, 1)                                   # min-cut rematerialization
        plain = partition(joint, 1, policy=PartitionPolicy(recompute=False))
        assert split.saved_bytes <= plain.saved_bytes
    """
    policy = _check_args(joint, num_forward_outputs, policy)
    primals, tangents = _placeholders(joint)
    outputs = list(_output_node(joint).args[0])
    fw_outputs, grads = outputs[:num_forward_outputs], outputs[num_forward_outputs:]
    from_tangents = _tangent_dependent(joint, tangents)
    for out in fw_outputs:
        if out in from_tangents:
            raise ValueError(
                f"partition: forward output {out.name!r} depends on a tangent; check num_forward_outputs"
            )

    order = {node: i for i, node in enumerate(joint.graph.nodes)}
    needed = _backward_uses(grads, from_tangents)
    chosen = _min_cut(needed, fw_outputs, order, policy) if policy.recompute else set(needed)
    chosen_sorted = sorted(chosen, key=order.__getitem__)
    saved_tensors = [n for n in chosen_sorted if is_tensor_value(n.meta.get("val"))]
    others = [n for n in chosen_sorted if not is_tensor_value(n.meta.get("val"))]
    saved_scalars, same_as = _unique_scalars(others)
    saved = saved_tensors + saved_scalars

    forward, _ = _extract(joint, primals, [*fw_outputs, *saved])
    backward, copied = _extract(joint, [*saved, *tangents], grads, same_as)
    recomputed = [n for n in sorted(copied, key=order.__getitem__) if n not in from_tangents]
    for node in recomputed:
        if not can_recompute(node, policy):
            raise RuntimeError(
                f"partition would recompute {node.name!r} ({_target_name(node)}), which the policy forbids"
            )
    return Partition(
        forward=forward,
        backward=backward,
        num_forward_outputs=num_forward_outputs,
        saved=[n.name for n in saved],
        recomputed=[n.name for n in recomputed],
        saved_bytes=sum(value_bytes(n.meta["val"]) for n in saved_tensors),
        num_saved_tensors=len(saved_tensors),
        num_saved_symints=len(saved_scalars),
    )


# --- reading the joint graph -----------------------------------------------------------------


def _check_args(joint: object, num_forward_outputs: object, policy: object) -> PartitionPolicy:
    if not isinstance(joint, fx.GraphModule):
        raise TypeError(f"partition: joint must be a torch.fx.GraphModule, got {type(joint).__name__}")
    if policy is None:
        policy = PartitionPolicy()
    if not isinstance(policy, PartitionPolicy):
        raise TypeError(f"partition: policy must be a PartitionPolicy or None, got {type(policy).__name__}")
    outputs = _output_node(joint).args[0]
    if not isinstance(outputs, (tuple, list)):
        raise ValueError("partition: the joint graph must return a flat tuple")
    if not isinstance(num_forward_outputs, int) or not 0 <= num_forward_outputs <= len(outputs):
        raise ValueError(
            f"partition: num_forward_outputs must be an int in [0, {len(outputs)}], "
            f"got {num_forward_outputs!r}"
        )
    return policy


def _output_node(joint: fx.GraphModule) -> fx.Node:
    return next(n for n in reversed(joint.graph.nodes) if n.op == "output")


def _placeholders(joint: fx.GraphModule) -> tuple[list[fx.Node], list[fx.Node]]:
    primals, tangents = [], []
    for node in joint.graph.find_nodes(op="placeholder"):
        if node.name.startswith("primals"):
            if tangents:
                raise ValueError(f"partition: primal {node.name!r} comes after a tangent")
            primals.append(node)
        elif node.name.startswith("tangents"):
            tangents.append(node)
        else:
            raise ValueError(f"partition: placeholder {node.name!r} is neither primals_* nor tangents_*")
    return primals, tangents


def _tangent_dependent(joint: fx.GraphModule, tangents: list[fx.Node]) -> set[fx.Node]:
    """Nodes computed from at least one tangent: the backward region."""
    found = set(tangents)
    for node in joint.graph.nodes:
        if any(i in found for i in node.all_input_nodes):
            found.add(node)
    return found


def _backward_uses(grads: Sequence[object], from_tangents: set[fx.Node]) -> set[fx.Node]:
    """Forward values that the live part of the backward reads directly."""
    needed: set[fx.Node] = set()
    seen: set[fx.Node] = set()
    stack = [g for g in grads if isinstance(g, fx.Node)]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node not in from_tangents:
            needed.add(node)  # a forward value: the boundary, look no further
        else:
            stack.extend(node.all_input_nodes)
    return needed


def _unique_scalars(nodes: list[fx.Node]) -> tuple[list[fx.Node], dict[fx.Node, fx.Node]]:
    """Saved SymInts with one node per distinct value, and a map from each repeat to its twin.

    Sizes of different tensors often share a symbol (``sym_size(x, 0)`` and ``sym_size(y, 0)``
    both ``s0``); one saved value serves both.
    """
    kept: list[fx.Node] = []
    same_as: dict[fx.Node, fx.Node] = {}
    first: dict[object, fx.Node] = {}
    for node in nodes:
        val = node.meta.get("val")
        if not is_scalar_value(val):
            raise RuntimeError(f"partition would save {node.name!r}, which is neither a tensor nor a SymInt")
        symbolic = isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool))
        key = val.node.expr if symbolic else (type(val), val)
        if key in first:
            same_as[node] = first[key]
        else:
            first[key] = node
            kept.append(node)
    return kept, same_as


# --- the min cut -----------------------------------------------------------------------------


def _min_cut(
    needed: set[fx.Node], fw_outputs: Sequence[object], order: dict[fx.Node, int], policy: PartitionPolicy
) -> set[fx.Node]:
    """The forward values to save so that the backward can recompute the rest of ``needed``.

    ``order`` numbers the joint's nodes topologically; networkx's answer depends on insertion
    order when cuts tie, so nodes go in in that order to keep the result deterministic.
    """
    nodes = sorted(_ancestors(needed), key=order.__getitem__)
    forward_runs = _ancestors(o for o in fw_outputs if isinstance(o, fx.Node))
    pinned, depth = _pinned_to_forward(nodes, policy)

    net = nx.DiGraph()
    for node in nodes:
        inner, outer = (node, "in"), (node, "out")
        cost = _save_cost(node, depth[node])
        if cost is None:
            net.add_edge(inner, outer)  # no capacity attribute: networkx reads it as infinite
        else:
            net.add_edge(inner, outer, capacity=cost)
        if node in pinned:
            net.add_edge(_SOURCE, inner)
        elif node in forward_runs and recompute_kind(node) != "free":
            net.add_edge(_SOURCE, inner, capacity=_RECOMPUTE_PENALTY)
        for arg in node.all_input_nodes:
            net.add_edge((arg, "out"), inner)
        if node in needed:
            net.add_edge(outer, _SINK)
    if _SOURCE not in net:
        return set()  # everything the backward needs is made from constants: recompute it all
    try:
        _, (reachable, _) = nx.minimum_cut(net, _SOURCE, _SINK)
    except nx.NetworkXUnbounded:
        raise RuntimeError(
            "partition: the backward needs a forward value that can be neither saved nor recomputed "
            "(a multi-output op that must stay in the forward, used whole by the backward)"
        ) from None
    return {n for n in nodes if (n, "in") in reachable and (n, "out") not in reachable}


def _ancestors(roots: Iterable[fx.Node]) -> set[fx.Node]:
    found: set[fx.Node] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node not in found:
            found.add(node)
            stack.extend(node.all_input_nodes)
    return found


def _pinned_to_forward(
    nodes: list[fx.Node], policy: PartitionPolicy
) -> tuple[set[fx.Node], dict[fx.Node, int]]:
    """Nodes the backward must not recompute, and each node's recompute depth.

    The depth of a node is the longest chain of non-free recomputable ops leading to it from a
    pinned node. A node deeper than ``policy.max_recompute_depth`` is pinned too, which bounds
    the length of any chain the backward recomputes.
    """
    pinned: set[fx.Node] = set()
    depth: dict[fx.Node, int] = {}
    limit = policy.max_recompute_depth
    for node in nodes:
        if not can_recompute(node, policy):
            pinned.add(node)
            depth[node] = 0
            continue
        step = 0 if recompute_kind(node) == "free" else 1
        d = max((depth[i] for i in node.all_input_nodes), default=0) + step
        if limit is not None and d > limit:
            pinned.add(node)
            d = 0
        depth[node] = d
    return pinned, depth


def _save_cost(node: fx.Node, depth: int) -> int | None:
    """Capacity of the edge that, when cut, saves ``node``; None when it cannot be saved."""
    if node.op == "get_attr" and "val" not in node.meta:
        return None  # (a module the graph holds, a torch.cond branch: read again where needed, never saved)
    if "val" not in node.meta:
        raise ValueError(f"partition: node {node.name!r} has no meta['val']; trace the joint with make_fx")
    val = node.meta["val"]
    if is_tensor_value(val):
        is_view = recompute_kind(node) == "free"
        return value_bytes(val) * _BYTE + min(depth, _MAX_DEPTH_TIE) + is_view
    if is_scalar_value(val):
        return _SCALAR_COST
    return None  # a tuple of outputs: only its getitem users can be saved


# --- building the two graphs -----------------------------------------------------------------


def _extract(
    joint: fx.GraphModule,
    inputs: Sequence[fx.Node],
    outputs: Sequence[object],
    same_as: dict[fx.Node, fx.Node] | None = None,
) -> tuple[fx.GraphModule, set[fx.Node]]:
    """A graph taking ``inputs`` as placeholders and computing ``outputs`` from joint nodes.

    Copies only the nodes the outputs need, in the joint's (topological) order; a node in
    ``same_as`` reads the input it maps to instead. Returns the module and the copied nodes.
    """
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in inputs:
        env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)
    for node, twin in (same_as or {}).items():
        env[node] = env[twin]
    copied: set[fx.Node] = set()
    stack = [o for o in outputs if isinstance(o, fx.Node)]
    while stack:
        node = stack.pop()
        if node in env or node in copied:
            continue
        if node.op == "placeholder":
            raise RuntimeError(f"partition: {node.name!r} is needed but is not an input of this graph")
        copied.add(node)
        stack.extend(node.all_input_nodes)
    for node in joint.graph.nodes:
        if node in copied:
            env[node] = graph.node_copy(node, env.__getitem__)
    graph.output(fx.map_arg(tuple(outputs), env.__getitem__))
    graph.lint()
    return fx.GraphModule(joint, graph), copied


# --- printing --------------------------------------------------------------------------------


def _describe(val: torch.Tensor) -> str:
    dtype = str(val.dtype).removeprefix("torch.")
    return f"{dtype}[{', '.join(str(s) for s in val.shape)}]"


def _human(num_bytes: int) -> str:
    if num_bytes < 1024:
        return f"{num_bytes} B"
    if num_bytes < 1024**2:
        return f"{num_bytes / 1024:.1f} KiB"
    return f"{num_bytes / 1024**2:.1f} MiB"


def _target_name(node: fx.Node) -> str:
    if node.op == "get_attr":
        return f"get_attr {node.target}"
    if isinstance(node.target, torch._ops.OpOverload):
        return str(node.target)
    return getattr(node.target, "__name__", str(node.target))
