"""Views as index maps: a view's loader reads its base at transformed indices, copying nothing."""

from __future__ import annotations

from typing import Sequence

import sympy
import torch

from kiln.ir.indexing import FloorDiv, Mod
from kiln.ir.nodes import Layout, contiguous_strides
from kiln.lowering.registry import register_lowering
from kiln.lowering.values import TensorValue

aten = torch.ops.aten


def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _view(x: TensorValue, size: Sequence[sympy.Expr], index_map, restride=None) -> TensorValue:
    """A view of `x`: reads `x` at `index_map(index)`. `restride(layout) -> (stride, offset)` gives
    the view's layout when `x` is a strided view of a buffer, so externs can take it uncopied."""
    size = tuple(sympy.sympify(s) for s in size)
    strided = None
    if x.strided is not None and restride is not None:
        base, layout = x.strided
        described = restride(layout)
        if described is not None:
            stride, offset = described
            strided = (base, Layout(size, tuple(sympy.sympify(s) for s in stride), layout.dtype, sympy.sympify(offset)))
    return TensorValue(size, x.dtype, lambda index: x.loader(index_map(list(index))), strided=strided)


@register_lowering(aten.permute.default)
def permute(x: TensorValue, dims: Sequence[int]) -> TensorValue:
    dims = [_dim(d, x.rank) for d in dims]
    inverse = [dims.index(d) for d in range(x.rank)]
    return _view(x, [x.size[d] for d in dims], lambda idx: [idx[inverse[d]] for d in range(x.rank)],
                 lambda lay: ([lay.stride[d] for d in dims], lay.offset))


@register_lowering(aten.expand.default)
def expand(x: TensorValue, size: Sequence[int]) -> TensorValue:
    lead = len(size) - x.rank
    full = [x.size[d - lead] if s == -1 else s for d, s in enumerate(size)]
    return _view(x, full, lambda idx: [sympy.Integer(0) if x.size[d] == 1 else idx[lead + d] for d in range(x.rank)],
                 lambda lay: ([0] * lead + [0 if x.size[d] == 1 and full[lead + d] != 1 else lay.stride[d] for d in range(x.rank)], lay.offset))


@register_lowering(aten.unsqueeze.default)
def unsqueeze(x: TensorValue, dim: int) -> TensorValue:
    dim = _dim(dim, x.rank + 1)
    return _view(x, [*x.size[:dim], 1, *x.size[dim:]], lambda idx: idx[:dim] + idx[dim + 1 :],
                 lambda lay: ([*lay.stride[:dim], 1, *lay.stride[dim:]], lay.offset))


@register_lowering(aten.squeeze.dims, aten.squeeze.dim)
def squeeze(x: TensorValue, dims: int | Sequence[int]) -> TensorValue:
    if x.rank == 0:
        return x  # a 0-d tensor squeezed at dim 0 or -1 is itself
    dims = {_dim(d, x.rank) for d in ([dims] if isinstance(dims, int) else dims) if x.size[_dim(d, x.rank)] == 1}
    kept = [d for d in range(x.rank) if d not in dims]

    def index_map(idx):
        it = iter(idx)
        return [sympy.Integer(0) if d in dims else next(it) for d in range(x.rank)]

    return _view(x, [x.size[d] for d in kept], index_map, lambda lay: ([lay.stride[d] for d in kept], lay.offset))


