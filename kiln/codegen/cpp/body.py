"""A loop body printed as C++ through the ops protocol, scalar or vectorized along one loop.

With `vector_var` set, values are `kiln::vec<T>` (or `kiln::mask` for booleans, see
include/kiln_vec.h) covering the L consecutive iterations `vector_var .. vector_var+L-1`:
a load whose index moves by 1 with that variable is one vector load, by 0 a broadcast, anything
else (strides, div/mod, indirect indices) a lane-by-lane gather. Ops with a vector form use it;
the rest apply the scalar spelling (printer.py's tables) lane by lane, so every body vectorizes.

A vector value that is the same in every lane (built from broadcasts only) also keeps its scalar
spelling: an indirect index taken from it (an embedding's token id, per row) is one index for
the whole vector, so the rows it selects load contiguously instead of lane by lane.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import sympy
import torch

from kiln.codegen.cpp.printer import _BINARY, _UNARY, CTYPES, cpp_constant, cpp_index
from kiln.codegen.value_rules import value_dtype
from kiln.native import INCLUDE
from kiln.ir.index_bounds import linear_stride, simplify

@functools.cache
def vector_math() -> frozenset[str]:
    """Ops with a vector algorithm `kiln_v<op>` in include/kiln_vec_math.h."""
    header = INCLUDE / "kiln_vec_math.h"
    text = header.read_text() if header.exists() else ""
    return frozenset(re.findall(r"\bkiln_v(\w+)\s*\(", text))


# Vector spellings of ops that are operators or kiln_vec.h helpers; others use kiln_v<op> when
# the math header has it, else the scalar spelling lane by lane.
VEC_UNARY = {
    "neg": "(-{0})", "relu": "kiln::vrelu({0})", "logical_not": "(!{0})",
}  # fmt: skip
VEC_BINARY = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "truediv": "({0} / {1})",
    "maximum": "kiln::vmax({0}, {1})", "minimum": "kiln::vmin({0}, {1})",
    "eq": "kiln::veq({0}, {1})", "ne": "kiln::vne({0}, {1})", "lt": "kiln::vlt({0}, {1})",
    "le": "kiln::vle({0}, {1})", "gt": "kiln::vgt({0}, {1})", "ge": "kiln::vge({0}, {1})",
    "logical_and": "({0} && {1})", "logical_or": "({0} || {1})",
}  # fmt: skip


HALF = {torch.bfloat16: "bf16", torch.float16: "fp16"}  # HALF_DTYPES (value_rules.py), by their helpers' suffix
STORAGE_CTYPES = {**CTYPES, torch.bfloat16: "kiln_bf16", torch.float16: "kiln_fp16"}


def value_ctype(dtype: torch.dtype) -> str:
    return CTYPES[value_dtype(dtype)]


_LAST_LANE = sympy.Symbol("kiln::L", integer=True, positive=True) - 1


def _clamped_run(index: sympy.Expr, var: sympy.Symbol, lane_symbols: set[sympy.Symbol]) -> bool:
    """Is `index` `a + clamp(var + b)`: one chain of Min/Max (constant bounds along `var`) around
    a term moving by 1 with `var`? Along the lanes it then rises by 0 or 1 each step, so its
    ends tell whether the lanes are contiguous (ends L-1 apart) or all one element (ends equal)."""
    if index.free_symbols & lane_symbols:
        return False
    chains = [t for t in (index.args if index.is_Add else (index,)) if var in t.free_symbols]
    if len(chains) != 1 or not isinstance(chains[0], (sympy.Min, sympy.Max)):
        return False
    term = chains[0]
    while isinstance(term, (sympy.Min, sympy.Max)):
        moving = [a for a in term.args if var in a.free_symbols]
        if len(moving) != 1:
            return False
        term = moving[0]
    return linear_stride(term, var) == 1


class CppBody:
    """Prints one loop body; `pointers` maps buffer names to C++ pointers (at the tensor's first
    element), `locals` maps buffers kept in registers to their variable names."""

    def __init__(self, pointers: dict[str, str], buffers: dict[str, Any], locals_: dict[str, str] | None = None,
                 vector_var: sympy.Symbol | None = None, prefix: str = "tmp", scalar_locals: bool = True,
                 extents: dict[sympy.Symbol, sympy.Expr] | None = None) -> None:
        self.extents = extents or {}  # loop variables' trip counts, to simplify indices
        self.pointers, self.buffers, self.locals = pointers, buffers, locals_ or {}
        # Locals computed once per outer iteration are scalars, broadcast in vector bodies; locals
        # of members sharing the vector loop are already vectors.
        self.scalar_locals = scalar_locals
        self.vector_var = vector_var
        self.prefix = prefix
        self.lines: list[str] = []
        self._count = 0
        self._cse: dict[str, str] = {}
        self.vector_symbols: set[sympy.Symbol] = set()  # indirect indices that differ per lane
        self._uniform: dict[str, str] = {}  # vector value equal in every lane -> its scalar spelling
        # Values holding exactly a 16-bit float (loaded from memory, or rounded): rounding them
        # again would change nothing (lowering/values.py LOW_PRECISION).
        self._exact: dict[str, torch.dtype] = {}
        self.reduced: tuple[str, torch.dtype, str] | None = None

    # -- helpers ---------------------------------------------------------------------------
    def _name(self) -> str:
        self._count += 1
        return f"{self.prefix}{self._count - 1}"

    def _emit(self, expr: str) -> str:
        # Inlined loaders repeat subexpressions (gelu reads its input twice); every expression
        # here is pure, so each is computed once.
        if expr in self._cse:
            return self._cse[expr]
        name = self._name()
        self.lines.append(f"auto {name} = {expr};")
        self._cse[expr] = name
        return name

    @property
    def vectorized(self) -> bool:
        return self.vector_var is not None

    def _lane_varying(self, expr: sympy.Expr) -> bool:
        return bool(expr.free_symbols & ({self.vector_var} | self.vector_symbols))

    def _at_lane(self, expr: sympy.Expr) -> str:
        """`expr` for lane `l` of the current vector (for lambdas over lanes)."""
        subs = {self.vector_var: self.vector_var + sympy.Symbol("l", integer=True, nonnegative=True)}
        subs.update({s: sympy.Symbol(f"{s.name}[l]", integer=True) for s in self.vector_symbols})
        return cpp_index(sympy.sympify(expr).xreplace(subs))

    def _stride(self, expr: sympy.Expr) -> sympy.Expr | None:
        """The index's step per lane when it is affine in the vector variable, else None."""
        if expr.free_symbols & self.vector_symbols:
            return None
        step = linear_stride(expr, self.vector_var)
        return step if step is not None and step.is_Integer else None

    def moves_by_one(self, index: sympy.Expr) -> bool:
        """Does `index` step by one element from lane to lane (the lanes one run of memory)?"""
        return self._stride(simplify(sympy.sympify(index), self.extents)) == 1

    def _dtype(self, buffer: str) -> torch.dtype:
        return self.buffers[buffer].layout.dtype

    # -- the protocol ------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name in _UNARY:
            return lambda x: self._op(self._unary(name, x), _UNARY[name], x)
        if name in _BINARY:
            return lambda a, b: self._op(self._binary(name, a, b), _BINARY[name], a, b)
        raise AttributeError(name)

    def _op(self, expr: str, scalar_form: str, *operands: str) -> str:
        # (Not for ops spelled with a lambda: C++17 allows none inside decltype.)
        if self.vectorized and operands and all(o in self._uniform for o in operands) and "[&]" not in expr:
            # Every lane the same (conditions on the outer loops, as padding's bounds): computed
            # once as a scalar and broadcast, with the vector op's type (`decltype` evaluates
            # nothing). In vectors, the int64 compares and masks of a 64-channel pad ran 8x slower
            # than eager's pad.
            scalar = scalar_form.format(*(self._uniform[o] for o in operands))
            return self._set_uniform(self._emit(f"kiln::splat_as<decltype({expr})>({scalar})"), scalar)
        name = self._emit(expr)
        if self.vectorized and all(o in self._uniform for o in operands):
            self._set_uniform(name, scalar_form.format(*(self._uniform[o] for o in operands)))
        return name

    def _set_uniform(self, name: str, scalar: str) -> str:
        if len(scalar) < 2000:  # long chains are not worth carrying
            self._uniform.setdefault(name, f"({scalar})")
        return name

    def _broadcast(self, scalar: str, dtype: torch.dtype) -> str:
        """A vector of `scalar` in every lane (remembered as uniform), or the scalar itself."""
        if not self.vectorized:
            return self._emit(scalar)
        return self._set_uniform(self._emit(self._splat(scalar, dtype)), scalar)

    def _unary(self, name: str, x: str) -> str:
        if not self.vectorized:
            return _UNARY[name].format(x)
        if name in VEC_UNARY:
            return VEC_UNARY[name].format(x)
        if name in vector_math():
            return f"kiln_v{name}({x})"
        return f"kiln::map([&](auto a) {{ return {_UNARY[name].format('a')}; }}, {x})"

    def _binary(self, name: str, a: str, b: str) -> str:
        if not self.vectorized:
            return _BINARY[name].format(a, b)
        if name in VEC_BINARY:
            return VEC_BINARY[name].format(a, b)
        if name in vector_math():
            return f"kiln_v{name}({a}, {b})"
        return f"kiln::map2([&](auto a, auto b) {{ return {_BINARY[name].format('a', 'b')}; }}, {a}, {b})"

    def load(self, buffer: str, index: sympy.Expr) -> str:
        value = self._load(buffer, index)
        if self._dtype(buffer) in HALF and buffer not in self.locals:  # locals are unrounded
            self._exact[value] = self._dtype(buffer)
        return value

    def _load(self, buffer: str, index: sympy.Expr) -> str:
        dtype = self._dtype(buffer)
        if buffer in self.locals:
            local = self.locals[buffer]
            return self._broadcast(local, dtype) if self.vectorized and self.scalar_locals else local
        index = simplify(sympy.sympify(index) - self.buffers[buffer].layout.offset, self.extents)
        ptr = self.pointers[buffer]
        widen = "float" if dtype in HALF else ""
        if not self.vectorized or not self._lane_varying(index):
            scalar = f"{widen}({ptr}[{cpp_index(index)}])" if widen else f"{ptr}[{cpp_index(index)}]"
            return self._broadcast(scalar, dtype)
        boolean = dtype == torch.bool
        if self._stride(index) == 1:
            if dtype in HALF:
                return self._emit(f"kiln::load_{HALF[dtype]}({ptr} + {cpp_index(index)})")
            return self._emit(f"kiln::load_mask({ptr} + {cpp_index(index)})" if boolean
                              else f"kiln::load<{CTYPES[dtype]}>({ptr} + {cpp_index(index)})")
        lane = f"[&](int l) {{ return {widen}({ptr}[{self._at_lane(index)}]); }}"
        gather = f"kiln::lanes_mask({lane})" if boolean else f"kiln::lanes<{value_ctype(dtype)}>({lane})"
        if not boolean and dtype not in HALF and _clamped_run(index, self.vector_var, self.vector_symbols):
            return self._emit(self._clamped_load(ptr, index, dtype, gather))
        return self._emit(gather)

    def _clamped_load(self, ptr: str, index: sympy.Expr, dtype: torch.dtype, gather: str) -> str:
        """A load at a clamped run (cat, padding): the vector's lanes are one run of memory, one
        element repeated (all clamped to one end) or, at the edge, a mix of both (gathered)."""
        first = self._emit(f"static_cast<int64_t>({cpp_index(index)})")
        last = self._emit(f"static_cast<int64_t>({cpp_index(index.xreplace({self.vector_var: self.vector_var + _LAST_LANE}))})")
        ctype = CTYPES[dtype]
        return (f"({last} - {first} == kiln::L - 1 ? kiln::load<{ctype}>({ptr} + {first}) : "
                f"{last} == {first} ? kiln::splat<{ctype}>({ptr}[{first}]) : {gather})")

    def _splat(self, scalar: str, dtype: torch.dtype) -> str:
        return f"kiln::splat_mask({scalar})" if dtype == torch.bool else f"kiln::splat<{value_ctype(dtype)}>({scalar})"

    def store(self, buffer: str, index: sympy.Expr, value: str) -> None:
        ptr = self.pointers[buffer]
        index = simplify(sympy.sympify(index), self.extents)
        if not self.vectorized:
            self.lines.append(f"{ptr}[{cpp_index(index)}] = {value};")
        elif self._stride(index) == 1:
            dtype = self._dtype(buffer)
            store = f"store_{HALF[dtype]}" if dtype in HALF else "store"
            self.lines.append(f"kiln::{store}({ptr} + {cpp_index(index)}, {value});")
        else:
            self.lines.append(f"kiln::scatter({value}, [&](int l) {{ return &{ptr}[{self._at_lane(index)}]; }});")

    def constant(self, value: Any, dtype: torch.dtype) -> str:
        scalar = cpp_constant(value, value_dtype(dtype))
        if dtype in HALF:
            scalar = f"kiln_round_{HALF[dtype]}({scalar})"
        return self._broadcast(scalar, dtype)

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> str:
        expr, ctype = simplify(sympy.sympify(expr), self.extents), value_ctype(dtype)
        scalar = f"static_cast<{ctype}>({cpp_index(expr)})"
        if not self.vectorized or not self._lane_varying(expr):
            return self._broadcast(scalar, dtype)
        step = self._stride(expr)
        if step is not None:
            return self._emit(f"kiln::iota<{ctype}>({scalar}, {ctype}({int(step)}))")
        return self._emit(f"kiln::lanes<{ctype}>([&](int l) {{ return static_cast<{ctype}>({self._at_lane(expr)}); }})")

    def to_dtype(self, value: str, dtype: torch.dtype) -> str:
        if dtype in HALF:
            if self._exact.get(value) == dtype:
                return value
            self._exact[rounded := self._to_dtype(value, dtype)] = dtype
            return rounded
        return self._to_dtype(value, dtype)

    def _to_dtype(self, value: str, dtype: torch.dtype) -> str:
        cast = f"static_cast<{value_ctype(dtype)}>({{0}})"
        scalar_form = f"kiln_round_{HALF[dtype]}({cast})" if dtype in HALF else cast
        if not self.vectorized:
            return self._emit(scalar_form.format(value))
        if dtype == torch.bool:
            return self._op(f"kiln::to_bool({value})", scalar_form, value)
        cast = f"kiln::convert<{value_ctype(dtype)}>({value})"
        return self._op(f"kiln::round_{HALF[dtype]}({cast})" if dtype in HALF else cast, scalar_form, value)

    def indirect_indexing(self, value: str, size: Any) -> sympy.Symbol:
        # Out-of-range indices are clamped (memory stays safe) and flagged; the wrapper raises.
        name = self._name().replace(self.prefix, f"{self.prefix}ind")  # unique among fused members
        size = cpp_index(sympy.sympify(size))
        symbol = sympy.Symbol(name, integer=True)
        if self.vectorized and value in self._uniform:  # one index for every lane
            self.lines.append(f"int64_t {name} = kiln_index(static_cast<int64_t>({self._uniform[value]}), {size});")
        elif self.vectorized:
            self.lines.append(f"auto {name} = kiln::vindex({value}, {size});")
            self.vector_symbols.add(symbol)
        else:
            self.lines.append(f"int64_t {name} = kiln_index(static_cast<int64_t>({value}), {size});")
        return symbol

    def where(self, condition: str, if_true: str, if_false: str) -> str:
        if self.vectorized:
            return self._op(f"kiln::select({condition}, {if_true}, {if_false})", "({0} ? {1} : {2})",
                            condition, if_true, if_false)
        return self._emit(f"({condition} ? {if_true} : {if_false})")

    def reduction(self, reduction_type: str, dtype: torch.dtype, value: str) -> str:
        # The kernel folds `value` into its accumulator; the body's result is the accumulator.
        self.reduced = (reduction_type, dtype, value)
        return "acc"


def unprintable_ops() -> frozenset[str]:
    """What the C++ printer has no code for: the `welford` reduction (the lowering computes a
    variance's mean first instead: a C++ kernel's row is in cache for the second pass)."""
    return frozenset({"welford"})
