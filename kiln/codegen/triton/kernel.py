"""One Triton kernel per fused kernel (seed 003's Triton side of the loop IR).

The kernel's shared outer loops become one flat axis of `xnumel` iterations, `XBLOCK` of them per
program (`tl.program_id(0)`); their loop variables are recovered by division and remainder. A
kernel whose members all run over exactly those loops is a 1-D block. Otherwise each member
runs in turn over the same `[XBLOCK, 1]` rows: one with no loops of its own once; a reduction
in a loop over its flattened reduction ranges, `RBLOCK` at a time, into a `[XBLOCK, RBLOCK]`
accumulator folded across the block at the end; a pointwise member with inner loops likewise,
storing as it goes. Members kept in registers (a row's max, a layer norm's mean) are variables
read by the members after them, as in the C++ kernel.

A scatter is two kernels launched in order: its initial values, then one program block per
`XBLOCK` source elements, writing with atomics where several sources may combine into one
element (sum, max, min).

A reduction of a few long rows (a loss's mean, `x.sum()` of a large tensor) is *split*: one
program per row would run on one of a GPU's hundred-odd multiprocessors, looping over the whole
row. The first launch reduces `SPLIT` chunks of each row in parallel into a partials buffer (the
launcher allocates it), the second folds each row's partials and runs the kernel's members.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field

import sympy
import torch

from kiln.codegen.triton.body import Dims, TritonBody
from kiln.codegen.triton.printer import TRITON_DTYPES, round_to
from kiln.codegen.value_rules import HALF_DTYPES, reduction_identity, value_dtype
from kiln.ir.nodes import Buffer
from kiln.ir.ops import ops, use_handler
from kiln.ir.schedule import FusedKernel, LoopNest, loop_extents

X, R, XR = Dims({"x"}), Dims({"r"}), Dims({"x", "r"})
BLOCK_ELEMENTS = 4096  # lanes of a reduction kernel's [XBLOCK, RBLOCK] block
POINTWISE_BLOCK = 1024
PERSISTENT_ROW = 4096  # rows up to this many elements are one block (no loop), read once for every member
SPLIT_MAX_ROWS = 16  # a reduction kernel over at most this many rows ...
SPLIT_MIN_ROW = 65536  # ... of at least this many elements each is split
SPLIT_CHUNK = 16384  # elements per program of a split row's first launch (at most SPLIT_MAX_PARTS of them)
SPLIT_MAX_PARTS = 256
_INDEX_LIMIT = 2**31  # beyond this many elements, offsets are computed in int64

_POINTER_TYPES = {
    torch.float32: "*fp32", torch.float64: "*fp64", torch.float16: "*fp16", torch.bfloat16: "*bf16",
    torch.int64: "*i64", torch.int32: "*i32", torch.int16: "*i16", torch.int8: "*i8", torch.uint8: "*u8",
    torch.bool: "*i1",
}  # fmt: skip

_COMBINE = {"sum": "{a} + {v}", "prod": "{a} * {v}", "max": "kiln_maximum({a}, {v})",
            "min": "kiln_minimum({a}, {v})", "any": "tl.maximum({a}, {v})", "all": "tl.minimum({a}, {v})"}
# Only Triton's builtins and the module's own helpers are called: Triton's library functions
# (tl.sum, tl.zeros, ...) are jit functions decorated when triton is imported, for its
# interpreter or for its compiler but not both, and kiln uses both in one process (tests).
_FOLD = {"sum": "tl.reduce({a}, 1, kiln_add)", "prod": "tl.reduce({a}, 1, kiln_multiply)", "max": "tl.reduce({a}, 1, kiln_maximum)",
         "min": "tl.reduce({a}, 1, kiln_minimum)", "any": "tl.reduce({a}, 1, kiln_maximum)", "all": "tl.reduce({a}, 1, kiln_minimum)"}
# A split reduction's partials buffer, by its accumulator's Triton type.
_ACC_POINTER = {"tl.float32": "fp32", "tl.float64": "fp64", "tl.int64": "i64", "tl.int32": "i32", "tl.int8": "i8"}
_ACC_TORCH = {"tl.float32": "float32", "tl.float64": "float64", "tl.int64": "int64", "tl.int32": "int32", "tl.int8": "int8"}
_ATOMIC = {"sum": "tl.atomic_add", "max": "tl.atomic_max", "min": "tl.atomic_min"}
_ATOMIC_DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64)
_SERIAL_COMBINE = {"sum": "add", "prod": "mul", "max": "maximum", "min": "minimum"}


def next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


@dataclass
class JitFunction:
    """One `@triton.jit` function: its source, and its arguments as Triton's compiler types them
    (what `triton.compile` needs to build it for a GPU without running it)."""

    name: str
    source: str
    takes_error_flag: bool
    signature: dict[str, str] = field(default_factory=dict)  # argument -> "*fp32", "i32", "constexpr"
    constexprs: dict[str, int] = field(default_factory=dict)


@dataclass
class TritonKernel:
    functions: list[JitFunction]
    launcher: str  # its launches (`kiln_launch(...)`), then `def <name>(*tensors)` calling them in order
    uses_error_flag: bool
    # Each launch as a call of Triton's `warmup` (the function compiled for the arguments the
    # launch passes, tensors by dtype alone, without running it): kiln/runtime/triton_kernels.py
    # `precompile` runs them in parallel when a GPU graph loads.
    warmups: list[str] = field(default_factory=list)


def _storage_elements(buffer: Buffer) -> int:
    layout = buffer.layout
    return int(layout.offset) + 1 + sum((int(s) - 1) * abs(int(st)) for s, st in zip(layout.size, layout.stride))


def _decompose(flat: str, symbols: list[sympy.Symbol], sizes: list[int]) -> list[str]:
    """Lines binding each loop variable from a flat row-major index."""
    lines, divisor = [], 1
    for symbol, size in reversed(list(zip(symbols, sizes))):
        quotient = flat if divisor == 1 else f"({flat} // {divisor})"
        lines.append(f"{symbol} = {quotient} % {size}" if divisor * size != math.prod(sizes) else f"{symbol} = {quotient}")
        divisor *= size
    return list(reversed(lines))


def _init(kind: str, dtype: torch.dtype) -> str:
    """The reduction's identity (value_rules.py); booleans are accumulated as int8 0 and 1."""
    identity = reduction_identity(kind, dtype)
    if isinstance(identity, float):
        return f'float("{"-" if identity < 0 else ""}inf")'
    return str(int(identity))