@register_lowering(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def view(x: TensorValue, size: Sequence[int]) -> TensorValue:
    numel = sympy.Mul(*x.size)
    known = sympy.Mul(*[s for s in size if s != -1])
    size = [FloorDiv(numel, known) if s == -1 else sympy.sympify(s) for s in size]
    if list(size) == list(x.size):
        return x
    out_strides, in_strides = contiguous_strides(size), contiguous_strides(x.size)

    def index_map(idx):
        if numel == 0:  # no element is ever read; and the unravelling below would divide by zero
            return [sympy.Integer(0)] * x.rank
        flat = sum((i * s for i, s in zip(idx, out_strides)), sympy.Integer(0))
        return [Mod(FloorDiv(flat, st), sz) if d else FloorDiv(flat, st) for d, (st, sz) in enumerate(zip(in_strides, x.size))]

    def restride(lay):
        if list(lay.stride) == list(in_strides):
            return out_strides, lay.offset
        stride = view_strides(lay.size, lay.stride, size)
        if stride is None:
            raise _NotStrided  # no strided view of this layout has that shape: a copy
        return stride, lay.offset

    return _view(x, size, index_map, _strided_or_none(restride))


def view_strides(size: Sequence[sympy.Expr], stride: Sequence[sympy.Expr],
                 shape: Sequence[sympy.Expr]) -> list[int] | None:
    """The strides of `shape` as a view of a layout of `size` and `stride` (static), or None where
    it has none. A view can only split or merge dimensions that lie in memory as one run (each
    one's stride the next one's times its size): a column slice [128, 512] of a [128, 1536]
    product viewed as [1, 128, 8, 64] splits the row's 512 into 8 x 64 and keeps the row stride,
    where a view to [65536] would need a copy. Dimensions of size 1 fit anywhere."""
    if not all(isinstance(v, (int, sympy.Integer)) for v in (*size, *stride, *shape)):
        return None
    size, stride, shape = [int(v) for v in size], [int(v) for v in stride], [int(v) for v in shape]
    if 0 in size:
        return [int(v) for v in contiguous_strides(shape)]
    # Runs of the layout's dimensions, innermost first: (elements, stride of its innermost).
    runs: list[tuple[int, int]] = []
    for extent, step in reversed([(e, st) for e, st in zip(size, stride) if e != 1]):
        if runs and step == runs[-1][0] * runs[-1][1]:
            runs[-1] = (runs[-1][0] * extent, runs[-1][1])
        else:
            runs.append((extent, step))
    out = [0] * len(shape)
    d = len(shape) - 1
    for elements, step in runs:
        covered = 1
        while d >= 0 and (covered < elements or shape[d] == 1):
            out[d] = covered * step
            covered *= shape[d]
            d -= 1
        if covered != elements:
            return None  # a dimension of `shape` straddles two runs
    while d >= 0:  # leading dimensions of size 1
        if shape[d] != 1:
            return None
        out[d] = 1
        d -= 1
    return out


class _NotStrided(Exception):
    pass


def _strided_or_none(restride):
    def attempt(lay):
        try:
            return restride(lay)
        except _NotStrided:
            return None

    return attempt


@register_lowering(aten.slice.Tensor)
def slice_(x: TensorValue, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1) -> TensorValue:
    dim = _dim(dim, x.rank)
    length = x.size[dim]
    # A negative bound counts from the end and stops at 0 (x[-5:] of 3 elements starts at 0).
    start = 0 if start is None else (sympy.Max(start + length, 0) if start < 0 else start)
    end = length if end is None else (sympy.Max(end + length, 0) if end < 0 else end)
    end = sympy.Min(end, length)
    start = sympy.Min(start, length)
    new = [*x.size[:dim], FloorDiv(sympy.Max(end - start + step - 1, 0), step), *x.size[dim + 1 :]]
    return _view(x, new, lambda idx: idx[:dim] + [start + idx[dim] * step] + idx[dim + 1 :],
                 lambda lay: ([*lay.stride[:dim], lay.stride[dim] * step, *lay.stride[dim + 1 :]], lay.offset + start * lay.stride[dim]))


@register_lowering(aten.select.int)
def select(x: TensorValue, dim: int, index: int) -> TensorValue:
    dim = _dim(dim, x.rank)
    index = index + x.size[dim] if index < 0 else index
    return _view(x, [*x.size[:dim], *x.size[dim + 1 :]], lambda idx: idx[:dim] + [sympy.sympify(index)] + idx[dim:],
                 lambda lay: ([*lay.stride[:dim], *lay.stride[dim + 1 :]], lay.offset + index * lay.stride[dim]))


@register_lowering(aten.alias.default, aten.clone.default, aten.lift_fresh_copy.default)
def alias(x: TensorValue, **kwargs) -> TensorValue:
    # A clone (or a lifted constant's copy) is a fresh buffer only once realized; as a value it
    # reads the same elements.
    return x


@register_lowering(aten.diagonal.default)
def diagonal(x: TensorValue, offset: int = 0, dim1: int = 0, dim2: int = 1) -> TensorValue:
    """The diagonal of dims (dim1, dim2) as a last dim: element k reads (k + row0, k + col0)."""
    dim1, dim2 = _dim(dim1, x.rank), _dim(dim2, x.rank)
    if dim1 == dim2:
        raise NotImplementedError("diagonal of a dim with itself")  # eager raises; so does the extern
    row0, col0 = max(-offset, 0), max(offset, 0)
    length = sympy.Max(sympy.Min(x.size[dim1] - row0, x.size[dim2] - col0), 0)
    kept = [d for d in range(x.rank) if d not in (dim1, dim2)]

    def index_map(idx):
        source = [sympy.Integer(0)] * x.rank
        for d, i in zip(kept, idx):
            source[d] = i
        source[dim1], source[dim2] = idx[-1] + row0, idx[-1] + col0
        return source

    def restride(lay):
        start = lay.offset + row0 * lay.stride[dim1] + col0 * lay.stride[dim2] if length != 0 else lay.offset
        return [lay.stride[d] for d in kept] + [lay.stride[dim1] + lay.stride[dim2]], start

    return _view(x, [x.size[d] for d in kept] + [length], index_map, restride)


@register_lowering(aten.unfold.default)
def unfold(x: TensorValue, dimension: int, size: int, step: int) -> TensorValue:
    """Windows of `size` elements every `step` along `dimension`, as a new last dim."""
    if x.rank == 0:
        return _view(x, [size], lambda idx: [], lambda lay: ([1], lay.offset))
    dim = _dim(dimension, x.rank)
    windows = FloorDiv(x.size[dim] - size, step) + 1
    return _view(x, [*x.size[:dim], windows, *x.size[dim + 1 :], size],
                 lambda idx: idx[:dim] + [idx[dim] * step + idx[-1]] + idx[dim + 1 : -1],
                 lambda lay: ([*lay.stride[:dim], lay.stride[dim] * step, *lay.stride[dim + 1 :], lay.stride[dim]], lay.offset))


# The *_copy variants return a new tensor with the view's values: the same value, realized only
# where something needs memory.
register_lowering(aten.view_copy.default)(view)
register_lowering(aten.permute_copy.default)(permute)
register_lowering(aten.expand_copy.default)(lambda x, size, *, implicit=False: expand(x, size))
register_lowering(aten.diagonal_copy.default)(diagonal)
register_lowering(aten.unfold_copy.default)(unfold)


@register_lowering(aten.narrow_copy.default, aten.narrow.default)
def narrow(x: TensorValue, dim: int, start: int, length: int) -> TensorValue:
    start = start + x.size[_dim(dim, x.rank)] if start < 0 else start
    return slice_(x, dim, start, start + length)


@register_lowering(aten.unbind_copy.int, aten.unbind.int)
def unbind(x: TensorValue, dim: int = 0) -> tuple[TensorValue, ...]:
    length = x.size[_dim(dim, x.rank)]
    if not length.is_Integer:
        raise NotImplementedError("unbind of a symbolic number of slices")
    return tuple(select(x, dim, k) for k in range(int(length)))
