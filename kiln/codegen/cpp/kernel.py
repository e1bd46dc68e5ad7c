"""One C++ function per fused kernel: shared outer loops (OpenMP-parallel when the work is large),
then each member's inner loops, the innermost one vectorized (include/kiln_vec.h) with a scalar
tail. A graph's kernels are compiled together after `preamble.preamble()`."""

from __future__ import annotations

import math
import re
from typing import Callable

import sympy
import torch

from kiln.codegen.cpp.body import STORAGE_CTYPES, CppBody, value_ctype
from kiln.codegen.cpp.printer import CTYPES, cpp_constant, cpp_index
from kiln.codegen.value_rules import reduction_identity, value_dtype
from kiln.ir import sizes
from kiln.ir.index_bounds import linear_stride
from kiln.ir.nodes import Layout
from kiln.ir.ops import use_handler
from kiln.ir.schedule import FusedKernel, LoopNest, loop_extents

PARALLEL_MIN_WORK = 32768  # elements (times reduction length) below which threads cost more than they save
_SIZE_ARGUMENT = re.compile(rf"\b{sizes.PREFIX}\d+\b")

Size = sympy.Expr  # a trip count: an integer, or an expression over size symbols (kiln/ir/sizes.py)


def _at_least(size: Size, bound: int) -> bool | str:
    """`size >= bound`: known now for an integer size, else the C++ test for run time."""
    size = sympy.sympify(size)
    return int(size) >= bound if size.is_Integer else f"({cpp_index(size)} >= {bound}L)"


def _all(*tests: bool | str) -> bool | str:
    """The conjunction of tests known now (bools) and at run time (C++ strings)."""
    if any(t is False for t in tests):
        return False
    pending = [t for t in tests if t is not True]
    return " && ".join(pending) if pending else True


def _pragma(directive: str, when: bool | str) -> str | None:
    """`directive` when `when` holds: always (True), never (False, None), or under OpenMP's `if`.
    A parallel region asks for kiln's team (kiln_team.h: OpenMP's count, less the threads that
    busy cores cannot run now)."""
    if when is False:
        return None
    if directive.startswith("#pragma omp parallel"):
        directive += " num_threads(kiln::team())"
    return directive if when is True else f"{directive} if({when})"


def _prod(sizes) -> Size:
    return sympy.Mul(*sizes) if sizes else sympy.Integer(1)



_COMBINE = {"sum": "acc + {v}", "prod": "acc * {v}", "max": "kiln_max(acc, {v})", "min": "kiln_min(acc, {v})",
            "any": "acc || {v}", "all": "acc && {v}"}
_VCOMBINE = {"sum": "vacc + {v}", "prod": "vacc * {v}", "max": "kiln::vmax(vacc, {v})", "min": "kiln::vmin(vacc, {v})",
             "any": "vacc || {v}", "all": "vacc && {v}"}
_VCOMBINE_ACCUMULATORS = {"sum": "{a} + {b}", "prod": "{a} * {b}", "max": "kiln::vmax({a}, {b})",
                          "min": "kiln::vmin({a}, {b})", "any": "{a} || {b}", "all": "{a} && {b}"}
_UNROLL = 4
_HORIZONTAL = {"sum": "hsum", "prod": "hprod", "max": "hmax", "min": "hmin", "any": "hany", "all": "hall"}


def _init(kind: str, dtype: torch.dtype) -> str:
    """The reduction's identity (value_rules.py), the ends of a range spelled by std::numeric_limits."""
    identity, ctype = reduction_identity(kind, dtype), CTYPES[dtype]
    if isinstance(identity, float):
        return f"{'-' if identity < 0 else ''}std::numeric_limits<{ctype}>::infinity()"
    if kind.endswith(("max", "min")):
        return f"std::numeric_limits<{ctype}>::{'lowest' if kind.endswith('max') else 'max'}()"
    return cpp_constant(identity, dtype)


