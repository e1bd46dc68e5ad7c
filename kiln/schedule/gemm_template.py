"""Matrix products fused with the kernel that consumes them (Triton).

An `aten.mm` extern followed by a pointwise kernel that reads its result element for element (a
bias, an activation, a residual add, a cast) becomes one kernel: the product is computed tile by
tile inside it and the members read it from registers, so it is never written to memory and read
back. Only for code generators that print such kernels (Triton's, kiln/codegen/triton/kernel.py);
the C++ path fuses its GEMM epilogues in the GEMM externs instead (docs/gemm.md).

The product fuses when it is a float32, bfloat16 or float16 `mm` of static 2-D operands, its
result is contiguous, not a graph output, and read only by one kernel whose members are all
pointwise over exactly the product's elements and read it at the element they compute.
"""

from __future__ import annotations

import math

import sympy
import torch
from torch.utils import _pytree as pytree

from kiln.ir.nodes import Buffer, Layout
from kiln.ir.program import ExternStep
from kiln.ir.schedule import FusedKernel, GemmTemplate

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _readers(steps: list) -> dict[str, set[int]]:
    readers: dict[str, set[int]] = {}
    for k, step in enumerate(steps):
        if isinstance(step, ExternStep):
            names = [b.name for b in pytree.tree_leaves((step.args, step.kwargs)) if isinstance(b, Buffer)]
        else:
            names = [name for m in step.members for name, _ in m.reads]
        for name in names:
            readers.setdefault(name, set()).add(k)
    return readers


def _product(step) -> tuple[Buffer, Buffer, Buffer] | None:
    """(a, b, result) of a matrix product the template computes, else None."""
    if not isinstance(step, ExternStep) or step.op is not torch.ops.aten.mm.default or len(step.outputs) != 1:
        return None
    a, b = step.args[:2]
    result = step.outputs[0]
    if not all(isinstance(t, Buffer) and t.layout.is_static and len(t.layout.size) == 2 for t in (a, b, result)):
        return None
    if not (a.layout.dtype == b.layout.dtype == result.layout.dtype and a.layout.dtype in _DTYPES):
        return None
    if result.layout != Layout.contiguous(result.layout.size, result.layout.dtype) or 0 in result.layout.size:
        return None
    return a, b, result


def _reads_element_for_element(kernel: FusedKernel, name: str, numel: int) -> bool:
    if kernel.is_scatter or kernel.gemm is not None or not kernel.vectorizes_outer:
        return False
    sizes = [int(s) for s in kernel.outer]
    if math.prod(sizes) != numel:
        return False
    outer = [sympy.Symbol(f"i{d}", integer=True, nonnegative=True) for d in range(len(sizes))]
    flat = Layout.contiguous(sizes, torch.float32).flat_index(outer)
    return all(sympy.expand(index - flat) == 0 for m in kernel.members for n, index in m.reads if n == name)


def gemm_templates(steps: list, outputs: list) -> list:
    """`steps` with each fusable product moved into the kernel that consumes it."""
    results = {o.name for o in outputs if isinstance(o, Buffer)}
    readers = _readers(steps)
    fused: set[int] = set()
    for k, step in enumerate(steps):
        found = _product(step)
        if found is None:
            continue
        a, b, product = found
        users = readers.get(product.name, set())
        if product.name in results or len(users) != 1:
            continue
        (j,) = users
        kernel = steps[j]
        if not isinstance(kernel, FusedKernel) or not _reads_element_for_element(kernel, product.name, math.prod(int(s) for s in product.layout.size)):
            continue
        kernel.gemm = GemmTemplate(a, b, product)
        rest = [x for x in kernel.inputs if x.name not in (product.name, a.name, b.name)]
        kernel.inputs = [a] + ([b] if b.name != a.name else []) + rest
        fused.add(k)
    return [s for k, s in enumerate(steps) if k not in fused]