class TritonKernelPrinter:
    def __init__(self, kernel: FusedKernel, function: str, device: str = "cpu", tune: str | None = None,
                 time_gemm: bool = False) -> None:
        self.kernel, self.function, self.device, self.tune, self.time_gemm = kernel, function, device, tune, time_gemm
        self.pointers, self.buffers = kernel.argument_names(), kernel.buffers()
        self.locals: dict[str, tuple[str, Dims]] = {}
        self.locals_named = 0  # (locals are named by this count: `_local_variable`)
        self.wide = any(_storage_elements(b) >= _INDEX_LIMIT for b in self.buffers.values())
        self.uses_error_flag = False  # by the function being printed
        self.shared: dict[str, str] = {}  # a persistent kernel's values, by expression, across members
        self.lines: list[str] = []

    def _emit(self, line: str, depth: int) -> None:
        self.lines.append("    " * depth + line)

    def _arguments(self) -> list[tuple[str, str]]:
        k = self.kernel
        return ([(f"in{n}", _POINTER_TYPES[b.layout.dtype]) for n, b in enumerate(k.inputs)]
                + [(f"out{n}", _POINTER_TYPES[b.layout.dtype]) for n, b in enumerate(k.outputs)])

    def _body(self, nest: LoopNest, symbol_dims: dict, masks: dict[str, str], depth: int,
              rename: dict | None = None) -> TritonBody:
        """`nest`'s body printed at `depth`; `rename` maps its inner loop variables to the
        persistent block's (`self.shared` then carries values from member to member)."""
        members = self.kernel.members
        prefix = f"t{members.index(nest)}_" if nest in members else "init"  # a scatter's initial values
        extents = {rename.get(v, v) if rename else v: size for v, size in loop_extents(nest.node).items()}
        body = TritonBody(self.pointers, self.buffers, self.locals, symbol_dims, masks, prefix, extents,
                          error_flag="error_flag", rename=rename, shared=self.shared if rename else None)
        with use_handler(body):
            body.result = nest.node.body()
        self.uses_error_flag |= body.uses_error_flag
        for line in body.lines:
            self._emit(line, depth)
        return body

    def _jit(self, name: str, extra: list[tuple[str, str]], constexprs: dict[str, int]) -> JitFunction:
        """Wraps the lines printed so far as the jit function `name`, and starts a new one."""
        flag = self.uses_error_flag
        arguments = self._arguments() + ([("error_flag", "*i32")] if flag else []) + extra
        params = [a for a, _ in arguments] + [f"{c}: tl.constexpr" for c in constexprs]
        source = "\n".join(["@triton.jit", f"def {name}({', '.join(params)}):", *self.lines])
        self.lines, self.uses_error_flag = [], False
        signature = dict(arguments) | {c: "constexpr" for c in constexprs}
        return JitFunction(name, source, flag, signature, dict(constexprs))

    def _program_rows(self, two_d: bool) -> None:
        pid = "tl.program_id(0).to(tl.int64)" if self.wide else "tl.program_id(0)"
        self._emit(f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK){'[:, None]' if two_d else ''}", 1)
        self._emit("xmask = xindex < xnumel", 1)

    # -- the kernel ---------------------------------------------------------------------------
    def kernel_source(self) -> TritonKernel:
        k = self.kernel
        if k.is_scatter:
            return self._scatter(k.members[0])
        if k.gemm is not None:
            return self._gemm()
        if k.vectorizes_outer:
            return self._kernel([self._pointwise(f"{self.function}_main")])
        outer = [int(s) for s in k.outer]
        xnumel = math.prod(outer)
        index_type = "i64" if self.wide else "i32"
        outer_vars = [sympy.Symbol(f"i{d}", integer=True, nonnegative=True) for d in range(len(outer))]
        self._program_rows(True)
        for line in _decompose("xindex", outer_vars, outer):
            self._emit(line, 1)
        inner = max([math.prod(int(s) for s in k.inner_ranges(m)) for m in k.members] + [1])
        if self._splits(xnumel, inner):
            return self._split_reduction(xnumel, inner, outer, outer_vars, index_type)
        persistent = self._persistent_vars(inner)
        pending = list(k.members)
        while pending:
            group, after = self._sibling_reductions(pending) if persistent is None else ([], [])
            if len(group) > 1:
                for nest in group:
                    self._barrier_before(nest)
                inner_vars = list(group[0].node.reduction_vars())
                symbol_dims = {v: X for v in outer_vars} | {v: R for v in inner_vars}
                self._reductions(group, inner_vars, [int(s) for s in k.inner_ranges(group[0])], symbol_dims,
                                 {"x": "xmask", "r": "rmask"})
                for nest in after:
                    self._member(nest, outer_vars, persistent)
                pending = [m for m in pending if m not in group and m not in after]
            else:
                self._member(pending.pop(0), outer_vars, persistent)
        configs = _reduction_configs(xnumel, inner, persistent is not None, self.tune)
        return self._kernel([self._launch(f"{self.function}_main", index_type, xnumel, configs)])

    def _pointwise(self, name: str, extra: list[tuple[str, str]] = ()) -> tuple:
        """Every member over the kernel's outer loops, one element per lane (a 1-D block): the
        jit function `name` (with `extra` arguments before the size) and its launch."""
        outer = [int(s) for s in self.kernel.outer]
        outer_vars = [sympy.Symbol(f"i{d}", integer=True, nonnegative=True) for d in range(len(outer))]
        self._program_rows(False)
        for line in _decompose("xindex", outer_vars, outer):
            self._emit(line, 1)
        for nest in self.kernel.members:
            self._barrier_before(nest)
            body = self._body(nest, {v: X for v in outer_vars}, {"x": "xmask"}, 1)
            self._result(nest, body, body.result, X, "[XBLOCK]", 1)
        xnumel = math.prod(outer)
        index_type = "i64" if self.wide else "i32"
        return self._launch(name, index_type, xnumel, _pointwise_configs(xnumel, self.tune), list(extra))

    def _launch(self, name: str, index_type: str, xnumel: int, configs: list[tuple[dict, int]],
                extra: list[tuple[str, str]] = ()) -> tuple:
        """The printed lines as jit function `name` over `xnumel` rows, with its launch: the first
        of `configs` (block sizes, warps) as it is, or, with several, Triton's autotuner choosing
        among them at the first launch (each timed on the call's own tensors, its outputs restored
        after each try; the choice kept in Triton's cache, under kiln's cache directory)."""
        (constexprs, warps), *others = configs
        jit = self._jit(name, [*extra, ("xnumel", index_type)], constexprs)
        before = "".join(f"{a}, " for a, _ in extra)  # the launch's arguments after the kernel's tensors
        if not others:
            fixed = ", ".join(f"{c}={v}" for c, v in constexprs.items())
            return jit, _blocks(xnumel, constexprs["XBLOCK"]), f"{before}{xnumel}, {fixed}, num_warps={warps}"
        self._autotuned(jit, [_config_text(values, w) for values, w in configs], ["xnumel"])
        return jit, f"lambda meta: ({_blocks_text(xnumel)},)", f"{before}{xnumel}"

    def _autotuned(self, jit: JitFunction, configs: list[str], key: list[str]) -> None:
        """`jit` decorated with Triton's autotuner over `configs` (each one's outputs restored
        after each try, so kernels that write in place stay right)."""
        outputs = [f"out{n}" for n in range(len(self.kernel.outputs))]
        jit.source = (f"@triton.autotune(configs=[{', '.join(configs)}], key={key!r}, restore_value={outputs!r}, "
                      f"do_bench=kiln_do_bench, cache_results=True)\n{jit.source}")

    def _kernel(self, launches: list[tuple[JitFunction, int, str]], prologue: list[str] = (),
                name: str | None = None) -> TritonKernel:
        """The launcher calling each function on its grid with the kernel's tensors, the error
        flag where it reads indices, then `rest` (sizes, block sizes); `prologue`: lines run
        before the launches (a split reduction's partials buffer). Each launch is a module-level
        `kiln_launch(function, grid, constants...)` made once, called with the tensors
        (kiln/runtime/triton_launch.py: on a GPU it launches the compiled binary directly)."""
        launcher = name or self.function
        names = [a for a, _ in self._arguments()]
        body = [f"    {line}" for line in prologue]
        sites, warmups = [], []
        for function, grid, rest in launches:
            if grid == 0:  # no iteration (an empty tensor): nothing to run, and no address to read
                continue
            args = ", ".join(names + (["kiln_error_flag"] if function.takes_error_flag else []))
            launch_grid = grid if isinstance(grid, str) else f"({grid},)"  # a str: the autotuner's grid function
            tensors, constants = _tensors_and_constants(f"{args}{', ' if rest else ''}{rest}")
            site = f"{launcher}_launch{len(sites)}"
            sites.append(f"{site} = kiln_launch({function.name}, {launch_grid}{', ' if constants else ''}{constants})")
            body.append(f"    {site}({tensors})")
            warmups.append(_warmup(function, f"{args}{', ' if rest else ''}{rest}"))
        text = "\n".join([f"def {launcher}({', '.join(names)}):", *(body or ["    pass"])])
        return TritonKernel([f for f, _, _ in launches], "\n\n\n".join([*(["\n".join(sites)] if sites else []), text]),
                            any(f.takes_error_flag for f, _, _ in launches), warmups)

    def _result(self, nest: LoopNest, body: TritonBody, value: str, dims: Dims, shape: str, depth: int) -> None:
        """A member's value for the current block: into its local, or stored."""
        if nest.name in self.kernel.locals:
            variable = self._local_variable()
            self._emit(f"{variable} = {value}", depth)
            self.locals[nest.name] = (variable, body.value_dims(value) if value in body.dims else dims)
            return
        self._emit(body.store_line(nest.name, nest.store_index, value, dims, shape), depth)
        stored = f"tl.load({self.pointers[nest.name]} + "  # later members load it again, not from before
        self.shared = {text: name for text, name in self.shared.items() if not text.startswith(stored)}

    def _local_variable(self) -> str:
        """The next member value kept in a local, named by its place in the kernel, never by its
        buffer: the same layer's kernel elsewhere in the graph (its buffers named otherwise)
        prints the same text, so it is one jit function, compiled once (module.py)."""
        self.locals_named += 1
        return f"local{self.locals_named - 1}"

    def _barrier_before(self, nest: LoopNest) -> None:
        """Other threads of the program may have stored what `nest` reads: wait for them."""
        members = self.kernel.members
        stored = {m.name for m in members[: members.index(nest)]} - set(self.kernel.locals)
        if any(name in stored for name, _ in nest.reads):
            self._emit("tl.debug_barrier()", 1)

    def _persistent_vars(self, inner: int) -> list[sympy.Symbol] | None:
        """Persistent (no loop: every member's whole row in one block, each input loaded once
        for all members) when the members' inner loops are one shape whose rows fit in a block:
        the variables of that block, bound here; else None (each member loops)."""
        k = self.kernel
        shapes = {tuple(int(s) for s in k.inner_ranges(m)) for m in k.members if k.inner_ranges(m)}
        if len(shapes) != 1 or inner > PERSISTENT_ROW:
            return None
        (shape,) = shapes
        symbols = [sympy.Symbol(f"r{d}", integer=True, nonnegative=True) for d in range(len(shape))]
        self._emit("rindex = tl.arange(0, RBLOCK)[None, :]", 1)
        self._emit(f"rmask = rindex < {math.prod(shape)}", 1)  # 0 for an empty row: every lane masked
        for line in _decompose("rindex", symbols, list(shape)):
            self._emit(line, 1)
        return symbols

    def _member(self, nest: LoopNest, outer_vars: list[sympy.Symbol], persistent: list[sympy.Symbol] | None) -> None:
        self._barrier_before(nest)
        inner = [int(s) for s in self.kernel.inner_ranges(nest)]
        symbol_dims = {v: X for v in outer_vars}
        if not inner:
            body = self._body(nest, symbol_dims, {"x": "xmask"}, 1, rename={} if persistent else None)
            self._result(nest, body, body.result, X, "[XBLOCK, 1]", 1)
            return
        inner_vars = list(nest.node.reduction_vars()) if nest.is_reduction else list(nest.node.index_vars())[len(outer_vars):]
        numel = math.prod(inner)
        masks = {"x": "xmask", "r": "rmask"}
        if persistent is not None:
            symbol_dims.update({v: R for v in persistent})
            body = self._body(nest, symbol_dims, masks, 1, rename=dict(zip(inner_vars, persistent)))
            if nest.is_reduction:
                self._fold_block(nest, body)
            else:
                self._result(nest, body, body.result, XR, "[XBLOCK, RBLOCK]", 1)
            return
        symbol_dims.update({v: R for v in inner_vars})
        if nest.is_reduction:
            self._reduction(nest, inner_vars, inner, symbol_dims, masks)
            return
        self._emit(f"for roffset in range(0, {numel}, RBLOCK):", 1)
        self._inner_rows(inner_vars, inner)
        body = self._body(nest, symbol_dims, masks, 2)
        self._result(nest, body, body.result, XR, "[XBLOCK, RBLOCK]", 2)

    def _inner_rows(self, inner_vars: list[sympy.Symbol], inner: list[int]) -> None:
        self._emit("rindex = roffset + tl.arange(0, RBLOCK)[None, :]", 2)
        self._emit(f"rmask = rindex < {math.prod(inner)}", 2)
        for line in _decompose("rindex", inner_vars, inner):
            self._emit(line, 2)

    def _accumulator(self, nest: LoopNest) -> tuple[str, str, bool, str]:
        """(the reduction's kind, its accumulator's Triton type, whether it is a bool's, a block
        of its initial value)."""
        node = nest.node
        kind = node.reduction_type
        acc_dtype = value_dtype(node.src_dtype if kind in ("argmax", "argmin") else node.dtype)
        boolean = acc_dtype == torch.bool
        acc_type = "tl.int8" if boolean else TRITON_DTYPES[acc_dtype]
        return kind, acc_type, boolean, f"tl.full([XBLOCK, RBLOCK], {_init(kind, acc_dtype)}, {acc_type})"

    def _converted(self, value: str, acc_type: str, boolean: bool) -> str:
        converted = f"({value} != 0).to(tl.int8)" if boolean else f"{value}.to({acc_type})"  # any/all of numbers
        return f"tl.broadcast_to({converted}, [XBLOCK, RBLOCK])"

    def _fold_block(self, nest: LoopNest, body: TritonBody) -> None:
        """A persistent reduction: the whole row is one block, folded at once."""
        kind, acc_type, boolean, init = self._accumulator(nest)
        m = self.kernel.members.index(nest)
        _, _, value = body.reduced
        self._emit(f"block{m} = tl.where(xmask & rmask, {self._converted(value, acc_type, boolean)}, {init})", 1)
        if kind == "welford":  # the row is in registers: its mean, then the squared deviations from it
            count = max(1, math.prod(int(s) for s in self.kernel.inner_ranges(nest)))
            self._emit(f"mean{m} = tl.reduce(block{m}, 1, kiln_add)[:, None] / {count}", 1)
            self._emit(f"block{m} = tl.where(xmask & rmask, block{m} - mean{m}, {init})", 1)
            self._emit(f"folded = tl.reduce(block{m} * block{m}, 1, kiln_add)", 1)
        elif kind in ("argmax", "argmin"):
            positions = "tl.broadcast_to(rindex.to(tl.int64), [XBLOCK, RBLOCK])"
            self._emit(f"_, folded = tl.reduce((block{m}, {positions}), 1, kiln_{kind}_combine)", 1)
        else:
            self._emit(f"folded = {_FOLD[kind].format(a=f'block{m}')}", 1)
        self._result(nest, body, "(folded[:, None] != 0)" if boolean else "folded[:, None]", X, "[XBLOCK, 1]", 1)

    def _reduction(self, nest: LoopNest, inner_vars, inner: list[int], symbol_dims, masks) -> None:
        self._reductions([nest], inner_vars, inner, symbol_dims, masks)

    def _reductions(self, group: list[LoopNest], inner_vars, inner: list[int], symbol_dims, masks) -> None:
        """Reductions over the same inner loops, none reading another, in one loop: each block of
        the row is loaded once for all of them (a variance's `welford` beside its mean's sum)."""
        for nest in group:
            self._start_accumulator(nest)
        self._emit(f"for roffset in range(0, {math.prod(inner)}, RBLOCK):", 1)
        self._inner_rows(inner_vars, inner)
        rename = {v: v for v in inner_vars} if len(group) > 1 else None  # (shares loads across members)
        self.shared = {}
        bodies = []
        for nest in group:
            bodies.append(self._body(nest, symbol_dims, masks, 2, rename=rename))
            self._accumulate(nest, bodies[-1])
        self.shared = {}  # (values of the loop's last block)
        for nest, body in zip(group, bodies):
            self._fold_accumulator(nest, body)

    def _start_accumulator(self, nest: LoopNest) -> None:
        m = self.kernel.members.index(nest)
        kind, _, _, init = self._accumulator(nest)
        self._emit(f"acc{m} = {init}", 1)
        if kind in ("argmax", "argmin"):
            self._emit(f"acc{m}_index = tl.full([XBLOCK, RBLOCK], 0, tl.int64)", 1)
        elif kind == "welford":  # acc: the running mean of each lane's values; then their squared deviations, count
            self._emit(f"acc{m}_m2 = {init}", 1)
            self._emit(f"acc{m}_count = {init}", 1)

    def _accumulate(self, nest: LoopNest, body: TritonBody) -> None:
        m = self.kernel.members.index(nest)
        kind, acc_type, boolean, _ = self._accumulator(nest)
        acc = f"acc{m}"
        _, _, value = body.reduced
        self._emit(f"value{m} = {self._converted(value, acc_type, boolean)}", 2)
        if kind in ("argmax", "argmin"):
            better = "kiln_greater" if kind == "argmax" else "kiln_less"
            self._emit(f"take = xmask & rmask & {better}(value{m}, {acc})", 2)
            self._emit(f"{acc} = tl.where(take, value{m}, {acc})", 2)
            self._emit(f"{acc}_index = tl.where(take, rindex.to(tl.int64), {acc}_index)", 2)
        elif kind == "welford":  # Welford's update of each lane's mean and squared deviations
            self._emit("take = xmask & rmask", 2)
            self._emit(f"{acc}_count = tl.where(take, {acc}_count + 1, {acc}_count)", 2)
            self._emit(f"delta = value{m} - {acc}", 2)
            self._emit(f"{acc} = tl.where(take, {acc} + delta / tl.maximum({acc}_count, 1), {acc})", 2)
            self._emit(f"{acc}_m2 = tl.where(take, {acc}_m2 + delta * (value{m} - {acc}), {acc}_m2)", 2)
        else:
            self._emit(f"{acc} = tl.where(xmask & rmask, {_COMBINE[kind].format(a=acc, v=f'value{m}')}, {acc})", 2)

    def _fold_accumulator(self, nest: LoopNest, body: TritonBody) -> None:
        m = self.kernel.members.index(nest)
        kind, _, boolean, _ = self._accumulator(nest)
        acc = f"acc{m}"
        if kind in ("argmax", "argmin"):
            self._emit(f"_, folded = tl.reduce(({acc}, {acc}_index), 1, kiln_{kind}_combine)", 1)
        elif kind == "welford":  # the lanes' means, deviations and counts combined (Chan et al.)
            self._emit(f"_, folded, _ = tl.reduce(({acc}, {acc}_m2, {acc}_count), 1, kiln_welford_combine)", 1)
        else:
            self._emit(f"folded = {_FOLD[kind].format(a=acc)}", 1)
        result = "(folded[:, None] != 0)" if boolean else "folded[:, None]"
        self._result(nest, body, result, X, "[XBLOCK, 1]", 1)

    def _sibling_reductions(self, pending: list[LoopNest]) -> tuple[list[LoopNest], list[LoopNest]]:
        """(the looping reductions among `pending` that can share one loop with the first: the
        same inner loops, none reading another of them or a member passed over; the members with
        no loop of their own passed over, printed after the loop)."""
        first, k = pending[0], self.kernel
        if not first.is_reduction or not k.inner_ranges(first):
            return [], []
        group, passed = [first], []
        for nest in pending[1:]:
            earlier = {m.name for m in group + passed}
            reads_earlier = any(name in earlier for name, _ in nest.reads)
            if nest.is_reduction and k.inner_ranges(nest) == k.inner_ranges(first) and not reads_earlier:
                group.append(nest)
            elif not k.inner_ranges(nest):
                passed.append(nest)
            else:
                break
        last = max(pending.index(n) for n in group)
        return group, [n for n in passed if pending.index(n) < last]

    # -- a reduction of a few long rows, split -------------------------------------------------
    def _splits(self, xnumel: int, inner: int) -> bool:
        """The kernel is one reduction (sum, prod, max, min, any, all) over at most SPLIT_MAX_ROWS
        rows of at least SPLIT_MIN_ROW elements, then members with no loops of their own."""
        first, rest = self.kernel.members[0], self.kernel.members[1:]
        return (0 < xnumel <= SPLIT_MAX_ROWS and inner >= SPLIT_MIN_ROW and first.is_reduction
                and first.node.reduction_type in _COMBINE
                and math.prod(int(s) for s in self.kernel.inner_ranges(first)) == inner
                and not any(self.kernel.inner_ranges(m) for m in rest))

    def _split_reduction(self, xnumel: int, inner: int, outer: list[int], outer_vars: list[sympy.Symbol],
                         index_type: str) -> TritonKernel:
        first = self.kernel.members[0]
        kind, acc_type, boolean, _ = self._accumulator(first)
        parts = min(SPLIT_MAX_PARTS, next_power_of_2(-(-inner // SPLIT_CHUNK)))
        rblock = min(next_power_of_2(inner), BLOCK_ELEMENTS)
        chunk = -(-(-(-inner // parts)) // rblock) * rblock  # each part's elements, whole blocks
        partials = [("partials", f"*{_ACC_POINTER[acc_type]}")]
        init = f"tl.full([XBLOCK, RBLOCK], {_init(kind, value_dtype(first.node.dtype))}, {acc_type})"
        # First launch: program p reduces part p % PARTS of row p // PARTS.
        self.lines = []  # (kernel_source bound xindex for one launch: this kernel has two)
        self._emit("pid = tl.program_id(0)", 1)
        self._emit("xindex = pid // PARTS + tl.arange(0, XBLOCK)[:, None]", 1)
        self._emit("xmask = xindex < xnumel", 1)
        self._emit("part = pid % PARTS", 1)
        for line in _decompose("xindex", outer_vars, outer):
            self._emit(line, 1)
        inner_vars = list(first.node.reduction_vars())
        inner_sizes = [int(s) for s in self.kernel.inner_ranges(first)]
        self._emit("acc = " + init, 1)
        self._emit(f"for roffset in range(0, {chunk}, RBLOCK):", 1)  # (constant bounds: the interpreter's range)
        self._emit("rindex = part * CHUNK + roffset + tl.arange(0, RBLOCK)[None, :]", 2)
        self._emit(f"rmask = rindex < {inner}", 2)
        for line in _decompose("rindex", inner_vars, inner_sizes):
            self._emit(line, 2)
        symbol_dims = {v: X for v in outer_vars} | {v: R for v in inner_vars}
        body = self._body(first, symbol_dims, {"x": "xmask", "r": "rmask"}, 2)
        _, _, value = body.reduced
        self._emit(f"value = {self._converted(value, acc_type, boolean)}", 2)
        self._emit(f"acc = tl.where(xmask & rmask, {_COMBINE[kind].format(a='acc', v='value')}, acc)", 2)
        self._emit(f"folded = {_FOLD[kind].format(a='acc')}", 1)
        self._emit("tl.store(partials + (xindex * PARTS + part), folded[:, None], mask=xmask)", 1)
        constexprs = {"XBLOCK": 1, "RBLOCK": rblock, "PARTS": parts, "CHUNK": chunk}
        partial = self._jit(f"{self.function}_partial", partials + [("xnumel", index_type)], constexprs)
        # Second launch: each row's partials folded, the reduction's result, then the other members.
        xblock = next_power_of_2(xnumel)
        self._program_rows(True)
        for line in _decompose("xindex", outer_vars, outer):
            self._emit(line, 1)
        self._emit("rindex = tl.arange(0, PARTS)[None, :]", 1)
        self._emit("block = tl.load(partials + (xindex * PARTS + rindex), mask=xmask, other=0)", 1)
        self._emit(f"block = tl.where(xmask, block, {init.replace('RBLOCK', 'PARTS')})", 1)
        self._emit(f"folded = {_FOLD[kind].format(a='block')}", 1)
        result = "(folded[:, None] != 0)" if boolean else "folded[:, None]"
        store = TritonBody(self.pointers, self.buffers, self.locals, {v: X for v in outer_vars}, {"x": "xmask"},
                           "f", {}, error_flag="error_flag")
        self._result(first, store, result, X, "[XBLOCK, 1]", 1)
        for nest in self.kernel.members[1:]:
            self._member(nest, outer_vars, None)
        final = self._jit(f"{self.function}_main", partials + [("xnumel", index_type)], {"XBLOCK": xblock, "PARTS": parts})
        allocate = (f"partials = torch.empty({xnumel * parts}, dtype=torch.{_ACC_TORCH[acc_type]}, "
                    f"device={self._arguments()[0][0]}.device)")
        return self._kernel([(partial, xnumel * parts, f"partials, {xnumel}, XBLOCK=1, RBLOCK={rblock}, PARTS={parts}, "
                                                         f"CHUNK={chunk}, num_warps={_warps(rblock)}"),
                             (final, 1, f"partials, {xnumel}, XBLOCK={xblock}, PARTS={parts}, num_warps=1")], [allocate])

    # -- a matrix product, then the members over its tile ---------------------------------------
    def _gemm(self) -> TritonKernel:
        template = self._gemm_template()
        return self._timed_gemm(template) if self.time_gemm else self._kernel([template])

    def _gemm_template(self) -> tuple:
        """One program per [XBLOCK, RBLOCK] tile of the product (rows, columns): the product over
        K in steps of KBLOCK (`tl.dot`, float32 accumulation), rounded to the product's dtype as
        eager's GEMM stores it, then each member at every element of the tile, reading the product
        from registers. Tiles chosen by Triton's autotuner on a GPU (`tune`)."""
        k = self.kernel
        a, b, product = k.gemm.a, k.gemm.b, k.gemm.product
        (m, kk), n = (int(s) for s in a.layout.size), int(b.layout.size[1])
        A, B = self.pointers[a.name], self.pointers[b.name]
        sa = [int(s) for s in a.layout.stride]
        sb = [int(s) for s in b.layout.stride]
        # Tiles in groups of GROUP_ROWS rows of tiles, column by column within a group: the
        # programs running at once share their A rows and B columns in the L2 cache, where
        # row-major tile order would stream all of B for every row of tiles.
        self._emit("pid = tl.program_id(0)", 1)
        self._emit("rows = (xnumel + XBLOCK - 1) // XBLOCK", 1)
        self._emit(f"columns = ({n} + RBLOCK - 1) // RBLOCK", 1)
        self._emit("group_first = (pid // (GROUP_ROWS * columns)) * GROUP_ROWS", 1)
        self._emit("group_rows = tl.minimum(rows - group_first, GROUP_ROWS)", 1)
        self._emit("row = group_first + (pid % (GROUP_ROWS * columns)) % group_rows", 1)
        self._emit("column = (pid % (GROUP_ROWS * columns)) // group_rows", 1)
        self._emit("xindex = row * XBLOCK + tl.arange(0, XBLOCK)[:, None]", 1)
        self._emit("rindex = column * RBLOCK + tl.arange(0, RBLOCK)[None, :]", 1)
        self._emit("xmask = xindex < xnumel", 1)  # (the rows an argument: one kernel for every batch size)
        self._emit(f"rmask = rindex < {n}", 1)
        self._emit("product = tl.full([XBLOCK, RBLOCK], 0, tl.float32)", 1)
        self._emit(f"for koffset in range(0, {kk}, KBLOCK):", 1)
        self._emit("kindex = koffset + tl.arange(0, KBLOCK)", 2)
        a_at = f"{A} + ({int(a.layout.offset)} + xindex * {sa[0]} + kindex[None, :] * {sa[1]})"
        b_at = f"{B} + ({int(b.layout.offset)} + kindex[:, None] * {sb[0]} + rindex * {sb[1]})"
        self._emit("if EVEN_K:  # (a constant of the config: KBLOCK divides K, no step is cut short)", 2)
        self._emit(f"a = tl.load({a_at}, mask=xmask, other=0)", 3)
        self._emit(f"b = tl.load({b_at}, mask=rmask, other=0)", 3)
        self._emit("else:", 2)
        self._emit(f"a = tl.load({a_at}, mask=xmask & (kindex[None, :] < {kk}), other=0)", 3)
        self._emit(f"b = tl.load({b_at}, mask=(kindex[:, None] < {kk}) & rmask, other=0)", 3)
        if a.layout.dtype == torch.float32:  # eager's float32 GEMM: full float32, no TF32
            self._emit('product = tl.dot(a, b, product, input_precision="ieee")', 2)
        elif a.layout.dtype == torch.bfloat16 and self.device == "cpu":
            # bfloat16 values are exact in TF32, so widened to float32 and multiplied as TF32 they
            # give bfloat16's exact products; Triton's interpreter multiplies bfloat16 blocks as
            # their raw bits, so under it they are never passed to tl.dot as they are (on a GPU
            # they are: the tensor cores take bfloat16 at twice TF32's rate).
            self._emit('product = tl.dot(a.to(tl.float32), b.to(tl.float32), product, input_precision="tf32")', 2)
        else:
            self._emit("product = tl.dot(a, b, product)", 2)
        dtype = product.layout.dtype
        value = round_to(dtype, "product") if dtype in HALF_DTYPES else "product"
        variable = self._local_variable()
        self._emit(f"{variable} = {value}", 1)
        self.locals[product.name] = (variable, XR)
        # The members' loop variables from each element's flat position in the product.
        outer = [int(s) for s in k.outer]
        outer_vars = [sympy.Symbol(f"i{d}", integer=True, nonnegative=True) for d in range(len(outer))]
        self._emit(f"flat = xindex * {n} + rindex", 1)
        for line in _decompose("flat", outer_vars, outer):
            self._emit(line, 1)
        for nest in k.members:
            body = self._body(nest, {v: XR for v in outer_vars}, {"x": "xmask", "r": "rmask"}, 1, rename={})
            self._result(nest, body, body.result, XR, "[XBLOCK, RBLOCK]", 1)
        (blocks, warps, _), *others = configs = _gemm_configs(m, n, kk, self.tune)
        jit = self._jit(f"{self.function}_main", [("xnumel", "i64" if self.wide else "i32")], blocks)
        if not others:
            fixed = ", ".join(f"{c}={v}" for c, v in blocks.items())
            return jit, _blocks(m, blocks["XBLOCK"]) * _blocks(n, blocks["RBLOCK"]), f"{m}, {fixed}, num_warps={warps}"
        self._autotuned(jit, [_config_text(*c) for c in configs], ["xnumel"])
        return jit, f'lambda meta: (-(-{m} // meta["XBLOCK"]) * -(-{n} // meta["RBLOCK"]),)', f"{m}"

    def _timed_gemm(self, template: tuple) -> TritonKernel:
        """The product kernel in two forms, one chosen by timing both at the first call on the
        call's own tensors (`kiln_choose_gemm`, kiln/runtime/triton_kernels.py; the answer kept in
        kiln's autotune cache): the template above, or the library's product (`torch.mm`: cuBLAS
        on a GPU) into a buffer, then the members as a pointwise kernel reading it. cuBLAS wins
        most large products; the template wins where its fused epilogue saves more than cuBLAS's
        kernels gain (small and skinny products)."""
        a, b, product = self.kernel.gemm.a, self.kernel.gemm.b, self.kernel.gemm.product
        fused = self._kernel([template], name=f"{self.function}_template")
        self.locals.pop(product.name)
        self.pointers = {**self.pointers, product.name: "gemm_product"}
        self.buffers = {**self.buffers, product.name: product}
        epilogue = self._pointwise(f"{self.function}_epilogue", [("gemm_product", _POINTER_TYPES[product.layout.dtype])])
        library = self._kernel([epilogue], [f"gemm_product = torch.mm({self._operand(a)}, {self._operand(b)})"],
                               name=f"{self.function}_library")
        tensors = ", ".join(a for a, _ in self._arguments())
        (m, kk), n = (int(s) for s in a.layout.size), int(b.layout.size[1])
        choice = f"{self.function}_choice"
        shape = (m, n, kk, str(a.layout.dtype))
        launcher = "\n".join([
            fused.launcher, "", library.launcher, "", f"{choice} = []", "",
            f"def {self.function}({tensors}):",
            f"    if not {choice}:",
            f"        {choice}.append(kiln_choose_gemm({self.function!r}, {shape!r}, "
            f'{{"template": {self.function}_template, "library": {self.function}_library}}, '
            f"({tensors},), {len(self.kernel.outputs)}))",
            f"    {choice}[0]({tensors})",
        ])
        return TritonKernel(fused.functions + library.functions, launcher, fused.uses_error_flag or library.uses_error_flag,
                            fused.warmups + library.warmups)

    def _operand(self, buffer: Buffer) -> str:
        """The launcher's view of a product's operand, as the template reads it."""
        pointer, layout = self.pointers[buffer.name], buffer.layout
        return (f"{pointer}.as_strided({tuple(int(s) for s in layout.size)}, {tuple(int(s) for s in layout.stride)}, "
                f"{pointer}.storage_offset() + {int(layout.offset)})")

    # -- scatters -------------------------------------------------------------------------------
    def _scatter(self, nest: LoopNest) -> TritonKernel:
        node = nest.node
        index_type = "i64" if self.wide else "i32"
        launches = []
        init = self.kernel.scatter_init
        if init is not None:  # else the initial values are already in place (kernel.overwrites)
            sizes = [int(s) for s in init.ranges]
            numel, block = math.prod(sizes), min(POINTWISE_BLOCK, next_power_of_2(math.prod(sizes)))
            symbols = list(init.node.index_vars())
            self._program_rows(False)
            for line in _decompose("xindex", symbols, sizes):
                self._emit(line, 1)
            body = self._body(init, {v: X for v in symbols}, {"x": "xmask"}, 1)
            self._emit(body.store_line(nest.name, init.store_index, body.result, X, "[XBLOCK]"), 1)
            jit = self._jit(f"{self.function}_init", [("xnumel", index_type)], {"XBLOCK": block})
            launches.append((jit, _blocks(numel, block), f"{numel}, XBLOCK={block}"))
        sizes = [int(s) for s in node.source_ranges]
        numel = math.prod(sizes)
        if numel == 0:  # no source element: nothing is written, and no index is checked (as eager)
            return self._kernel(launches)
        # Writes that combine with no atomic for them (a product; 16-bit floats, bools, bytes) run
        # one source element at a time in a single program: correct, and slow on a GPU.
        serial = node.mode is not None and (node.mode not in _ATOMIC or node.dtype not in _ATOMIC_DTYPES)
        block = 1 if serial else min(POINTWISE_BLOCK, next_power_of_2(numel))
        symbols = list(node.source_vars())
        depth = 1
        if serial:
            self._emit(f"for xstart in range(0, {numel}):", 1)  # (Triton 3.6's interpreter: no range over an argument)
            self._emit("xindex = xstart + tl.arange(0, XBLOCK)", 2)
            self._emit("xmask = xindex < xnumel", 2)
            depth = 2
        else:
            self._program_rows(False)
        for line in _decompose("xindex", symbols, sizes):
            self._emit(line, depth)
        body = TritonBody(self.pointers, self.buffers, {}, {v: X for v in symbols}, {"x": "xmask"}, "s",
                          loop_extents(node), error_flag="error_flag")
        with use_handler(body):
            target, value = node.scattered()
            if serial:  # the element's current value, combined here
                old = body.load(nest.name, nest.buffer.layout.flat_index(target))
                value = getattr(ops, _SERIAL_COMBINE[node.mode])(old, value)
        self.uses_error_flag |= body.uses_error_flag
        for line in body.lines:
            self._emit(line, depth)
        flat = nest.buffer.layout.flat_index(target) - nest.buffer.layout.offset
        if node.mode is None or serial:
            self._emit(body.store_line(nest.name, flat, value, X, "[XBLOCK]"), depth)
            if serial:
                self._emit("tl.debug_barrier()", depth)
        else:
            dtype = TRITON_DTYPES[node.dtype]
            self._emit(f"{_ATOMIC[node.mode]}({self.pointers[nest.name]} + ({body.index(flat)} + "
                       f"tl.full([XBLOCK], 0, tl.int32)), tl.broadcast_to({value}.to({dtype}), [XBLOCK]), mask=xmask)", 1)
        jit = self._jit(f"{self.function}_scatter", [("xnumel", index_type)], {"XBLOCK": block})
        launches.append((jit, 1 if serial else _blocks(numel, block), f"{numel}, XBLOCK={block}, num_warps=1"))
        return self._kernel(launches)


_DTYPE_OF_POINTER = {pointer: f"torch.{str(dtype).removeprefix('torch.')}" for dtype, pointer in _POINTER_TYPES.items()}


def _tensors_and_constants(arguments: str) -> tuple[str, str]:
    """A launch's arguments split into the tensors (the names first: the kernel's buffers, the
    error flag, a partials buffer) and what follows them (literal sizes and keyword constants,
    the same at every call)."""
    call = ast.parse(f"launch({arguments})", mode="eval").body
    tensors = [a for a in call.args if isinstance(a, ast.Name)]
    if call.args[: len(tensors)] != tensors:
        raise AssertionError(f"a launch's tensors must come before its constants: {arguments}")
    constants = [*call.args[len(tensors):], *call.keywords]
    return ", ".join(t.id for t in tensors), ", ".join(ast.unparse(c) for c in constants)


def _warmup(function: JitFunction, arguments: str) -> str:
    """A launch's arguments as a `warmup` call: each tensor (the jit function's pointer
    arguments, named as at the launch) by its dtype."""
    pointers = {name: _DTYPE_OF_POINTER[kind] for name, kind in function.signature.items() if kind.startswith("*")}
    pointers["kiln_error_flag"] = "torch.int32"  # the launch's name for the `error_flag` argument
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, pointers)) + r")\b(?!=)")
    return f"{function.name}.warmup({pattern.sub(lambda m: pointers[m.group(1)], arguments)}, grid=(1,))"


def _blocks(numel: int, block: int) -> int:
    """Programs for `numel` iterations, `block` per program (0 for none: not launched)."""
    return -(-numel // block)


def _blocks_text(numel: int) -> str:
    return f'-(-{numel} // meta["XBLOCK"])'


def _warps(elements: int) -> int:
    return max(1, min(8, elements // 256))


# Block sizes and warps. The first config is the fixed rule's; `tune` ("default" or "max-autotune",
# the setting backend.autotune on a GPU) adds the candidates Triton's autotuner times against it.
def _pointwise_configs(xnumel: int, tune: str | None) -> list[tuple[dict, int]]:
    block = min(POINTWISE_BLOCK, next_power_of_2(xnumel))
    configs = [({"XBLOCK": block}, _warps(block))]
    if tune == "max-autotune":  # (a pointwise kernel's block matters little: only under max-autotune)
        configs += [({"XBLOCK": b}, _warps(b)) for b in (256, 512, 2048) if b != block and b <= max(256, next_power_of_2(xnumel))]
    return configs


def _reduction_configs(xnumel: int, inner: int, persistent: bool, tune: str | None) -> list[tuple[dict, int]]:
    rblock = min(next_power_of_2(inner), BLOCK_ELEMENTS)
    xblock = max(1, min(next_power_of_2(xnumel), BLOCK_ELEMENTS // rblock))
    configs = [({"XBLOCK": xblock, "RBLOCK": rblock}, _warps(xblock * rblock))]
    if tune is None:
        return configs
    rows = next_power_of_2(xnumel)
    if persistent:  # the row is one block: only the rows per program and the warps vary
        candidates = [(x, rblock) for x in (xblock // 2, xblock * 2) if 1 <= x <= rows and x * rblock <= 2 * BLOCK_ELEMENTS]
    else:
        candidates = [(x, r) for x, r in ((1, 2048), (4, 512), (8, 256)) if x <= rows and r <= next_power_of_2(inner)]
    configs += [({"XBLOCK": x, "RBLOCK": r}, _warps(x * r)) for x, r in candidates if (x, r) != (xblock, rblock)]
    if tune == "max-autotune":
        configs += [({"XBLOCK": xblock, "RBLOCK": rblock}, w) for w in (2, 4, 8) if w != _warps(xblock * rblock)]
    return configs


GEMM_GROUP_ROWS = 8  # rows of tiles per group of the template's tile order


def _gemm_configs(m: int, n: int, kk: int, tune: str | None) -> list[tuple[dict, int, int | None]]:
    """The product template's tiles, warps and pipeline stages. Untuned (the interpreter): 64-wide
    tiles, narrower for a small product. In the default mode the template is only timed against
    the library's product (`_timed_gemm`), so it gets one config, each one more kernel to compile
    at the first call: Hopper's common 128 x 128 tile with K steps of 64 (16-bit operands' wide
    tensor-core instructions) where the product is that large, else the 64-wide tile. Under
    max-autotune it is tuned over the tile shapes Hopper's products commonly run fastest with.
    Each config also says whether its K step divides K (`EVEN_K`: no mask on the K loop) and the
    tile order's group (`GROUP_ROWS`)."""
    fits = [max(16, next_power_of_2(v)) for v in (m, n, kk)]
    first = (dict(zip(("XBLOCK", "RBLOCK", "KBLOCK"), (min(64, f) for f in fits))), 4, None)
    configs, shapes = [first], []
    if tune == "default" and m >= 128 and n >= 128:
        configs, shapes = [], [(128, 128, 64, 8, 3)]
    elif tune == "max-autotune":
        shapes = [(128, 128, 64, 8, 3), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (128, 256, 64, 8, 3),
                  (256, 128, 64, 8, 3), (128, 128, 32, 8, 4), (64, 64, 64, 4, 3), (32, 64, 64, 4, 4),
                  (64, 32, 64, 4, 4), (16, 64, 128, 4, 3)]
    for *tile, warps, stages in shapes:
        blocks = dict(zip(("XBLOCK", "RBLOCK", "KBLOCK"), (min(t, f) for t, f in zip(tile, fits))))
        if all(blocks != c[0] for c in configs):
            configs.append((blocks, warps, stages))
    return [({**blocks, "EVEN_K": int(kk % blocks["KBLOCK"] == 0), "GROUP_ROWS": GEMM_GROUP_ROWS}, warps, stages)
            for blocks, warps, stages in configs]


def _config_text(values: dict, warps: int, stages: int | None = None) -> str:
    return f"triton.Config({values!r}, num_warps={warps}{'' if stages is None else f', num_stages={stages}'})"


def kernel_source(kernel: FusedKernel, function: str, device: str = "cpu", tune: str | None = None,
                  time_gemm: bool = False) -> TritonKernel:
    """`kernel` printed as Triton for graphs on `device` ("cpu": run by Triton's interpreter);
    `tune`: "default" or "max-autotune" for block sizes chosen by Triton's autotuner; `time_gemm`:
    a product kernel chooses at its first call between the template and the library's product
    (kiln/schedule/scheduler.py's `gemm_template_mode`)."""
    return TritonKernelPrinter(kernel, function, device, tune, time_gemm).kernel_source()

