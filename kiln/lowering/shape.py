"""Ops that move elements between tensors of different shapes: cat, pad, split, slice/select scatter.

Kernels compute both sides of a `where`, so every source is read at an index clamped into its
own range (`sympy.Min`/`Max`) and the right one is picked: no load is ever out of bounds.
"""

from __future__ import annotations

from typing import Any, Sequence

import sympy
import torch

from kiln.ir.indexing import FloorDiv, Mod
from kiln.ir.ops import ops
from kiln.lowering.context import is_written_back_input, realize
from kiln.lowering.creation import filled
from kiln.lowering.pointwise import promoted_dtypes
from kiln.lowering.realize import MAX_INLINED_OPS, body_cost, has_math
from kiln.lowering.registry import register_lowering
from kiln.lowering.scatter import scatter_into
from kiln.lowering.values import TensorValue
from kiln.lowering.views import slice_

aten = torch.ops.aten
MAX_CAT_INPUTS = 16  # each element selects among all inputs; past this, one copy per input is cheaper


def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _clamp(expr: sympy.Expr, size: sympy.Expr) -> sympy.Expr:
    return sympy.Min(sympy.Max(expr, 0), size - 1)


def _cast(value: Any, have: torch.dtype, want: torch.dtype) -> Any:
    return value if have == want else ops.to_dtype(value, want)


def _index_lt(index: sympy.Expr, bound: sympy.Expr):
    return ops.lt(ops.index_expr(index, torch.int64), ops.index_expr(bound, torch.int64))


def _may_pad(amount: Any) -> bool:
    """Whether a pad amount may be positive: a symbolic one (HuggingFace's mask padded to a static
    cache's length, `max_len - mask_len`) is, unless its symbols' ranges say otherwise; where it is
    not, the bound it adds to the `where` holds anyway (a crop's every index is inside)."""
    return (amount > 0) if isinstance(amount, int) else sympy.sympify(amount).is_positive is not False


def _running_totals(values) -> list[sympy.Expr]:
    out, total = [], sympy.Integer(0)
    for v in values:
        total = total + v
        out.append(total)
    return out


def _computed_once(part: TensorValue) -> TensorValue:
    """`part` as a concatenation reads it: every element of the result computes every part's body
    (the `where` keeps one), so a part with math or more than a few ops is computed once into a
    buffer. A dynamic KV cache's `cat([cache, rope(new_key)])` computed the new key's rotary
    embedding, sines and cosines, for each of the cache's rows: 0.2 ms a layer of llama-160m's
    decode step at 160 rows, for one row's worth of values."""
    if part.buffer is not None or part.strided is not None:
        return part
    return realize(part) if has_math(part) or body_cost(part) > MAX_INLINED_OPS else part


@register_lowering(aten.cat.default)
def cat(tensors: Sequence[TensorValue], dim: int = 0) -> TensorValue:
    # Eager skips 1-D empty tensors whatever `dim` is; other empty inputs add nothing either.
    tensors = [t for t in tensors if not (t.rank == 1 and t.size[0] == 0)]
    if not tensors or len(tensors) > MAX_CAT_INPUTS:
        raise NotImplementedError(f"cat of {len(tensors)} tensors")
    dim = _dim(dim, tensors[0].rank)
    dtype = promoted_dtypes(list(tensors))[1]
    size = list(tensors[0].size)
    size[dim] = sympy.Add(*(t.size[dim] for t in tensors))
    parts = [t for t in tensors if t.size[dim] != 0]
    if not parts:
        return filled(size, 0, dtype)
    ends = list(_running_totals(t.size[dim] for t in parts))
    if len(parts) > 1:
        parts = [_computed_once(t) for t in parts]

    def loader(index):
        i = index[dim]
        value = None
        for t, end in reversed(list(zip(parts, ends))):
            local = _clamp(i - (end - t.size[dim]), t.size[dim])
            v = _cast(t.loader([*index[:dim], local, *index[dim + 1 :]]), t.dtype, dtype)
            value = v if value is None else ops.where(_index_lt(i, end), v, value)
        return value

    return TensorValue(tuple(size), dtype, loader)


