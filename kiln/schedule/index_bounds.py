"""Bounds of non-negative index expressions over loops, for fusion legality: does a read stay
inside the row its producer wrote in the same outer iteration?"""

from __future__ import annotations

from typing import Mapping

import sympy

from kiln.ir.indexing import FloorDiv


def max_value(expr: sympy.Expr, extents: Mapping[sympy.Symbol, sympy.Expr]) -> int | None:
    """The largest value of `expr` with each symbol in [0, extent), or None when unknown."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        extent = extents.get(expr)
        return int(extent) - 1 if extent is not None and sympy.sympify(extent).is_Integer else None
    if expr.is_Add or expr.is_Mul:
        parts = [max_value(a, extents) for a in expr.args]
        if any(p is None for p in parts):
            return None
        if expr.is_Add:
            return sum(parts)
        if any(a.is_Integer and a < 0 for a in expr.args):
            return None
        out = 1
        for p in parts:
            out *= p
        return out
    if isinstance(expr, sympy.Mod) and expr.args[1].is_Integer:
        return int(expr.args[1]) - 1
    if isinstance(expr, FloorDiv) and expr.args[1].is_Integer:
        top = max_value(expr.args[0], extents)
        return None if top is None else top // int(expr.args[1])
    return None


def is_nonnegative(expr: sympy.Expr) -> bool:
    """True when every term is a product of non-negative factors (loop variables, Mod, FloorDiv)."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return expr >= 0
    if expr.is_Symbol or isinstance(expr, (sympy.Mod, FloorDiv)):
        return True
    if expr.is_Add or expr.is_Mul:
        return all(is_nonnegative(a) for a in expr.args)
    return False


def linear_stride(expr: sympy.Expr, var: sympy.Symbol) -> sympy.Expr | None:
    """How much `expr` moves per step of `var`: 0 when it does not use it, the coefficient when
    `var` appears only as a plain term (`3*var`, `s0*var`), None otherwise (inside Mod, FloorDiv,
    Min, or multiplied by another loop variable). Much cheaper than sympy.diff."""
    expr = sympy.sympify(expr)
    if var not in expr.free_symbols:
        return sympy.Integer(0)
    coeff = sympy.Integer(0)
    for term in expr.args if expr.is_Add else (expr,):
        if var not in term.free_symbols:
            continue
        if term == var:
            coeff += 1
        elif term.is_Mul and var in term.args and all(var not in a.free_symbols for a in term.args if a != var):
            coeff += term / var
        else:
            return None
    return coeff


def simplify(expr: sympy.Expr, extents: Mapping[sympy.Symbol, sympy.Expr]) -> sympy.Expr:
    """`expr` with floor divisions and remainders removed where the loop ranges allow: views
    (reshape) index through `FloorDiv(flat, n)` and `Mod(flat, n)`, which are often `0` or `flat`
    inside the loops, and plain affine indices vectorize where div/mod would gather."""
    expr = sympy.sympify(expr)
    if not expr.args or not (expr.has(FloorDiv) or expr.has(sympy.Mod)):
        return expr
    if isinstance(expr, (FloorDiv, sympy.Mod)):
        inner, divisor = simplify(expr.args[0], extents), expr.args[1]
        if not divisor.is_Integer or not is_nonnegative(inner):
            return expr.func(inner, divisor)
        whole, rest = _split_multiples(inner, int(divisor))
        top = max_value(rest, extents)
        if isinstance(expr, FloorDiv):
            return whole + (sympy.Integer(0) if top is not None and top < divisor else FloorDiv(rest, divisor))
        return rest if top is not None and top < divisor else sympy.Mod(rest, divisor)
    return expr.func(*(simplify(a, extents) for a in expr.args))


def _split_multiples(expr: sympy.Expr, divisor: int) -> tuple[sympy.Expr, sympy.Expr]:
    """(q, r) with expr = divisor*q + r, q gathering the terms whose coefficient divisor divides."""
    whole, rest = sympy.Integer(0), sympy.Integer(0)
    for term in expr.args if expr.is_Add else (expr,):
        coeff, factor = term.as_coeff_Mul()
        if coeff.is_Integer and int(coeff) % divisor == 0:
            whole += (int(coeff) // divisor) * factor
        else:
            rest += term
    return whole, rest
