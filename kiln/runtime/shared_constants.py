"""Frozen graphs' constants computed once per process, whichever graph asks first.

A model compiled for `generate()` has two frozen graphs over the same weights: the prompt's
(prefill) and the one-token step's. Each constants graph concatenates the same q/k/v and gate/up
weights (kiln/passes/sibling_products.py) and kiln's packs are kept per weight tensor
(kiln_runtime.cpp `packed`), so two graphs held two copies of both: llama-160m's float32 model
(452 MB) held 2 x (236 MB of concatenations + 439 MB of packs) beside it. Here a constants graph
runs node by node and every node whose op and inputs another graph (or an earlier freeze) already
computed takes that result, the same tensor: its packs are then made once and read by both.

What makes two nodes the same: the same op overload (deterministic, not mutating) over the same
arguments, where a frozen input is the same tensor object at the same version counter, memory,
dtype, shape and strides (as FrozenProgram's stamp checks it) with no write through `.data` or
`kiln.refreeze` marked since (kiln/runtime/data_watch.py) and a computed input is the same
node result; plain values compare by type and repr (0.0 and -0.0 differ). A result is held weakly:
when no graph keeps it, it goes, and the next graph that needs it computes it again. A node kiln
cannot key (a call_module, an unhashable argument) is computed by itself as before.
"""

from __future__ import annotations

import operator
import threading
import weakref
from typing import Any, Sequence

import torch
from torch import fx

from kiln.runtime import data_watch

_LOCK = threading.Lock()
# key -> (weak reference to the result, weak references to the frozen tensors the key names)
_MEMO: dict[tuple, tuple[weakref.ref, tuple[weakref.ref, ...]]] = {}
_PRUNE_EVERY = 256  # insertions between sweeps of entries whose result has gone
_inserted = 0
STATS = {"computed": 0, "shared": 0}  # node results computed here and taken from another graph


class _Unkeyable(Exception):
    """An argument without a stable key: the node is computed by itself."""


def _input_key(value: Any) -> tuple[tuple, tuple]:
    """A frozen input's key and the tensors it names (whose liveness keeps `id` unambiguous)."""
    if isinstance(value, torch.Tensor):
        key = ("input", id(value), value._version, data_watch.last_write(value), value.data_ptr() if value.numel() else 0,
               value.dtype, value.device, tuple(value.shape), tuple(value.stride()), value.storage_offset())
        return key, (value,)
    return _literal(value), ()


def _literal(value: Any) -> tuple:
    if value is None or isinstance(value, (bool, int, str, torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return (type(value).__name__, repr(value))
    if isinstance(value, float):
        return ("float", repr(value))  # (0.0 == -0.0 and nan != nan: repr tells them apart and alike)
    raise _Unkeyable(type(value).__name__)


def _arg_key(arg: Any, keys: dict[fx.Node, tuple | None]) -> tuple:
    if isinstance(arg, fx.Node):
        key = keys.get(arg)
        if key is None:
            raise _Unkeyable(arg.name)
        return key
    if isinstance(arg, (list, tuple)):
        return (type(arg).__name__, *(_arg_key(a, keys) for a in arg))
    if isinstance(arg, dict):
        return ("dict", *((k, _arg_key(v, keys)) for k, v in sorted(arg.items())))
    return _literal(arg)


def _shareable(target: Any) -> bool:
    """Ops whose result depends on their arguments alone and that write none of them."""
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return not target._schema.is_mutable and torch.Tag.nondeterministic_seeded not in target.tags


def _held(result: Any) -> weakref.ref | None:
    """A weak reference to a tensor result (a tuple of tensors is reached through its getitem nodes)."""
    return weakref.ref(result) if isinstance(result, torch.Tensor) else None


def compute(graph: fx.GraphModule, frozen: Sequence[Any]) -> tuple:
    """`graph(*frozen)`'s outputs, each node's result shared with any graph that computed the
    same node over the same frozen tensors and still holds it."""
    global _inserted
    env: dict[fx.Node, Any] = {}
    keys: dict[fx.Node, tuple | None] = {}
    leaves: dict[fx.Node, tuple] = {}  # the frozen tensors each node's key names
    inputs = iter(frozen)
    output: Any = None
    for node in graph.graph.nodes:
        if node.op == "placeholder":
            value = next(inputs)
            env[node] = value
            try:
                keys[node], leaves[node] = _input_key(value)
            except _Unkeyable:
                keys[node], leaves[node] = None, ()
            continue
        if node.op == "output":
            output = fx.node.map_arg(node.args[0], env.__getitem__)
            break
        args = fx.node.map_arg(node.args, env.__getitem__)
        kwargs = fx.node.map_arg(node.kwargs, env.__getitem__)
        key = None
        if node.op == "call_function" and _shareable(node.target):
            try:
                key = (node.target, _arg_key(node.args, keys), _arg_key(node.kwargs, keys))
            except _Unkeyable:
                key = None
        names = tuple({id(t): t for n in node.all_input_nodes for t in leaves.get(n, ())}.values())
        result = _shared(key) if key is not None else None
        if result is None:
            result = _run(graph, node, args, kwargs)
            STATS["computed"] += 1
            held = _held(result) if key is not None else None
            if held is not None:
                with _LOCK:
                    _MEMO[key] = (held, tuple(weakref.ref(t) for t in names))
                    _inserted += 1
                    if _inserted % _PRUNE_EVERY == 0:
                        _prune()
        else:
            STATS["shared"] += 1
        env[node], keys[node], leaves[node] = result, key, names
    return tuple(output) if isinstance(output, (list, tuple)) else (output,)


def _shared(key: tuple) -> Any:
    """The result another graph computed for `key`, while it and every frozen tensor it names live."""
    with _LOCK:
        entry = _MEMO.get(key)
        if entry is None:
            return None
        result_ref, named = entry
        result = result_ref()
        if result is None or any(ref() is None for ref in named):
            del _MEMO[key]
            return None
        return result


def _run(graph: fx.GraphModule, node: fx.Node, args: Any, kwargs: Any) -> Any:
    if node.op == "call_function":
        return node.target(*args, **kwargs)
    if node.op == "call_method":
        self_obj, *rest = args
        return getattr(self_obj, node.target)(*rest, **kwargs)
    if node.op == "call_module":
        return graph.get_submodule(node.target)(*args, **kwargs)
    if node.op == "get_attr":
        value: Any = graph
        for part in node.target.split("."):
            value = getattr(value, part)
        return value
    raise RuntimeError(f"kiln: a constants graph has a node of kind {node.op!r}")


def _prune() -> None:
    """Drop entries whose result or named frozen tensors are gone (called under _LOCK)."""
    for key in [k for k, (ref, named) in _MEMO.items() if ref() is None or any(r() is None for r in named)]:
        del _MEMO[key]


def clear() -> None:
    """Forget every shared result (tests; the tensors stay with the graphs that hold them)."""
    with _LOCK:
        _MEMO.clear()
