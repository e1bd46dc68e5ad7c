"""Indexing by integer tensors: each read goes through `ops.indirect_indexing`, which flags
out-of-range indices (the C++ wrapper raises IndexError, as eager does). Negative indices count
from the end in `x[i]` (index.Tensor) and are out of range in embedding, index_select and gather."""

from __future__ import annotations

from typing import Sequence

import sympy
import torch

from kiln.ir.ops import ops
from kiln.lowering.registry import register_lowering
from kiln.lowering.values import TensorValue, broadcast_sizes, broadcast_to

aten = torch.ops.aten


def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def require_integer_index(index: TensorValue) -> None:
    if index.dtype in (torch.bool, torch.uint8) or index.dtype.is_floating_point:
        raise NotImplementedError(f"indexing with a {index.dtype} tensor (masks have data-dependent sizes)")


def unwrapped_index(value, size):
    """An index symbol for `value` where, unlike `x[i]`, a negative value is out of range (embedding,
    index_select and gather raise for it): negatives are sent to `size`, which gets flagged."""
    value = ops.to_dtype(value, torch.int64)
    negative = ops.lt(value, ops.constant(0, torch.int64))
    return ops.indirect_indexing(ops.where(negative, ops.index_expr(size, torch.int64), value), size)


@register_lowering(aten.embedding.default)
def embedding(weight: TensorValue, indices: TensorValue, padding_idx: int = -1, scale_grad_by_freq: bool = False,
              sparse: bool = False) -> TensorValue:
    if weight.rank != 2:
        raise NotImplementedError("embedding of a weight that is not 2-D")
    require_integer_index(indices)

    def loader(index):
        row = unwrapped_index(indices.loader(index[:-1]), weight.size[0])
        return weight.loader([row, index[-1]])

    return TensorValue((*indices.size, weight.size[1]), weight.dtype, loader)


@register_lowering(aten.index_select.default)
def index_select(x: TensorValue, dim: int, index: TensorValue) -> TensorValue:
    require_integer_index(index)
    if x.rank == 0:
        def only_element(idx):
            unwrapped_index(index.loader([sympy.Integer(0)] * index.rank), 1)  # flags an index other than 0
            return x.loader([])

        return TensorValue((), x.dtype, only_element)
    dim = _dim(dim, x.rank)
    length = index.size[0] if index.rank else 1

    def loader(idx):
        idx = list(idx)
        idx[dim] = unwrapped_index(index.loader(idx[dim : dim + 1] if index.rank else []), x.size[dim])
        return x.loader(idx)

    return TensorValue((*x.size[:dim], length, *x.size[dim + 1 :]), x.dtype, loader)


@register_lowering(aten.gather.default)
def gather(x: TensorValue, dim: int, index: TensorValue, *, sparse_grad: bool = False) -> TensorValue:
    if 0 in index.size:  # nothing read (eager skips its checks too)
        return TensorValue(index.size, x.dtype, lambda idx: ops.constant(0, x.dtype))
    require_integer_index(index)
    if x.rank == 0 and index.rank <= 1:  # the one element, for each (checked) index
        def only_element(idx):
            unwrapped_index(index.loader(idx), 1)
            return x.loader([])

        return TensorValue(index.size, x.dtype, only_element)
    if index.rank != x.rank:
        raise NotImplementedError("gather with an index of another rank than the input")
    dim = _dim(dim, x.rank)

    def loader(idx):
        idx = list(idx)
        idx[dim] = unwrapped_index(index.loader(idx), x.size[dim])
        return x.loader(idx)

    return TensorValue(index.size, x.dtype, loader)


def indexed_positions(x: TensorValue, indices: Sequence[TensorValue | None]):
    """`x[..., i, ..., j, ...]` with integer index tensors (None keeps a dim): (the result's size,
    `position(index)`: the element of `x` a result index reads, as one index expression per dim of
    `x`). The index tensors broadcast together to one block of dims, which stands where they stood
    if they are adjacent, else in front (NumPy's rule). Negative indices count from the end."""
    indices = list(indices) + [None] * (x.rank - len(indices))
    indexed = [d for d, t in enumerate(indices) if t is not None]
    for d in indexed:
        require_integer_index(indices[d])
    block = broadcast_sizes(*(indices[d].size for d in indexed))
    readers = {d: broadcast_to(indices[d], block) for d in indexed}
    kept = [d for d in range(x.rank) if indices[d] is None]
    adjacent = indexed == list(range(indexed[0], indexed[-1] + 1))
    lead = len([d for d in kept if d < indexed[0]]) if adjacent else 0

    def position(idx):
        idx = list(idx)
        block_index = idx[lead : lead + len(block)]
        rest = iter(idx[:lead] + idx[lead + len(block) :])
        return [
            next(rest) if indices[d] is None else ops.indirect_indexing(readers[d].loader(block_index), x.size[d])
            for d in range(x.rank)
        ]

    size = [x.size[d] for d in kept]
    return tuple(size[:lead] + list(block) + size[lead:]), position


@register_lowering(aten.index.Tensor)
def index(x: TensorValue, indices: Sequence[TensorValue | None]) -> TensorValue:
    """`x[..., i, ..., j, ...]` as an indirect load (see `indexed_positions`)."""
    if all(t is None for t in indices):
        return x
    size, position = indexed_positions(x, indices)
    return TensorValue(size, x.dtype, lambda idx: x.loader(position(idx)))
