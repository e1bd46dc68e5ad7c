"""Writes at computed positions: index_put, scatter, scatter_add, scatter_reduce, index_reduce, put.

Each is a `Scatter` node (kiln/ir/nodes.py): a copy of the base (or an initial fill) into a new
buffer, then one write per source element at its target, overwriting or combining (sum, prod,
max, min) with what is there. The base's and the values' loaders are inlined into the node, so
`full(0)` followed by an accumulating index_put (an embedding's backward) is one kernel.

Index rules follow eager: index_put and put count negative indices from the end (`x[i]`);
scatter-style ops and index_reduce treat them as out of range. Out-of-range indices set kiln's
index-error flag, and the wrapper raises IndexError.

`mean` is a sum divided by a count (a second scatter, of ones); `include_self=False` starts the
touched positions (count > 0) from the reduction's identity instead of the base's value.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import sympy
import torch

from kiln.ir.nodes import Scatter
from kiln.ir.ops import ops
from kiln.lowering import views
from kiln.lowering.context import realize_node
from kiln.lowering.indexing import require_integer_index, unwrapped_index, indexed_positions
from kiln.lowering.registry import register_lowering
from kiln.lowering.values import TensorValue, as_dtype, broadcast_sizes, broadcast_to

aten = torch.ops.aten

# Eager's reduce names -> the node's combine modes.
_MODES = {"sum": "sum", "add": "sum", "mean": "sum", "prod": "prod", "multiply": "prod", "amax": "max", "amin": "min"}
Targets = Callable[[Sequence[sympy.Expr]], list[Any]]  # source index -> target index
TargetValue = Callable[[Sequence[sympy.Expr]], tuple[list[Any], Any]]  # ... and the value written there


def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _bool_mode(mode: str | None) -> str | None:
    """Booleans combine by or (a sum) and and (a product): max and min of 0 and 1."""
    return {"sum": "max", "prod": "min"}.get(mode, mode)


def scatter_into(base: TensorValue, source_size: Sequence[sympy.Expr], target_value: TargetValue,
                 mode: str | None, init: TensorValue | None = None) -> TensorValue:
    """A new buffer holding `init` (default: `base`), with each source element's value written or
    combined at its target."""
    if base.dtype == torch.bool:
        mode = _bool_mode(mode)
    init = as_dtype(init or base, base.dtype)
    node = Scatter(base.dtype, base.size, init.loader, tuple(source_size), target_value, mode)
    return realize_node(node)


def _values_at(values: TensorValue, size: Sequence[sympy.Expr], dtype: torch.dtype) -> TensorValue:
    """`values` broadcast to `size` (leading size-1 dims beyond its rank dropped), in `dtype`."""
    extra = values.rank - len(size)
    if extra > 0:
        if any(s != 1 for s in values.size[:extra]):
            raise NotImplementedError(f"values of size {list(values.size)} do not broadcast to {list(size)}")
        values = views.squeeze(values, list(range(extra)))
    broadcast_sizes(values.size, size)  # raises when they do not broadcast
    return as_dtype(broadcast_to(values, size), dtype)


# -- index_put ---------------------------------------------------------------------------------
@register_lowering(aten.index_put.default)
def index_put(x: TensorValue, indices: Sequence[TensorValue | None], values: TensorValue,
              accumulate: bool = False) -> TensorValue:
    """`x[indices] = values` (or `+=` with accumulate, every duplicate index counting)."""
    indices = list(indices)
    if all(t is None for t in indices):
        return _put_everywhere(x, values, accumulate)
    masks = [t for t in indices if t is not None and t.dtype in (torch.bool, torch.uint8)]
    if masks:
        return _masked_put(x, indices, values, accumulate)
    size, position = indexed_positions(x, indices)
    source = _values_at(values, size, x.dtype)
    return scatter_into(x, size, lambda idx: (position(idx), source.loader(idx)), "sum" if accumulate else None)


def _put_everywhere(x: TensorValue, values: TensorValue, accumulate: bool) -> TensorValue:
    source = _values_at(values, x.size, x.dtype)
    if not accumulate:
        return source
    return TensorValue(x.size, x.dtype, lambda idx: _add(x.dtype, x.loader(idx), source.loader(idx)))


def _add(dtype: torch.dtype, a: Any, b: Any) -> Any:
    if dtype == torch.bool:
        return ops.logical_or(a, b)
    return ops.add(a, b)


def _masked_put(x: TensorValue, indices: list, values: TensorValue, accumulate: bool) -> TensorValue:
    """`x[mask] = v` for one boolean mask over consecutive dims `d..d+m` and values that are the
    same for every selected element (`x[mask] = 0`, or one row for all selected rows):
    `where(mask, v, x)`, pointwise. Values given per selected element would need the selected
    positions counted (a data-dependent size): those stay an ATen call."""
    indexed = [d for d, t in enumerate(indices) if t is not None]
    if len(indexed) != 1:
        raise NotImplementedError("index_put with a boolean mask beside other index tensors")
    d = indexed[0]
    mask = indices[d]
    if list(mask.size) != list(x.size[d : d + mask.rank]):
        raise NotImplementedError("index_put with a boolean mask of another size than the dims it covers")
    lead, trailing = list(x.size[:d]), list(x.size[d + mask.rank :])
    selected_dim = values.rank - len(trailing) - 1  # where the count of selected elements stands
    if selected_dim >= 0 and values.size[selected_dim] != 1:
        raise NotImplementedError("index_put with a boolean mask and values for each selected element")
    value = _values_at(values, [*lead, 1, *trailing], x.dtype)

    def loader(idx):
        selected = ops.to_dtype(mask.loader(list(idx[d : d + mask.rank])), torch.bool)
        new = value.loader([*idx[:d], sympy.Integer(0), *idx[d + mask.rank :]])
        if accumulate:
            new = _add(x.dtype, x.loader(idx), new)
        return ops.where(selected, new, x.loader(idx))

    return TensorValue(x.size, x.dtype, loader)


# -- scatter-style ops: index has the source's rank, its value replaces one dim ----------------
def _along(x: TensorValue, dim: int, index: TensorValue) -> tuple[tuple, Targets]:
    """(source size, target of each source index) for scatter's `x[..., index[i], ...] = src[i]`.
    An empty index scatters nothing: callers return `x` (eager checks nothing else either)."""
    require_integer_index(index)
    if x.rank == 0 and index.rank <= 1:  # the one element; each index must still be 0
        return index.size, lambda idx: _checked_scalar_target(index.loader(idx))
    if index.rank != x.rank:
        raise NotImplementedError("scatter with an index of another rank than self")
    dim = _dim(dim, x.rank)

    def target_of(idx):
        target = list(idx)
        target[dim] = unwrapped_index(index.loader(idx), x.size[dim])
        return target

    return index.size, target_of


def _checked_scalar_target(value: Any) -> list:
    unwrapped_index(value, 1)  # flags a bad index; the target is the only element
    return []


def _values(src: Any, dtype: torch.dtype) -> Callable:
    """The value written for a source index: src's element there (a 0-d src, beside a 1-d index
    into a 0-d self, at []), or a Python scalar."""
    if not isinstance(src, TensorValue):
        return lambda idx: ops.constant(src, dtype)
    src = as_dtype(src, dtype)
    return lambda idx: src.loader(list(idx)[len(idx) - src.rank :] if src.rank else [])


def _paired(target_of: Targets, value_at: Callable) -> TargetValue:
    return lambda idx: (target_of(idx), value_at(idx))


@register_lowering(aten.scatter.src, aten.scatter.value)
def scatter(x: TensorValue, dim: int, index: TensorValue, src: Any) -> TensorValue:
    if 0 in index.size:
        return x
    size, target_of = _along(x, dim, index)
    return scatter_into(x, size, _paired(target_of, _values(src, x.dtype)), None)


@register_lowering(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce_old(x: TensorValue, dim: int, index: TensorValue, src: Any, *, reduce: str) -> TensorValue:
    if 0 in index.size:
        return x
    size, target_of = _along(x, dim, index)
    return scatter_into(x, size, _paired(target_of, _values(src, x.dtype)), _MODES[reduce])


@register_lowering(aten.scatter_add.default)
def scatter_add(x: TensorValue, dim: int, index: TensorValue, src: TensorValue) -> TensorValue:
    if 0 in index.size:
        return x
    size, target_of = _along(x, dim, index)
    return scatter_into(x, size, _paired(target_of, _values(src, x.dtype)), "sum")


@register_lowering(aten.scatter_reduce.two)
def scatter_reduce(x: TensorValue, dim: int, index: TensorValue, src: TensorValue, reduce: str, *,
                   include_self: bool = True) -> TensorValue:
    if 0 in index.size:
        return x
    size, target_of = _along(x, dim, index)
    return reduce_into(x, size, target_of, _values(src, x.dtype), reduce, include_self)


@register_lowering(aten.index_reduce.default)
def index_reduce(x: TensorValue, dim: int, index: TensorValue, source: TensorValue, reduce: str, *,
                 include_self: bool = True) -> TensorValue:
    if 0 in index.size:
        return x
    """Slices of `source` along `dim` reduced into the slices of `x` that `index` names."""
    if index.rank > 1 or source.rank != x.rank:
        raise NotImplementedError("index_reduce with an index of more than one dim")
    require_integer_index(index)
    if x.rank == 0:  # as a tensor of one element
        one = views.view(x, [1])
        result = index_reduce(one, 0, index, views.view(source, [1]), reduce, include_self=include_self)
        return views.view(result, [])
    dim = _dim(dim, x.rank)

    def target_of(idx):
        target = list(idx)
        target[dim] = unwrapped_index(index.loader(idx[dim : dim + 1] if index.rank else []), x.size[dim])
        return target

    return reduce_into(x, source.size, target_of, _values(source, x.dtype), reduce, include_self)


def _identity(mode: str, dtype: torch.dtype) -> Any:
    if mode == "sum":
        return 0
    if mode == "prod":
        return 1
    if dtype.is_floating_point:
        return float("-inf") if mode == "max" else float("inf")
    info = torch.iinfo(dtype)
    return info.min if mode == "max" else info.max


def reduce_into(x: TensorValue, size: Sequence[sympy.Expr], target_of: Targets, value_at: Callable, reduce: str,
                include_self: bool) -> TensorValue:
    """scatter_reduce / index_reduce: combine every source element into its target; with
    `include_self=False` targets that receive any element start from the identity; `mean`
    divides by the count of elements (plus one for self), as eager does (floor for integers)."""
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
        raise NotImplementedError(f"scatter reduce {reduce!r}")
    if x.dtype == torch.bool:
        raise NotImplementedError("scatter_reduce of booleans")
    mode = _MODES[reduce]
    if include_self and reduce != "mean":
        return scatter_into(x, size, _paired(target_of, value_at), mode)
    count_dtype = x.dtype if x.dtype.is_floating_point else torch.int64
    ones = TensorValue(x.size, count_dtype, lambda idx: ops.constant(1 if include_self else 0, count_dtype))
    counts = scatter_into(ones, size, _paired(target_of, lambda idx: ops.constant(1, count_dtype)), "sum")
    init = x
    if not include_self:
        identity = _identity(mode, x.dtype)

        def init_loader(idx):
            touched = ops.gt(counts.loader(idx), ops.constant(0, count_dtype))
            return ops.where(touched, ops.constant(identity, x.dtype), x.loader(idx))

        init = TensorValue(x.size, x.dtype, init_loader)
    total = scatter_into(x, size, _paired(target_of, value_at), mode, init)
    if reduce != "mean":
        return total
    mean = lambda idx: _divide_by_count(total.loader(idx), counts.loader(idx), x.dtype, count_dtype)  # noqa: E731
    return TensorValue(x.size, x.dtype, mean)


def _divide_by_count(total: Any, count: Any, dtype: torch.dtype, count_dtype: torch.dtype) -> Any:
    # Untouched positions (count 0, include_self=False) hold self: divided by 1.
    count = ops.maximum(count, ops.constant(1, count_dtype))
    if dtype.is_floating_point:
        return ops.truediv(total, count)
    return ops.to_dtype(ops.floordiv(ops.to_dtype(total, torch.int64), count), dtype)


# -- put: flat indices into the tensor read in row-major order ---------------------------------
@register_lowering(aten.put.default)
def put(x: TensorValue, index: TensorValue, source: TensorValue, accumulate: bool = False) -> TensorValue:
    require_integer_index(index)
    numel = sympy.Mul(*x.size)
    flat = views.view(x, [numel])
    values = _values(views.view(source, list(index.size)), x.dtype)

    def target_value(idx):
        return [ops.indirect_indexing(index.loader(idx), numel)], values(idx)

    result = scatter_into(flat, index.size, target_value, "sum" if accumulate else None)
    return views.view(result, list(x.size))
