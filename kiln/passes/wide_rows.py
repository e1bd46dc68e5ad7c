"""`mm(a, b)` -> `kiln::mm_wide_rows(a, b, row_stride)` where the product's rows would start at
addresses cuBLAS cannot load in wide vectors (kiln/externs/wide_rows.py says why and what it costs).

A GPU product of 16-bit or float32 values whose N columns do not fill whole 16-byte lines (N not a
multiple of 8 in bfloat16) is written into rows rounded up to 16 bytes; what reads it reads the
strided view. N below `MIN_COLUMNS` is left alone: such products are small, and a classifier's few
columns may rather join their epilogue's kernel (kiln/schedule/gemm_template.py), which only
`aten.mm` does.

The views between the product and the graph's outputs take the strided layout too, so a returned
product (a language model's logits) is not copied to eager's contiguous layout: its rows stay
`row_stride` apart, as Inductor returns its padded products. Where a view cannot be expressed over
the wider rows, its value keeps eager's layout (the lowering then copies, as for any output).

It rewrites graphs for code generators whose traits ask for it (`wide_product_rows`): Triton's,
on GPU graphs and on the CPU graphs of `KILN_CODEGEN=triton` (its kernels under Triton's
interpreter: how CI runs it end to end).
"""

from __future__ import annotations

import torch
from torch import fx

from kiln.externs.wide_rows import MM_WIDE_ROWS
from kiln.ir.target import Target
from kiln.passes.fake_values import refresh_meta
from kiln.passes.pattern import insert

aten = torch.ops.aten
MIN_COLUMNS = 256
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default,
          aten.squeeze.dim, aten.squeeze.dims, aten.slice.Tensor, aten.select.int)


def _row_stride(val) -> int | None:
    """The row stride a product with fake value `val` gets, or None when it keeps its own."""
    if not isinstance(val, torch.Tensor) or val.dim() != 2 or val.dtype not in _DTYPES:
        return None
    if any(isinstance(s, torch.SymInt) for s in val.shape):
        return None
    n, per_line = int(val.shape[1]), 16 // val.element_size()
    if n < MIN_COLUMNS or n % per_line == 0:
        return None
    return -(-n // per_line) * per_line


def _follow_views(node: fx.Node) -> None:
    """Recompute the fake values of the views read from `node`, through views, outputs included."""
    for user in node.users:
        if user.op != "call_function" or user.target not in _VIEWS:
            continue
        args = [a.meta["val"] if isinstance(a, fx.Node) else a for a in user.args]
        try:
            with node.meta["val"].fake_mode:
                user.meta["val"] = user.target(*args, **user.kwargs)
        except (RuntimeError, ValueError):  # no view of the wider rows: eager's layout stays
            continue
        _follow_views(user)


def wide_rows(gm: fx.GraphModule, target: Target) -> bool:
    if not target.codegen.wide_product_rows:
        return False
    changed = []
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.mm.default or node.kwargs:
            continue
        row_stride = _row_stride(node.meta.get("val"))
        if row_stride is None:
            continue
        wide = insert(gm, node, MM_WIDE_ROWS, *node.args, row_stride)
        node.replace_all_uses_with(wide)
        gm.graph.erase_node(node)
        changed.append(wide)
    if changed:
        refresh_meta(gm)  # (the values the graph returns keep eager's layout there: redone below)
        for wide in changed:
            _follow_views(wide)
    return bool(changed)