class KernelPrinter:
    """Prints one FusedKernel. `lines` is the function; `vectorized` says whether any loop got
    vector code."""

    def __init__(self, kernel: FusedKernel, function: str) -> None:
        self.kernel, self.function = kernel, function
        self.pointers, self.buffers = kernel.argument_names(), kernel.buffers()
        # Locals are named by their member's place in the kernel, never by its buffer: the same
        # layer's kernel elsewhere in the graph (its buffers named otherwise) prints the same
        # text, so it is one function, compiled once (library.py).
        self.locals = {m.name: f"local{k}" for k, m in enumerate(m for m in kernel.members if m.name in kernel.locals)}
        self.vectorized = False
        self.lines: list[str] = []

    def _emit(self, line: str | None, depth: int) -> None:
        if line is not None:  # (a pragma not wanted)
            self.lines.append("  " * depth + line)

    def _body(self, nest: LoopNest, vector_var: sympy.Symbol | None, scalar_locals: bool | None = None) -> CppBody:
        # Members sharing one loop share a scope: each names its temporaries after itself.
        prefix = f"t{self.kernel.members.index(nest)}_"
        if scalar_locals is None:
            scalar_locals = not self.kernel.vectorizes_outer
        printer = CppBody(self.pointers, self.buffers, self.locals, vector_var, prefix, scalar_locals=scalar_locals,
                          extents=loop_extents(nest.node))
        with use_handler(printer):
            printer.result = nest.node.body()
        return printer

    def _result(self, nest: LoopNest, value: str, depth: int, vector: bool, declare_local: bool | None = None) -> None:
        """A member's value for the current iteration: into its local, or stored."""
        if nest.name in self.locals:
            # Members sharing the vector loop declare their local where computed; members with
            # inner loops assign one declared before their block.
            declare = "auto " if (self.kernel.vectorizes_outer if declare_local is None else declare_local) else ""
            self._emit(f"{declare}{self.locals[nest.name]} = {value};", depth)
            return
        printer = CppBody(self.pointers, self.buffers, None, self._vector_var if vector else None)
        ctype = value_ctype(nest.buffer.layout.dtype)
        if vector:
            cast = f"kiln::to_bool({value})" if nest.buffer.layout.dtype == torch.bool else f"kiln::convert<{ctype}>({value})"
        else:
            cast = f"static_cast<{ctype}>({value})"
        printer.store(nest.name, nest.store_index, cast)
        for line in printer.lines:
            self._emit(line, depth)

    def source(self) -> str:
        k = self.kernel
        params = [f"const {STORAGE_CTYPES[b.layout.dtype]}* __restrict__ in{n}" for n, b in enumerate(k.inputs)]
        params += [f"{STORAGE_CTYPES[b.layout.dtype]}* __restrict__ out{n}" for n, b in enumerate(k.outputs)]
        self._function_body()
        # Symbolic sizes are arguments, in order of their names: the same kernel text (and the
        # same compiled function) serves every size.
        used = sorted(set(_SIZE_ARGUMENT.findall("\n".join(self.lines))), key=lambda n: int(n[len(sizes.PREFIX):]))
        self.size_arguments = used
        params += [f"int64_t {name}" for name in used]
        self.lines.insert(0, f'extern "C" void {self.function}({", ".join(params)}) {{')
        self._emit("}", 0)
        return "\n".join(self.lines)

    def _function_body(self) -> None:
        k = self.kernel
        if k.is_scatter:
            self._scatter(k.members[0])
            return
        outer = list(k.outer)
        work = _prod(outer) * sympy.Max(*[_prod(k.inner_ranges(m)) for m in k.members], 1)
        if k.vectorizes_outer and outer:
            self._pointwise_rows(outer, work)
        elif _reduces_across_rows(k):
            self._across_rows(outer, work)
        else:
            depth = self._outer_loops(outer, len(outer), _at_least(work, PARALLEL_MIN_WORK))
            for nest in k.members:
                self._member(nest, depth)
            self._close(depth, 1)

    def _outer_loops(self, sizes: list[Size], count: int, when: bool | str, depth: int = 1) -> int:
        """`count` outer loops, parallel `when` (and over more than one iteration)."""
        if count:
            when = _all(when, _at_least(_prod(sizes[:count]), 2))
            self._emit(_pragma(f"#pragma omp parallel for collapse({count})" if count > 1 else "#pragma omp parallel for", when), depth)
        for d in range(count):
            self._emit(f"for (int64_t i{d} = 0; i{d} < {cpp_index(sizes[d])}; ++i{d}) {{", depth + d)
        return depth + count

    def _close(self, depth: int, down_to: int) -> None:
        for d in range(depth - 1, down_to - 1, -1):
            self._emit("}", d)

    # -- kernels of pointwise members over the same loops: vectorize the last outer loop --------
    def _split_rows(self, outer: list[Size], work: Size) -> tuple[int, bool | str]:
        """The rows' loops, parallel where there are at least 16 rows; (the depth inside them,
        whether the last loop runs in parallel instead). With a symbolic row count the choice is
        made at run time (`_rows_last_loop` then branches in C++ around the last loop's region)."""
        last = len(outer) - 1
        large = _at_least(work, PARALLEL_MIN_WORK)
        rows = _prod(outer[:last])
        many_rows = _at_least(rows, 16)
        depth = self._outer_loops(outer, last, _all(large, many_rows))
        if last == 0:
            return depth, large
        # Fewer than 16 rows make the work large only where a row's share is 1/15 of it: never
        # for a row of a known length below that (a KV cache's head rows of 64 by a symbolic count).
        per_row = sympy.cancel(work / rows)
        if per_row.is_Integer and 15 * int(per_row) < PARALLEL_MIN_WORK:
            return depth, False
        few_rows = not many_rows if isinstance(many_rows, bool) else f"!{many_rows}"
        return depth, _all(large, few_rows)

    def _rows_last_loop(self, last_parallel: bool | str, depth: int, loop: Callable[[int], None]) -> None:
        """`loop(depth)` (the last loop's vector part), parallel `last_parallel`. Tested at run time
        inside the rows' loops, the test is a C++ branch, not OpenMP's `if`: a region whose `if`
        is false still costs its entry (a team of one made and ended, ~0.35 µs with libgomp) on
        every row — a decode step's KV-cache concatenation over 12 x L rows of 64 floats took
        0.7 ms for 0.5 MB that way, 7 µs without."""
        if not isinstance(last_parallel, str) or depth == 1:
            self._emit(_pragma("#pragma omp parallel for", last_parallel), depth)
            loop(depth)
            return
        self._emit(f"if ({last_parallel}) {{", depth)
        self._emit(_pragma("#pragma omp parallel for", True), depth + 1)
        loop(depth + 1)
        self._emit("} else {", depth)
        loop(depth + 1)
        self._emit("}", depth)

    def _pointwise_rows(self, outer: list[Size], work: Size) -> None:
        last = len(outer) - 1
        depth, last_parallel = self._split_rows(outer, work)
        var = sympy.Symbol(f"i{last}", integer=True, nonnegative=True)
        self._vector_var = var
        n = cpp_index(outer[last])

        def vector_part(d: int) -> None:
            self._emit(f"for (int64_t {var} = 0; {var} < {n} - {n} % kiln::L; {var} += kiln::L) {{", d)
            self._members_once(d + 1, var)
            self._emit("}", d)

        self._rows_last_loop(last_parallel, depth, vector_part)
        self._emit(f"for (int64_t {var} = {n} - {n} % kiln::L; {var} < {n}; ++{var}) {{", depth)
        self._members_once(depth + 1, None)
        self._emit("}", depth)
        self.vectorized = self.vectorized or _at_least(outer[last], 4) is not False
        self._close(depth, 1)

    def _members_once(self, depth: int, vector_var: sympy.Symbol | None) -> None:
        for nest in self.kernel.members:
            body = self._body(nest, vector_var)
            for line in body.lines:
                self._emit(line, depth)
            self._result(nest, body.result, depth, vector_var is not None)

    # -- reductions over a non-contiguous dim: vector accumulators along the last outer loop -----
    def _across_rows(self, outer: list[Size], work: Size) -> None:
        last = len(outer) - 1
        depth, last_parallel = self._split_rows(outer, work)
        var = sympy.Symbol(f"i{last}", integer=True, nonnegative=True)
        self._vector_var = var
        n = cpp_index(outer[last])

        def vector_part(d: int) -> None:
            self._emit(f"for (int64_t {var} = 0; {var} < {n} - {n} % kiln::L; {var} += kiln::L) {{", d)
            for nest in self.kernel.members:
                if nest.name in self.locals:
                    dtype = nest.buffer.layout.dtype
                    vtype = "kiln::mask" if dtype == torch.bool else f"kiln::vec<{value_ctype(dtype)}>"
                    self._emit(f"{vtype} {self.locals[nest.name]};", d + 1)
                self._emit("{", d + 1)
                if nest.is_reduction:
                    self._vector_accumulation(nest, var, d + 2)
                else:
                    body = self._body(nest, var, scalar_locals=False)
                    for line in body.lines:
                        self._emit(line, d + 2)
                    self._result(nest, body.result, d + 2, True, declare_local=False)
                self._emit("}", d + 1)
            self._emit("}", d)

        self._rows_last_loop(last_parallel, depth, vector_part)
        self._emit(f"for (int64_t {var} = {n} - {n} % kiln::L; {var} < {n}; ++{var}) {{", depth)
        for nest in self.kernel.members:
            self._member(nest, depth + 1)
        self._emit("}", depth)
        self.vectorized = self.vectorized or _at_least(outer[last], 4) is not False
        self._close(depth, 1)

    def _vector_accumulation(self, nest: LoopNest, var: sympy.Symbol, depth: int) -> None:
        node = nest.node
        kind, ctype = node.reduction_type, value_ctype(node.dtype)
        boolean = node.dtype == torch.bool
        self._emit(f"auto vacc = {'kiln::splat_mask' if boolean else f'kiln::splat<{ctype}>'}({_init(kind, value_dtype(node.dtype))});", depth)
        symbols = self._inner_vars(nest)
        inner_depth = self._scalar_loops(symbols, list(node.reduction_ranges), depth)
        body = self._body(nest, var, scalar_locals=False)
        _, _, value = body.reduced
        for line in body.lines:
            self._emit(line, inner_depth)
        converted = f"kiln::to_bool({value})" if boolean else f"kiln::convert<{ctype}>({value})"
        self._emit(f"vacc = {_VCOMBINE[kind].format(v=converted)};", inner_depth)
        self._close(inner_depth, depth)
        self._result(nest, "vacc", depth, True, declare_local=False)

    # -- scatters: the initial values, then one write per source element ------------------------
    def _scatter(self, nest: LoopNest) -> None:
        init = self.kernel.scatter_init
        if init is not None:  # else the initial values are already in place (kernel.overwrites)
            init_kernel = FusedKernel(self.kernel.name, tuple(init.ranges), [init], set(), self.kernel.inputs,
                                      self.kernel.outputs, self.kernel.overwrites)
            printer = KernelPrinter(init_kernel, self.function)
            printer._function_body()
            self.lines += printer.lines
            self.vectorized = printer.vectorized
        self._scatter_writes(nest)

    def _scatter_writes(self, nest: LoopNest) -> None:
        """Loops over the source; only a loop of disjoint writes runs in parallel (an `omp for`
        inside a parallel region whose threads all run the loops around it: the static schedule
        gives each thread the same share of that loop every time). The innermost loop is
        vectorized where its writes are one run of memory (`_scatter_vector`)."""
        node = nest.node
        symbols, sizes = list(node.source_vars()), list(node.source_ranges)
        if 0 in sizes:
            return  # no source element: nothing is written, and no index is checked (as eager)
        body = CppBody(self.pointers, self.buffers, None, None, "s", extents=loop_extents(node))
        with use_handler(body):
            target, value = node.scattered()
        flat = cpp_index(nest.buffer.layout.flat_index(target) - nest.buffer.layout.offset)
        out = self.pointers[nest.name]
        scalar_write = [f"int64_t at = {flat};", f"{out}[at] = {_scatter_combine(node, f'{out}[at]', value)};"]
        vector = self._scatter_vector(nest, symbols[-1], sizes[-1]) if symbols else None
        bodies = [(body.lines, _loop_levels(body.lines, symbols))]
        if vector is not None:
            bodies.append((vector.lines, _loop_levels(vector.lines, symbols)))
        large = _at_least(_prod(sizes), PARALLEL_MIN_WORK)
        parallel = _disjoint_dim(target, symbols, sizes) if large is not False else None

        def lines_at(level: int, depth: int, of: list = bodies) -> None:
            # What depends on the loop at `level` and on none inside it (0: the loop invariants,
            # constants read once) goes right inside that loop.
            for lines, levels in of:
                for line, line_level in zip(lines, levels):
                    if line_level == level:
                        self._emit(line, depth)

        lines_at(0, 1)
        depth = 1
        if parallel is not None and parallel > 0:
            self._emit(_pragma("#pragma omp parallel", large), depth)
            self._emit("{", depth)
            depth += 1
        last = len(symbols) - 1
        for d, (sym, size) in enumerate(zip(symbols, sizes)):
            if d == parallel:
                self._emit(_pragma("#pragma omp parallel for", large) if d == 0 else "#pragma omp for schedule(static) nowait", depth)
            if d == last and vector is not None:
                break
            self._emit(f"for (int64_t {sym} = 0; {sym} < {cpp_index(size)}; ++{sym}) {{", depth)
            depth += 1
            lines_at(d + 1, depth)
        if vector is None:
            for line in scalar_write:
                self._emit(line, depth)
            self._close(depth, 1)
            return
        # Blocks of L iterations, the last one possibly partial (scalar): one loop, so that an `omp
        # for` over it gives each thread the same blocks every time, tail included.
        sym, n = symbols[-1], cpp_index(sizes[-1])
        self._emit(f"for (int64_t {sym}_block = 0; {sym}_block < {n}; {sym}_block += kiln::L) {{", depth)
        self._emit(f"if ({sym}_block + kiln::L <= {n}) {{", depth + 1)
        self._emit(f"int64_t {sym} = {sym}_block;", depth + 2)
        lines_at(last + 1, depth + 2, bodies[1:])
        self._emit("} else {", depth + 1)
        self._emit(f"for (int64_t {sym} = {sym}_block; {sym} < {n}; ++{sym}) {{", depth + 2)
        lines_at(last + 1, depth + 3, bodies[:1])
        for line in scalar_write:
            self._emit(line, depth + 3)
        self._emit("}", depth + 2)
        self._emit("}", depth + 1)
        self._emit("}", depth)
        self._close(depth, 1)
        self.vectorized = True

    def _scatter_vector(self, nest: LoopNest, var: sympy.Symbol, size: Size) -> CppBody | None:
        """The scatter's body vectorized along its innermost source loop `var`, the write
        included, where consecutive iterations write consecutive elements whatever the indirect
        indices are (those the write depends on are the same in every lane: a KV cache's rows
        written at one position, an embedding's gradient rows); else None. Lanes then write
        distinct elements, each combined with its old value in the order the scalar loops would."""
        node, dtype = nest.node, nest.buffer.layout.dtype
        if _at_least(size, 4) is False or (dtype == torch.bool and node.mode is not None):
            return None
        body = CppBody(self.pointers, self.buffers, None, var, "v", extents=loop_extents(node))
        with use_handler(body):
            target, value = node.scattered()
            index = nest.buffer.layout.flat_index(target)
            if not body.moves_by_one(index):
                return None
            if node.mode is not None:
                old = body.load(nest.name, index)
                value = _VECTOR_SCATTER_COMBINE[node.mode].format(old=old, v=f"kiln::convert<{value_ctype(dtype)}>({value})")
        cast = f"kiln::to_bool({value})" if dtype == torch.bool else f"kiln::convert<{value_ctype(dtype)}>({value})"
        body.store(nest.name, index - nest.buffer.layout.offset, cast)
        return body

    # -- members with their own inner loops -----------------------------------------------------
    def _member(self, nest: LoopNest, depth: int) -> None:
        inner = list(self.kernel.inner_ranges(nest))
        if nest.name in self.locals:
            self._emit(f"{value_ctype(nest.buffer.layout.dtype)} {self.locals[nest.name]};", depth)
        self._emit("{", depth)
        if not inner:
            body = self._body(nest, None)
            for line in body.lines:
                self._emit(line, depth + 1)
            self._result(nest, body.result, depth + 1, False, declare_local=False)  # declared above
        elif nest.is_reduction:
            self._reduction(nest, inner, depth + 1)
        else:
            self._inner_pointwise(nest, inner, depth + 1)
        self._emit("}", depth)

    def _inner_vars(self, nest: LoopNest) -> list[sympy.Symbol]:
        if nest.is_reduction:
            return list(nest.node.reduction_vars())
        return list(nest.node.index_vars())[len(self.kernel.outer):]

    def _scalar_loops(self, symbols, sizes, depth: int) -> int:
        for sym, size in zip(symbols, sizes):
            self._emit(f"for (int64_t {sym} = 0; {sym} < {cpp_index(size)}; ++{sym}) {{", depth)
            depth += 1
        return depth

    def _vector_loop(self, var: sympy.Symbol, size: Size, depth: int, vector_part, scalar_part, start: str = "0") -> None:
        n = cpp_index(size)
        self._emit(f"int64_t {var}_end = {n} - {n} % kiln::L;", depth)
        self._emit(f"for (int64_t {var} = {start}; {var} < {var}_end; {var} += kiln::L) {{", depth)
        vector_part(depth + 1)
        self._emit("}", depth)
        self._emit(f"for (int64_t {var} = {var}_end; {var} < {n}; ++{var}) {{", depth)
        scalar_part(depth + 1)
        self._emit("}", depth)
        self.vectorized = self.vectorized or _at_least(size, 4) is not False

    def _inner_pointwise(self, nest: LoopNest, inner: list[int], depth: int) -> None:
        symbols = self._inner_vars(nest)
        inner_depth = self._scalar_loops(symbols[:-1], inner[:-1], depth)
        self._vector_var = symbols[-1]

        def part(vector: bool):
            def emit(d: int) -> None:
                body = self._body(nest, symbols[-1] if vector else None)
                for line in body.lines:
                    self._emit(line, d)
                self._result(nest, body.result, d, vector)
            return emit

        self._vector_loop(symbols[-1], inner[-1], inner_depth, part(True), part(False))
        self._close(inner_depth, depth)

    def _reduction(self, nest: LoopNest, inner: list[int], depth: int) -> None:
        node = nest.node
        symbols = self._inner_vars(nest)
        kind = self._kind = node.reduction_type
        arg = kind in ("argmax", "argmin")
        acc_dtype = value_dtype(node.src_dtype if arg else node.dtype)  # 16-bit floats accumulate in float32
        ctype = CTYPES[acc_dtype]
        self._emit(f"{ctype} acc = {_init(kind, acc_dtype)};", depth)
        if arg:
            self._emit("int64_t acc_index = 0;", depth)
            inner_depth = self._scalar_loops(symbols, inner, depth)
            body = self._body(nest, None)
            kind_, _, value = body.reduced
            for line in body.lines:
                self._emit(line, inner_depth)
            rflat = cpp_index(Layout.contiguous(inner, acc_dtype).flat_index(symbols))
            better = "kiln_gt" if kind == "argmax" else "kiln_lt"
            self._emit(f"if ({better}({value}, acc)) {{ acc = {value}; acc_index = {rflat}; }}", inner_depth)
            self._close(inner_depth, depth)
            self._result(nest, "acc_index", depth, False)
            return
        boolean = acc_dtype == torch.bool
        identity = f"{'kiln::splat_mask' if boolean else f'kiln::splat<{ctype}>'}({_init(kind, acc_dtype)})"
        self._emit(f"auto vacc = {identity};", depth)
        inner_depth = self._scalar_loops(symbols[:-1], inner[:-1], depth)

        def part(vector: bool, accumulator: str = "vacc"):
            def emit(d: int) -> None:
                body = self._body(nest, symbols[-1] if vector else None)
                _, _, value = body.reduced
                for line in body.lines:
                    self._emit(line, d)
                if vector:
                    converted = f"kiln::to_bool({value})" if boolean else f"kiln::convert<{ctype}>({value})"
                    combined = _VCOMBINE[kind].format(v=converted).replace("vacc", accumulator)
                    self._emit(f"{accumulator} = {combined};", d)
                else:
                    self._emit(f"acc = {_COMBINE[kind].format(v=value)};", d)
            return emit

        var, n = symbols[-1], inner[-1]
        unrolled = _at_least(n, 4 * 16) is not False  # long rows: independent accumulators hide the combine's latency
        if unrolled:
            self._unrolled_accumulation(var, n, inner_depth, part, identity)
        self._vector_loop(var, n, inner_depth, part(True), part(False), start=f"{var}_unrolled" if unrolled else "0")
        self._close(inner_depth, depth)
        self._emit(f"acc = {_COMBINE[kind].format(v=f'kiln::{_HORIZONTAL[kind]}(vacc)')};", depth)
        self._result(nest, "acc", depth, False)

    def _unrolled_accumulation(self, var: sympy.Symbol, size: Size, depth: int, part, identity: str) -> None:
        """Four vectors per step into four accumulators (each block rebinds the loop variable),
        folded into `vacc`; the plain vector loop and the scalar tail finish the row. The extra
        accumulators start from the identity: inside outer reduction loops `vacc` already holds
        earlier rows."""
        for k in range(1, _UNROLL):
            self._emit(f"auto vacc{k} = {identity};", depth)
        n = cpp_index(size)
        self._emit(f"int64_t {var}_unrolled = {n} - {n} % ({_UNROLL} * kiln::L);", depth)
        self._emit(f"for (int64_t {var}_base = 0; {var}_base < {var}_unrolled; {var}_base += {_UNROLL} * kiln::L) {{", depth)
        for k in range(_UNROLL):
            self._emit("{", depth + 1)
            self._emit(f"int64_t {var} = {var}_base + {k} * kiln::L;", depth + 2)
            part(True, "vacc" if k == 0 else f"vacc{k}")(depth + 2)
            self._emit("}", depth + 1)
        self._emit("}", depth)
        for k in range(1, _UNROLL):
            self._emit(f"vacc = {_VCOMBINE_ACCUMULATORS[self._kind].format(a='vacc', b=f'vacc{k}')};", depth)


