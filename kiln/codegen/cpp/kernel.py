"""One C++ function per loop-IR node: nested loops, the outer one OpenMP-parallel when the work
is large enough, the body printed by `CppPrinter`. All kernels of a program share one source file."""

from __future__ import annotations

import math

import sympy
import torch

from kiln.codegen.cpp.printer import CTYPES, CppPrinter, cpp_constant, cpp_index
from kiln.ir.analysis import ReadsWrites, run
from kiln.ir.nodes import Buffer, Layout, Node, Reduction
from kiln.ir.ops import use_handler

PARALLEL_MIN_WORK = 32768  # elements (times reduction length) below which threads cost more than they save

HEADER = r"""
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
template <typename T> static inline T kiln_max(T a, T b) { if (a != a) return a; if (b != b) return b; return a > b ? a : b; }
template <typename T> static inline T kiln_min(T a, T b) { if (a != a) return a; if (b != b) return b; return a < b ? a : b; }
extern "C" { int kiln_index_error = 0; }
static inline int64_t kiln_index(int64_t i, int64_t size) {
  if (i < 0) i += size;
  if (i < 0 || i >= size) { kiln_index_error = 1; return i < 0 ? 0 : size - 1; }
  return i;
}
template <typename T> static inline bool kiln_gt(T a, T b) { return a > b || (a != a && b == b); }
template <typename T> static inline bool kiln_lt(T a, T b) { return a < b || (a != a && b == b); }
template <typename T> static inline T kiln_floordiv(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) { return std::floor(a / b); }
  else { T q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) --q; return q; }
}
template <typename T> static inline T kiln_remainder(T a, T b) {
  if constexpr (std::is_floating_point<T>::value) { T r = std::fmod(a, b); if (r != 0 && ((r < 0) != (b < 0))) r += b; return r; }
  else { T r = a % b; if (r != 0 && ((r < 0) != (b < 0))) r += b; return r; }
}
"""


def _init(kind: str, dtype: torch.dtype) -> str:
    ctype = CTYPES[dtype]
    if kind in ("argmax", "argmin"):
        kind = kind[3:]
    if kind in ("max", "min"):
        if dtype.is_floating_point:
            return f"{'-' if kind == 'max' else ''}std::numeric_limits<{ctype}>::infinity()"
        return f"std::numeric_limits<{ctype}>::{'lowest' if kind == 'max' else 'max'}()"
    return cpp_constant({"sum": 0, "prod": 1, "any": False, "all": True}[kind], dtype)


_COMBINE = {"sum": "acc + {v}", "prod": "acc * {v}", "max": "kiln_max(acc, {v})", "min": "kiln_min(acc, {v})",
            "any": "acc || {v}", "all": "acc && {v}"}


def _loops(symbols, sizes, indent: str) -> tuple[list[str], str]:
    lines = []
    for sym, size in zip(symbols, sizes):
        lines.append(f"{indent}for (int64_t {sym} = 0; {sym} < {cpp_index(size)}; ++{sym}) {{")
        indent += "  "
    return lines, indent


def kernel_source(name: str, node: Node, out: Buffer, inputs: list[Buffer]) -> str:
    """`extern "C" void name(const T* in..., T* out)` computing `node` into `out`'s layout."""
    pointers = {b.name: f"in{k}" for k, b in enumerate(inputs)}
    params = [f"const {CTYPES[b.layout.dtype]}* __restrict__ in{k}" for k, b in enumerate(inputs)]
    params.append(f"{CTYPES[out.layout.dtype]}* __restrict__ out")
    printer = CppPrinter(pointers, {b.name: b.layout.offset for b in inputs})
    with use_handler(printer):
        result = node.body()
    index_vars = node.index_vars()
    out_index = cpp_index(out.layout.flat_index(index_vars) - out.layout.offset)
    sizes = [int(s) for s in node.ranges]
    work = math.prod(sizes) * (math.prod(int(s) for s in node.reduction_ranges) if isinstance(node, Reduction) else 1)
    lines = [f'extern "C" void {name}({", ".join(params)}) {{']
    if sizes and work >= PARALLEL_MIN_WORK and sizes[0] > 1:
        lines.append("  #pragma omp parallel for")
    loop_lines, indent = _loops(index_vars, sizes, "  ")
    lines += loop_lines
    ctype = CTYPES[out.layout.dtype]
    if isinstance(node, Reduction):
        kind, dtype, value = printer.reduced
        rsizes = [int(s) for s in node.reduction_ranges]
        arg = kind in ("argmax", "argmin")
        acc_dtype = node.src_dtype if arg else dtype
        lines.append(f"{indent}{CTYPES[acc_dtype]} acc = {_init(kind, acc_dtype)};")
        if arg:
            lines.append(f"{indent}int64_t acc_index = 0;")
        rloops, rindent = _loops(node.reduction_vars(), rsizes, indent)
        lines += rloops + [f"{rindent}{line}" for line in printer.lines]
        if arg:
            rflat = cpp_index(Layout.contiguous(rsizes, dtype).flat_index(node.reduction_vars()))
            better = "kiln_gt" if kind == "argmax" else "kiln_lt"
            lines.append(f"{rindent}if ({better}({value}, acc)) {{ acc = {value}; acc_index = {rflat}; }}")
        else:
            lines.append(f"{rindent}acc = {_COMBINE[kind].format(v=value)};")
        lines += [indent + "  " * (len(rloops) - 1 - k) + "}" for k in range(len(rloops))]
        lines.append(f"{indent}out[{out_index}] = static_cast<{ctype}>({'acc_index' if arg else 'acc'});")
    else:
        lines += [f"{indent}{line}" for line in printer.lines]
        lines.append(f"{indent}out[{out_index}] = static_cast<{ctype}>({result});")
    lines += ["  " + "  " * (len(loop_lines) - 1 - k) + "}" for k in range(len(loop_lines))]
    lines.append("}")
    return "\n".join(lines)


def buffers_read(node: Node) -> list[str]:
    return run(ReadsWrites(), node).buffers_read


def is_static(node: Node) -> bool:
    ranges = list(node.ranges) + (list(node.reduction_ranges) if isinstance(node, Reduction) else [])
    return all(sympy.sympify(r).is_Integer for r in ranges)
