"""What the partitioner may recompute in the backward, and what saving a value costs.

The min-cut in :mod:`kiln.aot.partition` only trades bytes; this module decides which forward
nodes are allowed on the backward side of the cut at all, and prices each candidate::

    policy = PartitionPolicy(max_recompute_depth=8)
    recompute_kind(node)               # "free", "cheap", "reduction", "random" or "expensive"
    can_recompute(node, policy)        # True for a pointwise op, False for aten.mm

The policy, and why:

* **free** (views, ``getitem``, SymInt arithmetic, ``get_attr``): recomputing costs nothing, so
  saving one is never better than saving what it was derived from.
* **cheap** (pointwise ops, casts and copies, tensor creation, ``cat``/padding): memory-bound;
  fused into the backward kernel that consumes it, a recomputation costs little arithmetic and
  spares writing, keeping and re-reading a saved activation.
* **reduction** (``sum``, ``amax``, ``var_mean``, ...): still one memory-bound pass, and letting
  the backward recompute e.g. a softmax denominator avoids saving the full-size input next to
  it; :attr:`PartitionPolicy.recompute_reductions` turns this off.
* **random** (``nondeterministic_seeded`` ops: ``rand``, ``bernoulli``, ``native_dropout``...):
  never recomputed, so a dropout mask is the same in forward and backward.
* **expensive** (everything else: ``mm``/``bmm``/``addmm``/``convolution``, attention, fused
  normalization kernels such as ``native_layer_norm``, sorts, scans, data-dependent ops):
  compute-bound, multi-output or unknown, always saved.

On top of that, :attr:`PartitionPolicy.max_recompute_depth` (16 by default, about what one fused
pointwise kernel holds, e.g. GELU's backward is 10 ops) caps how long a chain of non-free ops the
backward may recompute, so a long elementwise tail is not replayed in full to save one buffer.
"""

from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx
from torch.fx.experimental import symbolic_shapes

__all__ = [
    "PartitionPolicy",
    "can_recompute",
    "is_scalar_value",
    "is_tensor_value",
    "recompute_kind",
    "size_hint",
    "value_bytes",
]

aten = torch.ops.aten

# Used when a symbolic size has no hint (an unbacked SymInt from e.g. nonzero): a guess is
# enough, because it only prices a save against a recomputation.
_UNKNOWN_SIZE = 4096


@dataclasses.dataclass(frozen=True)
class PartitionPolicy:
    """How the partitioner trades saved memory for recomputation in the backward.

    Example::

        partition(joint, 1, policy=PartitionPolicy(recompute=False))  # save all backward uses
    """

    recompute: bool = True
    """Let the backward recompute cheap forward ops instead of saving their outputs."""

    recompute_reductions: bool = True
    """Count reductions (sum, amax, var_mean, ...) as cheap enough to recompute."""

    max_recompute_depth: int | None = 16
    """Longest chain of non-free ops the backward may recompute; None for no bound."""

    never_recompute: frozenset = frozenset()
    """Extra ATen ops (overloads like ``aten.exp.default`` or packets like ``aten.exp``) to always save."""

    def __post_init__(self) -> None:
        for name in ("recompute", "recompute_reductions"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"PartitionPolicy.{name} must be a bool, got {getattr(self, name)!r}")
        depth = self.max_recompute_depth
        if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 0):
            raise ValueError(
                f"PartitionPolicy.max_recompute_depth must be None or an int >= 0, got {depth!r}"
            )
        object.__setattr__(self, "never_recompute", frozenset(self.never_recompute))


# Ops that are random without carrying the tag in every PyTorch version we support.
_RANDOM_OPS = {
    aten.bernoulli,
    aten.native_dropout,
    aten.rand,
    aten.rand_like,
    aten.randn,
    aten.randn_like,
    aten.randint,
    aten.randint_like,
    aten.randperm,
    aten.normal,
    aten.uniform,
    aten.exponential,
    aten.multinomial,
    aten.poisson,
}

# Memory-bound ops without the pointwise tag.
_CHEAP_OPS = {
    aten.clone,
    aten._to_copy,
    aten.copy,
    aten.full,
    aten.full_like,
    aten.zeros,
    aten.zeros_like,
    aten.ones,
    aten.ones_like,
    aten.empty,
    aten.empty_like,
    aten.empty_strided,
    aten.empty_permuted,
    aten.scalar_tensor,
    aten.arange,
    aten.cat,
    aten.constant_pad_nd,
    aten.slice_scatter,
    aten.select_scatter,
    aten.lift_fresh_copy,
}

