"""`kiln::mm_wide_rows(a, b, row_stride) -> Tensor`: the product `a @ b` written into rows
`row_stride` elements apart, the columns past `b.shape[1]` left unused.

cuBLAS chooses its kernels by the alignment of the matrices' addresses and leading dimensions. A
product whose output rows are N 16-bit values apart, N not a multiple of 8 (GPT-2's language-model
head: N = 50257), gets a kernel that moves one element at a time: on an H200 at batch 8 x 128 in
bfloat16, 845 µs of GPU time where Inductor's padded product took 155 (kiln's GPT-2 call 1.28x
Inductor's; benchmarks/tools/gpu_profile.py, 2026-12-04). Rows a multiple of 16 bytes apart give
cuBLAS its aligned kernels, and ATen's `mm(out=)` hands such a strided output to cuBLAS as it is
(the row stride its leading dimension): no copy of the weight (Inductor pads it at every call) and
none of the result. The result is a strided view of the wider memory, and the graph returns it so
(`kiln/passes/wide_rows.py`).

Its Python function is what compiled graphs call (`PYTHON_OPS`, without the dispatcher); the
operator exists for the graph and its fake values.
"""

from __future__ import annotations

import torch

_lib = torch.library.Library("kiln", "FRAGMENT")
_lib.define("mm_wide_rows(Tensor a, Tensor b, int row_stride) -> Tensor")


def mm_wide_rows(a: torch.Tensor, b: torch.Tensor, row_stride: int) -> torch.Tensor:
    out = torch.empty_strided((a.shape[0], b.shape[1]), (row_stride, 1), dtype=a.dtype, device=a.device)
    return torch.mm(a, b, out=out)


def _mm_wide_rows_fake(a: torch.Tensor, b: torch.Tensor, row_stride: int) -> torch.Tensor:
    return torch.empty_strided((a.shape[0], b.shape[1]), (row_stride, 1), dtype=a.dtype, device=a.device)


_lib.impl("mm_wide_rows", mm_wide_rows, "CompositeExplicitAutograd")
torch.library.register_fake("kiln::mm_wide_rows", _mm_wide_rows_fake, lib=_lib)

MM_WIDE_ROWS = torch.ops.kiln.mm_wide_rows.default
# kiln's operators written in Python, by name in the kiln namespace: compiled graphs call these
# functions directly (kiln/runtime/compiled_graph.py `_resolve_op`; ~5 µs less than the dispatcher).
PYTHON_OPS = {"mm_wide_rows": mm_wide_rows}
