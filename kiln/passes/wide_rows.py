"""`mm(a, b)` -> `slice(mm(a, pad(b)), 1, 0, N)` where the product's N columns would not fill whole
16-byte lines: cuBLAS then runs its aligned kernels instead of its one-element ones.

cuBLAS (its CUTLASS kernels) vectorizes a product's loads and stores along N only where N itself
is a multiple of the vector (8 elements in bfloat16 and float16, 4 in float32), not only where the
rows start 16 bytes apart. GPT-2's language-model head (N = 50257) ran in
`cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1` on an H200: 845 µs of kiln's 1.65 ms
GPT-2 call where Inductor's padded product took 155 (benchmarks/tools/gpu_profile.py, 2026-12-04);
giving the product rows 50264 apart alone (`mm(out=)` on a strided view) kept that kernel
(tests/gpu, 2026-12-04 18:00). So `b` (K x N) gets N' - N columns of zeros, in its own layout (a
Linear's transposed weight stays transposed), the product is M x N', and its first N columns are
a view of it: what reads the product reads rows N' apart. Padded, GPT-2's head runs in 121 µs, in
the same cuBLAS kernel as Inductor's (docs/results/gpu-h200-2026-12-04-gpt2-profile-padded.txt).

A frozen `b` (an inference graph's weight) is padded once, in the constants graph
(kiln/runtime/frozen.py). Any other `b` (a weight the graph takes as an input: training, or
freezing off) costs a copy of it at every call, so it is padded only where the product has at
least `MIN_ROWS_PADDED_PER_CALL` rows. Measured on the H200 (benchmarks/tools/ragged_product.py,
bf16, K = 768, N = 50257, µs per product as it is / padded at the call / padded once): 1 row
31 / 94 / 24, 8 rows 108 / 94 / 24, 64 rows 157 / 94 / 27, 1024 rows 835 / 188 / 121.

N below `MIN_COLUMNS` is left alone: such products are small, and a classifier's few columns may
rather join their epilogue's kernel (kiln/schedule/gemm_template.py), which only `aten.mm` does.

The views between the product and the graph's outputs take the wide rows too, so a returned
product (a language model's logits) is not copied to eager's contiguous layout: its rows stay N'
apart, as Inductor returns its padded products. Where a view cannot be expressed over the wider
rows, its value keeps eager's layout (the lowering then copies, as for any output).

It rewrites graphs for code generators whose traits ask for it (`wide_product_rows`): Triton's,
on GPU graphs and on the CPU graphs of `KILN_CODEGEN=triton` (its kernels under Triton's
interpreter: how CI runs it end to end).
"""

from __future__ import annotations

import torch
from torch import fx

from kiln.ir.target import Target
from kiln.passes.constants import ConstantSet, has_frozen_inputs
from kiln.passes.fake_values import refresh_meta
from kiln.passes.pattern import insert

aten = torch.ops.aten
MIN_COLUMNS = 256
MIN_ROWS_PADDED_PER_CALL = 8  # (measured: the module docstring)
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.unsqueeze.default,
          aten.squeeze.dim, aten.squeeze.dims, aten.slice.Tensor, aten.select.int)


def _wide_columns(val) -> int | None:
    """N rounded up to whole 16-byte lines for a product with fake value `val`, or None where it
    keeps its N."""
    if not isinstance(val, torch.Tensor) or val.dim() != 2 or val.dtype not in _DTYPES:
        return None
    if any(isinstance(s, torch.SymInt) for s in val.shape):
        return None
    n, per_line = int(val.shape[1]), 16 // val.element_size()
    if n < MIN_COLUMNS or n % per_line == 0:
        return None
    return -(-n // per_line) * per_line


def _padded(gm: fx.GraphModule, mm: fx.Node, b: fx.Node, columns: int) -> fx.Node:
    """`b` (K x N) with zero columns up to `columns`, in `b`'s own layout: a transposed weight (K
    contiguous) is padded as the N x K matrix it is and transposed back."""
    val = b.meta["val"]
    pad = columns - int(val.shape[1])
    if val.stride(0) == 1 and val.stride(1) != 1:
        rows = insert(gm, mm, aten.permute.default, b, [1, 0])
        padded = insert(gm, mm, aten.constant_pad_nd.default, rows, [0, 0, 0, pad])
        return insert(gm, mm, aten.permute.default, padded, [1, 0])
    return insert(gm, mm, aten.constant_pad_nd.default, b, [0, pad])


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
    constants = ConstantSet(gm) if has_frozen_inputs(gm) else ConstantSet.empty()
    changed = []
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.mm.default or node.kwargs:
            continue
        val = node.meta.get("val")
        columns = _wide_columns(val)
        a, b = node.args
        if columns is None or (b not in constants and int(val.shape[0]) < MIN_ROWS_PADDED_PER_CALL):
            continue
        wide = insert(gm, node, aten.mm.default, a, _padded(gm, node, b, columns))
        narrow = insert(gm, node, aten.slice.Tensor, wide, 1, 0, int(val.shape[1]))
        node.replace_all_uses_with(narrow)
        gm.graph.erase_node(node)
        changed.append(narrow)
    if changed:
        refresh_meta(gm)  # (the values the graph returns keep eager's layout there: redone below)
        for narrow in changed:
            _follow_views(narrow)
    return bool(changed)