# Metadata queries; they return SymInts but take tensors, so the value test misses them.
_SIZE_QUERIES = {aten.sym_size, aten.sym_numel, aten.sym_stride, aten.sym_storage_offset}

# Data-dependent: recomputing would mint a fresh unbacked SymInt the saved shapes do not know.
_DATA_DEPENDENT = {aten._local_scalar_dense, aten.nonzero, aten.item}


def is_tensor_value(val: object) -> bool:
    """Whether a ``meta["val"]`` is a single tensor (as opposed to a SymInt or a tuple).

    Example: ``is_tensor_value(node.meta["val"])`` is True for the output of ``aten.mm``.
    """
    return isinstance(val, torch.Tensor)


def is_scalar_value(val: object) -> bool:
    """Whether a ``meta["val"]`` is a (possibly symbolic) Python scalar, e.g. ``s0`` or ``3``."""
    return isinstance(val, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool))


def size_hint(size: int | torch.SymInt) -> int:
    """A concrete value for a possibly symbolic size, without adding guards.

    Example: ``size_hint(fake.numel())`` is 32 for a fake ``s0 x 8`` tensor traced with s0 = 4.
    """
    if isinstance(size, int):
        return size
    # optimization_hint is the 2.13 name; older releases call it hint_int.
    hint = getattr(symbolic_shapes, "optimization_hint", None) or getattr(symbolic_shapes, "hint_int", None)
    if hint is not None:
        return int(hint(size, fallback=_UNKNOWN_SIZE))
    node_hint = getattr(size.node, "hint", None)
    return int(node_hint) if node_hint is not None else _UNKNOWN_SIZE


def value_bytes(val: object) -> int:
    """Bytes a saved ``meta["val"]`` occupies: numel * element size for a tensor, else 0.

    Example: ``value_bytes(torch.empty(4, 8))`` is 128.
    """
    if not is_tensor_value(val):
        return 0
    return size_hint(val.numel()) * val.element_size()


def _packet(target: object) -> object:
    return getattr(target, "overloadpacket", None)


def _is_view(target: torch._ops.OpOverload) -> bool:
    return bool(getattr(target, "is_view", False)) or _packet(target) in (aten.alias, aten.detach)


def _is_view_copy(target: torch._ops.OpOverload) -> bool:
    # Functionalization with views removed emits view_copy / permute_copy / ...: a plain copy.
    name = target.overloadpacket.__name__
    if not name.endswith("_copy"):
        return False
    base = getattr(aten, name[: -len("_copy")], None)
    overload = getattr(base, "default", None)
    return bool(getattr(overload, "is_view", False))


def recompute_kind(node: torch.fx.Node) -> str:
    """Classify a forward node: "free", "cheap", "reduction", "random" or "expensive".

    Example: for ``y = aten.sin.default(x)`` this is "cheap"; for ``aten.mm`` it is "expensive".
    """
    if node.op == "get_attr":
        return "free"
    if node.op != "call_function":
        return "expensive"  # placeholders cannot be recomputed at all
    target = node.target
    if target is operator.getitem:
        return "free"
    if not isinstance(target, torch._ops.OpOverload):
        # Python-level SymInt arithmetic (operator.mul, sym_max, ...) on sizes.
        return "free" if is_scalar_value(node.meta.get("val")) else "expensive"
    packet = target.overloadpacket
    if torch.Tag.nondeterministic_seeded in target.tags or packet in _RANDOM_OPS:
        return "random"
    if packet in _DATA_DEPENDENT:
        return "expensive"
    if packet in _SIZE_QUERIES or _is_view(target):
        return "free"
    if torch.Tag.pointwise in target.tags or packet in _CHEAP_OPS or _is_view_copy(target):
        return "cheap"
    if torch.Tag.reduction in target.tags:
        return "reduction"
    return "expensive"


def can_recompute(node: torch.fx.Node, policy: PartitionPolicy) -> bool:
    """Whether the policy lets the backward recompute ``node`` (depth bounds aside).

    Example: ``can_recompute(mm_node, PartitionPolicy())`` is False.
    """
    if not policy.recompute:
        return False
    target = node.target
    if target in policy.never_recompute or getattr(target, "overloadpacket", None) in policy.never_recompute:
        return False
    kind = recompute_kind(node)
    return kind in ("free", "cheap") or (kind == "reduction" and policy.recompute_reductions)