def _disjoint_dim(target: tuple[sympy.Expr, ...], symbols: list[sympy.Symbol], sizes: list[int]) -> int | None:
    """The outermost source loop whose iterations write disjoint elements: one whose variable is,
    by itself, the target's index in some dim (the columns of an index_put into rows, every dim
    but `dim` of a scatter). Threads splitting that loop never write the same element, whatever
    the indirect indices are; a loop feeding only indirect indices may hit duplicates."""
    for d, (sym, size) in enumerate(zip(symbols, sizes)):
        if _at_least(size, 2) is not False and any(t == sym for t in target):
            return d
    return None


def _unit_strides(nest: LoopNest, var: sympy.Symbol) -> int:
    return sum(1 for _, index in nest.reads if linear_stride(index, var) == 1)


def _reduces_across_rows(kernel: FusedKernel) -> bool:
    """Every member computes one value per outer index, and the reductions read contiguously
    along the last outer loop rather than along their own innermost loop."""
    if not kernel.outer or any(len(m.ranges) != len(kernel.outer) for m in kernel.members):
        return False
    reductions = [m for m in kernel.members if m.is_reduction]
    if not reductions or any(m.node.reduction_type in ("argmax", "argmin") for m in reductions):
        return False
    last = sympy.Symbol(f"i{len(kernel.outer) - 1}", integer=True, nonnegative=True)
    return all(_unit_strides(m, last) > _unit_strides(m, m.node.reduction_vars()[-1]) for m in reductions)


