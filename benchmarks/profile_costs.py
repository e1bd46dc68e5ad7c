"""What one step of a compiled graph costs, for the profile's roofline (benchmarks/profile.py):
floating-point operations and bytes moved.

- A loop kernel (`FusedKernel`): FLOPs from the IR, each member's ops per element (every
  computing op counts 1: an `exp` as much as an `add`; loads, stores, constants, index
  arithmetic and casts count 0) times its elements (its loops, reduction loops included);
  bytes: the kernel's input and output buffers, each counted once (what it reads from and
  writes to memory, assuming a buffer read twice comes from cache the second time; an input read
  through an index, such as an embedding table, counts at most one element per load).
- An extern call: FLOPs from its tensors' shapes (kiln::mm 2·M·N·K, kiln::conv 2 · output
  elements · input channels per group · kernel area, attention 2·B·H·L·S·(E + Ev), ATen's GEMMs
  and convolutions through torch's own formulas in `torch.utils.flop_counter`); an op with no
  formula counts 0 FLOPs and is read as memory-bound. Bytes: the tensors it is given and returns.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils.flop_counter import flop_registry

from kiln.ir.analysis import OpCounter, ReadsWrites, run
from kiln.ir.schedule import FusedKernel, LoopNest, loop_extents

# Ops that move or name values rather than compute them.
_NOT_FLOPS = frozenset({"load", "store", "constant", "index_expr", "to_dtype", "indirect_indexing"})


@dataclass(frozen=True)
class Cost:
    flops: int | None  # None: not known (a kernel loaded from the AOT graph cache has no IR)
    bytes: int | None
    kind: str  # kernel, gemm, conv, attention, aten, view, layout copy
    what: str  # a short description: the fused nodes, the op and its shapes
    dtype: str | None = None  # an extern's first tensor's dtype: a bfloat16 GEMM has its own peak


def _int(expr: Any) -> int | None:
    try:
        return int(expr)
    except TypeError:  # a symbolic size: not known until the call
        return None


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _layout_bytes(buffer: Any) -> int | None:
    sizes = [_int(s) for s in buffer.layout.size]
    return None if None in sizes else math.prod(sizes) * _itemsize(buffer.layout.dtype)


def _member_ops(member: LoopNest) -> tuple[collections.Counter, collections.Counter, int | None]:
    """The computing ops of one element of `member`, its loads per buffer over all its elements,
    and its FLOPs over all its elements (None for both totals when a loop's extent is symbolic)."""
    counts = collections.Counter({op: n for op, n in run(OpCounter(), member.node).counts.items()
                                  if op not in _NOT_FLOPS})
    extents = [_int(e) for e in loop_extents(member.node).values()]
    if None in extents:
        return counts, collections.Counter(), None
    elements = math.prod(extents)
    loads = collections.Counter(buffer for buffer, _ in run(ReadsWrites(), member.node).reads)
    return counts, collections.Counter({b: n * elements for b, n in loads.items()}), sum(counts.values()) * elements


def _input_bytes(buffer: Any, loaded: int) -> int | None:
    # A gather (an embedding's rows, an index_select) reads the elements it loads, not its whole
    # input: never more than one element per load.
    size = _layout_bytes(buffer)
    return None if size is None else min(size, loaded * _itemsize(buffer.layout.dtype))


def kernel_cost(kernel: FusedKernel, vectorized: bool | None = None) -> Cost:
    members = list(kernel.members) + ([kernel.scatter_init] if kernel.scatter_init is not None else [])
    ops, loads, flops = collections.Counter(), collections.Counter(), []
    for member in members:
        counts, member_loads, member_flops = _member_ops(member)
        ops.update(counts)
        loads.update(member_loads)
        flops.append(member_flops)
    sizes = [_input_bytes(b, loads[b.name]) for b in {b.name: b for b in kernel.inputs}.values()]
    sizes += [_layout_bytes(b) for b in {b.name: b for b in kernel.outputs}.values()]
    reductions = sum(m.is_reduction for m in kernel.members)
    # No ATen origin survives lowering; the ops it computes say what it is (sum, rsqrt, mul: a norm).
    common = " ".join(op for op, _ in ops.most_common(5)) + (" …" if len(ops) > 5 else "")
    what = (f"{len(kernel.members)} node{'s' if len(kernel.members) > 1 else ''}"
            f"{f', {reductions} reduction' + ('s' if reductions > 1 else '') if reductions else ''}: "
            f"{common or 'copy'} [{kernel.members[0].name}{'…' if len(kernel.members) > 1 else ''}]"
            f"{'' if vectorized is None else ' vec' if vectorized else ' scalar'}")
    return Cost(None if None in flops else sum(flops), None if None in sizes else sum(sizes), "kernel", what)


def unknown_kernel_cost() -> Cost:
    return Cost(None, None, "kernel", "(no IR: graph loaded from the AOT graph cache)")


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def _nbytes(tensors: list[torch.Tensor]) -> int:
    seen, total = set(), 0
    for t in tensors:  # one tensor passed twice is read once
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def _shape(t: Any) -> str:
    return "x".join(map(str, t.shape)) if isinstance(t, torch.Tensor) else "-"


def _named(name: str, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by their schema's names (kiln's C++ operators, kiln/externs/native_ops.py)."""
    from kiln.externs import native_ops

    short = name.split("::", 1)[1]
    if short not in native_ops.FAKES:
        return {}
    names = [argument.name for argument in native_ops.op(short)._schema.arguments]
    return {**dict(zip(names, args)), **kwargs}


def _mm(call: dict, out: Any) -> tuple[int, str]:
    a, b, bias, unary = call["a"], call["b"], call.get("bias"), call.get("unary", "none")
    m, k = a.shape
    n = b.shape[1]
    post = ("+bias" if bias is not None else "") + ("" if unary == "none" else f"+{unary}")
    impl = call.get("impl", "kiln")  # (the GEMMs with a layer norm inside are kiln's own only)
    return 2 * m * n * k, f"kiln::mm[{impl}] {m}x{k} @ {k}x{n}{' ' + post if post else ''}"


def _conv(call: dict, out: Any) -> tuple[int, str]:
    x, weight, groups, unary = call["x"], call["weight"], call.get("groups", 1), call.get("unary", "none")
    flops = 2 * out.numel() * weight[0].numel()  # weight [Cout, Cin/groups, kh, kw]
    post = ("" if unary == "none" else f"+{unary}") + ("+add" if call.get("other") is not None else "")
    kernel = "x".join(map(str, weight.shape[2:]))
    return flops, (f"kiln::conv[{call.get('impl')}] {_shape(x)} -> {_shape(out)} k{kernel}"
                   f"{f' g{groups}' if groups != 1 else ''}{' ' + post if post else ''}")


def _attention(q: Any, k: Any, v: Any, causal: bool) -> tuple[int, str]:
    *batch, length, e = q.shape
    source, ev = k.shape[-2], v.shape[-1]
    # Q·Kᵀ and P·V; a causal mask skips about half of both.
    flops = 2 * math.prod(batch) * length * source * (e + ev) // (2 if causal else 1)
    return flops, f"attention {_shape(q)} · {_shape(k)} · {_shape(v)}{' causal' if causal else ''}"


def extern_cost(name: str, op: Any, args: tuple, kwargs: dict, out: Any) -> Cost:
    """The cost of one extern call `op(*args, **kwargs) -> out`; `name` its qualified op name."""
    moved = _nbytes(_tensors((args, kwargs)) + _tensors(out))
    first = next(iter(_tensors((args, kwargs))), None)
    dtype = str(first.dtype).replace("torch.", "") if first is not None else None
    shapes = ", ".join(_shape(t) for t in _tensors((args, kwargs))[:3])
    call = _named(name, args, kwargs) if name.startswith("kiln::") else {}
    if {"a", "b"} <= call.keys():  # kiln::mm, and any kiln GEMM op with its a [M, K] and b [K, N]
        flops, what = _mm(call, out)
        return Cost(flops, moved, "gemm", what.replace("kiln::mm", name), dtype)
    if {"x", "weight"} <= call.keys():  # kiln::conv
        flops, what = _conv(call, out)
        return Cost(flops, moved, "conv", what.replace("kiln::conv", name), dtype)
    if name == "kiln::attention":
        flops, what = _attention(call["q"], call["k"], call["v"], call.get("is_causal", False))
        return Cost(flops, moved, "attention", what.replace("attention", "kiln::attention", 1), dtype)
    if "scaled_dot_product" in name:  # ATen's (q, k, v, dropout_p, is_causal, ...)
        flops, what = _attention(*args[:3], kwargs.get("is_causal", args[4] if len(args) > 4 else False))
        return Cost(flops, moved, "attention", what, dtype)
    if getattr(op, "is_view", False):  # as_strided, alias: how views reach externs; no work
        return Cost(0, 0, "view", f"{name} {shapes}")
    packet = getattr(op, "_overloadpacket", None)
    formula = flop_registry.get(packet)
    if formula is not None:
        flops = int(formula(*args, out_val=out, **kwargs))
        kind = "conv" if "conv" in name else "gemm"
        return Cost(flops, moved, kind, f"{name} {shapes}", dtype)
    return Cost(0, moved, "aten", f"{name} {shapes}")


def layout_copy_cost(copied: int) -> Cost:
    return Cost(0, copied, "layout copy", "_in_layout: extern results and inputs copied to the strides kernels expect")
