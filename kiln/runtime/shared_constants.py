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


def compute(graph: fx.GraphModule, frozen: Sequence[Any]) -> tuple:
    """`graph(*frozen)`'s outputs, each node's result shared with any graph that computed the
    same node over the same frozen tensors and still holds it."""
    output = _SharingInterpreter(graph).run(*frozen)
    return tuple(output) if isinstance(output, (list, tuple)) else (output,)


class _SharingInterpreter(fx.Interpreter):
    """fx's interpreter with each node's key beside its value: a keyed node already computed (and
    still held) is taken from the memo, any other node runs as fx runs it."""

    def __init__(self, graph: fx.GraphModule) -> None:
        super().__init__(graph)
        self.keys: dict[fx.Node, tuple | None] = {}
        self.leaves: dict[fx.Node, tuple] = {}  # the frozen tensors each node's key names

    def run_node(self, node: fx.Node) -> Any:
        if node.op == "output":
            return super().run_node(node)
        if node.op == "placeholder":
            value = super().run_node(node)
            try:
                self.keys[node], self.leaves[node] = _input_key(value)
            except _Unkeyable:
                self.keys[node], self.leaves[node] = None, ()
            return value
        key = None
        if node.op == "call_function" and _shareable(node.target):
            try:
                key = (node.target, _arg_key(node.args, self.keys), _arg_key(node.kwargs, self.keys))
            except _Unkeyable:
                key = None
        names = tuple({id(t): t for n in node.all_input_nodes for t in self.leaves.get(n, ())}.values())
        self.keys[node], self.leaves[node] = key, names
        result = _shared(key) if key is not None else None
        if result is not None:
            STATS["shared"] += 1
            return result
        result = super().run_node(node)
        STATS["computed"] += 1
        if key is not None and isinstance(result, torch.Tensor):  # (a tuple is reached through its getitem nodes)
            _remember(key, result, names)
        return result


def _remember(key: tuple, result: torch.Tensor, names: tuple) -> None:
    global _inserted
    with _LOCK:
        _MEMO[key] = (weakref.ref(result), tuple(weakref.ref(t) for t in names))
        _inserted += 1
        if _inserted % _PRUNE_EVERY == 0:
            _prune()


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


def _prune() -> None:
    """Drop entries whose result or named frozen tensors are gone (called under _LOCK)."""
    for key in [k for k, (ref, named) in _MEMO.items() if ref() is None or any(r() is None for r in named)]:
        del _MEMO[key]


def clear() -> None:
    """Forget every shared result (tests; the tensors stay with the graphs that hold them)."""
    with _LOCK:
        _MEMO.clear()