def _loop_levels(lines: list[str], symbols: list[sympy.Symbol]) -> list[int]:
    """For each scalar body line (`auto t = expr;`), the loop it belongs in: 0 outside all loops,
    d + 1 inside loop d, the innermost loop whose variable it uses directly or through earlier
    lines. An embedding backward's row index is then read once per row, not once per element.
    (Lines only read inputs, never the scatter's output, so moving them out of loops is safe.)"""
    level_of = {str(s): d + 1 for d, s in enumerate(symbols)}
    innermost, levels = len(symbols), []
    for line in lines:
        left, sep, right = line.partition(" = ")
        if not sep:
            levels.append(innermost)
            continue
        level = max((level_of.get(t, 0) for t in re.findall(r"[A-Za-z_]\w*", right)), default=0)
        level_of[left.split()[-1]] = level
        levels.append(level)
    return levels


_SCATTER_COMBINE = {None: "{v}", "sum": "{old} + {v}", "prod": "{old} * {v}", "max": "kiln_max({old}, {v})",
                    "min": "kiln_min({old}, {v})"}


_VECTOR_SCATTER_COMBINE = {"sum": "({old} + {v})", "prod": "({old} * {v})", "max": "kiln::vmax({old}, {v})",
                           "min": "kiln::vmin({old}, {v})"}


def _scatter_combine(node, target: str, value: str) -> str:
    """The new value of the element `target` in the value type (16-bit floats combine in float32)."""
    ctype = value_ctype(node.dtype)
    combined = _SCATTER_COMBINE[node.mode].format(old=f"static_cast<{ctype}>({target})", v=f"static_cast<{ctype}>({value})")
    return f"static_cast<{ctype}>({combined})"


def kernel_source(kernel: FusedKernel, function: str) -> tuple[str, bool, list[str]]:
    """The kernel's C++ function named `function`, whether it has vector loops, and the size
    symbols it takes after its pointers (kiln/ir/sizes.py), in order."""
    printer = KernelPrinter(kernel, function)
    return printer.source(), printer.vectorized, printer.size_arguments

