"""Symbolic sizes in kiln's index arithmetic: a graph's `SymInt`s as sympy expressions over size
symbols `ks0, ks1, ...`, which kernels take as arguments and the wrapper reads off its inputs.

The capture's ShapeEnv (torch.fx.experimental.symbolic_shapes) names an input's symbolic size
`s0`, `s1`, ... and builds expressions with torch's own sympy functions (`FloorDiv`, `PythonMod`,
`ModularIndexing`...). kiln's IR has its own division and remainder (kiln/ir/indexing.py) and
loop variables `i0`, `r0`; a size symbol is renamed `ks<n>` so that no printed name can meet a
loop variable or a temporary. Sizes an op computed from tensor values (the ShapeEnv's unbacked
`u0`, `u1`...) are not size symbols: no input holds them, so no kernel can be given them.
"""

from __future__ import annotations

import functools
from typing import Any

import sympy
import torch

from kiln.ir.indexing import FloorDiv, Mod

PREFIX = "ks"


def size_symbol(name: str) -> sympy.Symbol:
    """The size symbol for the ShapeEnv's symbol `name` (`s3` -> `ks3`)."""
    return sympy.Symbol(PREFIX + name[1:], integer=True, positive=True)


def is_size_symbol(symbol: Any) -> bool:
    return isinstance(symbol, sympy.Symbol) and symbol.name.startswith(PREFIX) and symbol.name[len(PREFIX):].isdigit()


def _torch_function(expr: sympy.Expr) -> str:
    return type(expr).__name__ if type(expr).__module__.startswith("torch.utils._sympy") else ""


@functools.lru_cache(maxsize=4096)
def from_shape_env(expr: sympy.Expr) -> sympy.Expr:
    """A ShapeEnv expression in kiln's terms; NotImplementedError for a function kiln's index
    arithmetic lacks (the graph is then compiled per size instead)."""
    if expr.is_Integer or expr.is_Rational:
        return expr
    if expr.is_Symbol:
        # Backed sizes of inputs are `s<n>`; anything else (unbacked `u<n>`) keeps its own name.
        return size_symbol(expr.name) if expr.name.startswith("s") and expr.name[1:].isdigit() else expr
    args = [from_shape_env(a) for a in expr.args]
    name = _torch_function(expr)
    if name == "FloorDiv":
        return FloorDiv(*args)
    if name in ("Mod", "PythonMod"):
        return Mod(*args)
    if name == "ModularIndexing":  # (x // d) % m
        return Mod(FloorDiv(args[0], args[1]), args[2])
    if name == "CleanDiv":
        return FloorDiv(*args)
    if name == "CeilDiv":
        return FloorDiv(args[0] + args[1] - 1, args[1])
    if name == "PowByNatural":
        return sympy.Pow(*args)
    if name in ("Max", "Min"):
        return (sympy.Max if name == "Max" else sympy.Min)(*args)
    if name or not (expr.is_Add or expr.is_Mul or expr.is_Pow or isinstance(expr, (sympy.Max, sympy.Min))):
        raise NotImplementedError(f"a size expression with {type(expr).__name__} ({expr})")
    return expr.func(*args)


def size_expr(value: Any) -> Any:
    """A size (an int, a SymInt, or a sympy expression already) as a sympy expression; other
    values are returned as they are."""
    if isinstance(value, torch.SymInt):
        node = value.node
        return from_shape_env(sympy.sympify(node.expr)) if hasattr(node, "expr") else sympy.Integer(int(value))
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return sympy.Integer(value)
    return value


def size_examples(shape_env: Any) -> dict:
    """Each backed size symbol of `shape_env` -> its value in the traced call (torch 2.13 names
    the table `backed_var_to_val`, earlier versions `var_to_val`)."""
    return shape_env.backed_var_to_val if hasattr(shape_env, "backed_var_to_val") else shape_env.var_to_val


def shape_key(val: torch.Tensor) -> tuple:
    """`val`'s sizes to compare shapes by: each an int or, where symbolic, the ShapeEnv's
    expression for it, equal to another size when the expressions are. Comparing the SymInts
    themselves would guard on their values and tie the graph to the sizes it was traced with."""
    return tuple(s if isinstance(s, int) else sympy.sympify(s.node.expr) for s in val.shape)


TYPICAL = 64  # what a heuristic takes a symbolic size to be


def typical(expr: Any) -> int:
    """A number for a heuristic to weigh a size by (loop order, footprints): the size itself when
    static, else its value with every size symbol at TYPICAL (a compile serves every size, so
    no one call's size should decide the code)."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return int(expr)
    value = expr.xreplace({s: sympy.Integer(TYPICAL) for s in expr.free_symbols if is_size_symbol(s)})
    return int(value) if value.is_Integer else TYPICAL


def unbound_symbols(expr: Any) -> set[sympy.Symbol]:
    """Symbols of `expr` that are not size symbols (sizes computed from tensor values)."""
    if not isinstance(expr, sympy.Basic):
        return set()
    return {s for s in expr.free_symbols if not is_size_symbol(s)}