@register_lowering(aten.constant_pad_nd.default)
def constant_pad_nd(x: TensorValue, pad: Sequence[int], value: Any = 0) -> TensorValue:
    """Pads (or, for negative amounts, crops) the last len(pad)//2 dims, last dim first."""
    sides = {x.rank - 1 - k: (pad[2 * k], pad[2 * k + 1]) for k in range(len(pad) // 2)}
    size = [s + sum(sides.get(d, (0, 0))) for d, s in enumerate(x.size)]
    if any(x.size[d] == 0 for d in sides):
        return filled(size, value, x.dtype)

    def loader(index):
        source, inside = list(index), []
        for d, (low, high) in sides.items():
            source[d] = _clamp(index[d] - low, x.size[d])
            if _may_pad(low):
                bound = ops.constant(low, torch.int64) if isinstance(low, int) else ops.index_expr(low, torch.int64)
                inside.append(ops.ge(ops.index_expr(index[d], torch.int64), bound))
            if _may_pad(high):
                inside.append(_index_lt(index[d], low + x.size[d]))
        v = x.loader(source)
        if not inside:
            return v
        cond = inside[0]
        for c in inside[1:]:
            cond = ops.logical_and(cond, c)
        return ops.where(cond, v, ops.constant(value, x.dtype))

    return TensorValue(tuple(size), x.dtype, loader)


@register_lowering(aten.split_with_sizes.default)
def split_with_sizes(x: TensorValue, split_sizes: Sequence[int], dim: int = 0) -> list[TensorValue]:
    starts = _running_totals([0, *split_sizes[:-1]])
    return [slice_(x, dim, int(start), int(start) + length) for start, length in zip(starts, split_sizes)]


@register_lowering(aten.split.Tensor)
def split(x: TensorValue, split_size: int, dim: int = 0) -> list[TensorValue]:
    length = x.size[_dim(dim, x.rank)]
    if not length.is_Integer:
        raise NotImplementedError("split of a symbolic length")
    if split_size == 0:
        raise NotImplementedError("split into empty pieces")
    starts = range(0, max(int(length), 1), split_size)
    return [slice_(x, dim, start, min(start + split_size, int(length))) for start in starts]


def _scatter_into(x: TensorValue, src: TensorValue, dim: int, inside, src_index) -> TensorValue:
    """x with the elements where `inside(i)` replaced by src read at `src_index(index)`."""

    def loader(index):
        i = index[dim]
        return ops.where(inside(i), _cast(src.loader(src_index(list(index))), src.dtype, x.dtype), x.loader(index))

    return TensorValue(x.size, x.dtype, loader)


@register_lowering(aten.slice_scatter.default)
def slice_scatter(x: TensorValue, src: TensorValue, dim: int = 0, start: int | None = None, end: int | None = None,
                  step: int = 1) -> TensorValue:
    dim = _dim(dim, x.rank)
    length = x.size[dim]
    start = 0 if start is None else (sympy.Max(start + length, 0) if start < 0 else start)
    end = length if end is None else (sympy.Max(end + length, 0) if end < 0 else end)
    start, end = sympy.Min(start, length), sympy.Min(end, length)
    if src.size[dim] == 0:
        return x

    def offset(i):
        return sympy.Max(i - start, 0)

    def inside(i):
        cond = ops.logical_and(ops.ge(ops.index_expr(i, torch.int64), ops.index_expr(start, torch.int64)), _index_lt(i, end))
        if step == 1:
            return cond
        on_step = ops.eq(ops.index_expr(Mod(offset(i), step), torch.int64), ops.constant(0, torch.int64))
        return ops.logical_and(cond, on_step)

    def src_index(index):
        index[dim] = sympy.Min(FloorDiv(offset(index[dim]), step), src.size[dim] - 1)
        return index

    if is_written_back_input(x) and src.size[dim] != length:
        # A part of a mutated input, written in place (a growing KV cache's new row): a Scatter
        # node, which the memory plan computes in the input's memory writing `src`'s elements
        # alone. The pointwise form would read and write every element of the input.
        def target_value(index):
            return [*index[:dim], start + index[dim] * step, *index[dim + 1:]], _cast(src.loader(list(index)), src.dtype, x.dtype)

        return scatter_into(x, src.size, target_value, None)
    return _scatter_into(x, src, dim, inside, src_index)


@register_lowering(aten.select_scatter.default)
def select_scatter(x: TensorValue, src: TensorValue, dim: int, index: int) -> TensorValue:
    dim = _dim(dim, x.rank)
    index = index + x.size[dim] if index < 0 else index
    inside = lambda i: ops.eq(ops.index_expr(i, torch.int64), ops.index_expr(sympy.sympify(index), torch.int64))  # noqa: E731
    return _scatter_into(x, src, dim, inside, lambda idx: idx[:dim] + idx[dim + 1 :])


@register_lowering(aten.flip.default)
def flip(x: TensorValue, dims: Sequence[int]) -> TensorValue:
    flipped = {_dim(d, x.rank) for d in dims}

    def loader(index):
        return x.loader([x.size[d] - 1 - i if d in flipped else i for d, i in enumerate(index)])

    return TensorValue(x.size, x.dtype, loader)


@register_lowering(aten.repeat.default)
def repeat(x: TensorValue, repeats: Sequence[int]) -> TensorValue:
    """Tiles x `repeats` times along each dim (extra leading repeats add dims): reads wrap around."""
    lead = len(repeats) - x.rank
    size = [*repeats[:lead], *(s * r for s, r in zip(x.size, repeats[lead:]))]
    if any(s == 0 for s in size):
        return filled(size, 0, x.dtype)  # nothing to read (and no modulo by a zero size)

    def loader(index):
        return x.loader([sympy.Integer(0) if s == 1 else Mod(i, s) for s, i in zip(x.size, index[lead:])])

    return TensorValue(tuple(sympy.sympify(s) for s in size), x.dtype, loader)
