"""A loop body printed as Triton through the ops protocol.

A Triton kernel computes a block of iterations at once: `XBLOCK` outer iterations (the kernel's
shared loops, flattened) and, inside a member's own loop, `RBLOCK` inner ones. Each value is
a block over some of those two axes, its *dims*: {"x"} for a value that varies with the outer
loops (`[XBLOCK, 1]` in a kernel with inner loops, `[XBLOCK]` in one without), {"r"} with the
inner loop (`[1, RBLOCK]`), both, or neither (a one-element block: a constant). The printer
tracks each value's dims so that a load is masked by exactly the lanes its address depends on
(`xmask`, `rmask`), and a store or a reduction broadcasts its value to the member's whole block.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

from kiln.codegen.triton.printer import (BINARY, TRITON_DTYPES, UNARY, round_to, triton_constant,
                                         triton_index)
from kiln.codegen.value_rules import HALF_DTYPES
from kiln.ir.index_bounds import simplify
from kiln.ir.ops import ALL_OPS

Dims = frozenset  # of "x" and "r"
NO_DIMS: Dims = frozenset()
X_DIMS: Dims = frozenset({"x"})


class TritonBody:
    """Prints one member's body. `pointers` maps buffer names to kernel arguments, `locals_`
    maps buffers kept in registers to (variable, dims), `symbol_dims` gives each loop variable
    its axis, `masks` each axis its mask's name; `error_flag` names the argument indirect
    indices report out-of-range values to (None when the kernel has none)."""

    def __init__(self, pointers: dict[str, str], buffers: dict[str, Any], locals_: dict[str, tuple[str, Dims]],
                 symbol_dims: dict[sympy.Symbol, Dims], masks: dict[str, str], prefix: str,
                 extents: dict[sympy.Symbol, sympy.Expr], error_flag: str | None = None,
                 rename: dict[sympy.Symbol, sympy.Symbol] | None = None, shared: dict[str, str] | None = None) -> None:
        self.pointers, self.buffers, self.locals = pointers, buffers, locals_
        self.rename = rename or {}  # the body's inner loop variables -> the block's
        self.symbol_dims = dict(symbol_dims)
        self.masks, self.prefix, self.extents, self.error_flag = masks, prefix, extents, error_flag
        self.lines: list[str] = []
        self.dims: dict[str, Dims] = {}  # value name -> its axes
        # expression -> value; a persistent kernel's members share one, so each input is loaded once
        self._cse: dict[str, str] = shared if shared is not None else {}
        self._count = 0
        self.reduced: tuple[str, torch.dtype, str] | None = None
        self.constants: dict[str, Any] = {}  # value name -> the constant it holds
        self.uses_error_flag = False

    # -- helpers ---------------------------------------------------------------------------
    def _name(self) -> str:
        self._count += 1
        return f"{self.prefix}{self._count - 1}"

    def _emit(self, expr: str, dims: Dims) -> str:
        if expr in self._cse:  # every expression is pure: computed once
            name = self._cse[expr]
            self.dims.setdefault(name, dims)
            return name
        name = self._name()
        self.lines.append(f"{name} = {expr}")
        self._cse[expr], self.dims[name] = name, dims
        return name

    def value_dims(self, *values: str) -> Dims:
        return Dims().union(*(self.dims.get(v, NO_DIMS) for v in values))

    def index_dims(self, expr: sympy.Expr) -> Dims:
        return Dims().union(*(self.symbol_dims.get(s, NO_DIMS) for s in sympy.sympify(expr).free_symbols))

    def mask(self, dims: Dims) -> str | None:
        names = [self.masks[d] for d in ("x", "r") if d in dims]
        return " & ".join(names) if names else None

    def _dtype(self, buffer: str) -> torch.dtype:
        return self.buffers[buffer].layout.dtype

    # -- the protocol ------------------------------------------------------------------------
    def __getattr__(self, name: str) -> Any:
        if name in UNARY:
            return lambda x: self._emit(UNARY[name].format(x), self.value_dims(x))
        if name in BINARY:
            return lambda a, b: self._emit(BINARY[name].format(a, b), self.value_dims(a, b))
        if name in ALL_OPS:  # an op with no Triton spelling: the graph runs through ATen
            return lambda *args: self._unsupported(name)
        raise AttributeError(name)

    def _unsupported(self, name: str) -> str:
        raise NotImplementedError(f"ops.{name} in Triton (libdevice has no such function, nor kiln's Triton helpers)")

    def load(self, buffer: str, index: sympy.Expr) -> str:
        if buffer in self.locals:
            variable, dims = self.locals[buffer]
            self.dims.setdefault(variable, dims)
            return variable
        index = simplify(sympy.sympify(index).xreplace(self.rename) - self.buffers[buffer].layout.offset, self.extents)
        dims = self.index_dims(index)
        offset = triton_index(index)
        if not dims:
            # One element for every lane, loaded as a block of the rows (`xindex * 0`), not as a
            # scalar: Triton's interpreter gives a comparison of scalars the operands' element
            # type, and broadcasting that to a block turns booleans into floats.
            offset, dims = f"{offset} + xindex * 0", X_DIMS
        mask = self.mask(dims)
        text = f"tl.load({self.pointers[buffer]} + {offset}, mask={mask}, other=0)"
        if self._dtype(buffer) in HALF_DTYPES:
            text += ".to(tl.float32)"
        return self._emit(text, dims)

    def index(self, expr: sympy.Expr) -> str:
        """An index over the body's loop variables, simplified by their ranges, as Triton."""
        return triton_index(simplify(sympy.sympify(expr).xreplace(self.rename), self.extents))

    def store_line(self, buffer: str, index: sympy.Expr, value: str, dims: Dims, shape: str) -> str:
        """The store of `value` at `index` over the member's block (`dims`, of shape `shape`)."""
        dtype = self._dtype(buffer)
        if dtype == torch.bool:
            converted = f"({value} != 0)"
        elif dtype == torch.bfloat16:  # rounded first: the interpreter's conversion truncates
            converted = f"kiln_round_bf16({value}.to(tl.float32)).to(tl.bfloat16)"
        else:
            converted = f"{value}.to({TRITON_DTYPES[dtype]})"
        mask = self.mask(dims)
        return (f"tl.store({self.pointers[buffer]} + ({self.index(index)} + tl.full({shape}, 0, tl.int32)), "
                f"tl.broadcast_to({converted}, {shape}){f', mask={mask}' if mask else ''})")

    def store(self, buffer: str, index: sympy.Expr, value: str) -> None:
        raise NotImplementedError("a Triton body's stores are printed by its kernel (store_line)")

    def constant(self, value: Any, dtype: torch.dtype) -> str:
        name = self._emit(triton_constant(value, dtype), NO_DIMS)
        self.constants[name] = value
        return name

    def polygamma(self, n: str, x: str) -> str:
        # A constant order: 0 and 1 are digamma and trigamma, higher ones the Hurwitz zeta function's
        # multiples (kiln_polygamma_n); an order that varies per element is not written in Triton.
        # The helpers are polygamma's entry in kiln/codegen/special_functions.py.
        order = self.constants.get(n)
        if order in (0, 1):
            return self._emit(f"{'kiln_digamma' if order == 0 else 'kiln_trigamma'}({x})", self.value_dims(x))
        if isinstance(order, (int, float)) and order >= 2 and order == int(order):
            return self._emit(f"kiln_polygamma_n({n}, {x})", self.value_dims(x))
        return self._unsupported("polygamma")

    def index_expr(self, expr: sympy.Expr, dtype: torch.dtype) -> str:
        expr = simplify(sympy.sympify(expr).xreplace(self.rename), self.extents)
        if expr.is_Integer:
            return self.constant(int(expr), dtype)
        dims = self.index_dims(expr)
        return self._emit(f"({triton_index(expr)}).to({TRITON_DTYPES[dtype]})", dims)

    def to_dtype(self, value: str, dtype: torch.dtype) -> str:
        dims = self.value_dims(value)
        if dtype == torch.bool:
            return self._emit(f"({value} != 0)", dims)
        if dtype in HALF_DTYPES:  # rounded to 16 bits, held in float32
            return self._emit(round_to(dtype, value), dims)
        return self._emit(f"{value}.to({TRITON_DTYPES[dtype]})", dims)

    def where(self, condition: str, if_true: str, if_false: str) -> str:
        return self._emit(f"tl.where({condition}, {if_true}, {if_false})", self.value_dims(condition, if_true, if_false))

    def indirect_indexing(self, value: str, size: Any) -> sympy.Symbol:
        # Negative values count from the end; out-of-range ones are clamped (memory stays safe)
        # and reported through the error flag, which the wrapper reads after the kernel.
        name = self._name().replace(self.prefix, f"{self.prefix}ind")
        dims = self.value_dims(value)
        size = triton_index(sympy.sympify(size))
        self.lines.append(f"{name} = {value}.to(tl.int64)")
        self.lines.append(f"{name} = tl.where({name} < 0, {name} + {size}, {name})")
        if self.error_flag is not None:
            self.uses_error_flag = True
            bad = f"({name} < 0) | ({name} >= {size})"
            mask = self.mask(dims)
            self.lines.append(f"tl.store({self.error_flag} + {name} * 0, tl.full([], 1, tl.int32), "
                              f"mask=({bad}){f' & {mask}' if mask else ''})")
        self.lines.append(f"{name} = tl.where({name} < 0, 0, tl.where({name} >= {size}, {size} - 1, {name}))")
        symbol = sympy.Symbol(name, integer=True)
        self.symbol_dims[symbol] = dims
        return symbol

    def reduction(self, reduction_type: str, dtype: torch.dtype, value: str) -> str:
        # The kernel folds `value` into its accumulator; the body's result is the accumulator.
        self.reduced = (reduction_type, dtype, value)
        return "acc"


def unprintable_ops() -> frozenset[str]:
    """The `ops` TritonBody has no code for (special functions neither libdevice nor kiln's Triton
    helpers have: NotInTriton in kiln/codegen/special_functions.py): the driver lowers Triton graphs
    without them, as extern calls to ATen."""
    return frozenset(name for name in ALL_OPS if name not in UNARY and name not in BINARY and name not in vars(TritonBody))
