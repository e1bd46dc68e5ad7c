"""Bounds of non-negative index expressions over loops, for fusion legality: does a read stay
inside the row its producer wrote in the same outer iteration?"""

from __future__ import annotations

import functools
import math
from typing import Mapping

import sympy

from kiln.ir.indexing import REMAINDERS, FloorDiv, Mod


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
    if isinstance(expr, REMAINDERS) and expr.args[1].is_Integer:
        return int(expr.args[1]) - 1
    if isinstance(expr, (sympy.Min, sympy.Max)):  # a clamped index (cat, padding): Min(195, Max(0, i - 1))
        parts = [max_value(a, extents) for a in expr.args]
        if isinstance(expr, sympy.Max):
            return None if any(p is None for p in parts) else max(parts)
        known = [p for p in parts if p is not None]
        return min(known) if known else None
    if isinstance(expr, FloorDiv) and expr.args[1].is_Integer:
        top = max_value(expr.args[0], extents)
        return None if top is None else top // int(expr.args[1])
    return None


def is_nonnegative(expr: sympy.Expr) -> bool:
    """True when every term is a product of non-negative factors (loop variables, Mod, FloorDiv)."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return expr >= 0
    if expr.is_Symbol or isinstance(expr, (*REMAINDERS, FloorDiv)):
        return True
    if isinstance(expr, sympy.Max):
        return any(is_nonnegative(a) for a in expr.args)
    if isinstance(expr, sympy.Min):
        return all(is_nonnegative(a) for a in expr.args)
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
    if not expr.args or not (expr.has(FloorDiv) or expr.has(*REMAINDERS)):
        return expr
    return _simplified(expr, frozenset(extents.items()))


@functools.lru_cache(maxsize=65536)
def _simplified(expr: sympy.Expr, extents_items: frozenset) -> sympy.Expr:
    """simplify's work, remembered: a chain of reshapes and permutes (a windowed attention's
    window partition) nests the same divisions many times over, and every subexpression is
    simplified again from each place it occurs, and again at each read of the element expression
    (scheduling, then code generation), unless answers are kept."""
    extents = dict(extents_items)
    if not expr.args or not (expr.has(FloorDiv) or expr.has(*REMAINDERS)):
        return expr
    if isinstance(expr, (FloorDiv, *REMAINDERS)):
        return _simplify_div_mod(expr, simplify(expr.args[0], extents), expr.args[1], extents)
    args = [simplify(a, extents) for a in expr.args]
    return _merge_div_mod_pairs(sympy.Add(*args)) if expr.is_Add else expr.func(*args)


def _simplify_div_mod(expr, inner: sympy.Expr, divisor: sympy.Expr, extents) -> sympy.Expr:
    if not divisor.is_Integer or not is_nonnegative(inner):
        return expr.func(inner, divisor)
    d = int(divisor)
    whole, rest = _split_multiples(inner, d)
    top = max_value(rest, extents)
    if top is not None and top < d:
        return whole if isinstance(expr, FloorDiv) else rest
    # rest = g*big + small with g dividing d and 0 <= small < g: (rest // d) = big // (d/g) and
    # rest % d = g*(big % (d/g)) + small. A flattened row index (i1 + 384*i0) // 21504 is i0 // 56.
    for g in _common_factors(rest, d):
        big, small = _split_multiples(rest, g)
        small_top = max_value(small, extents)
        if small_top is None or small_top >= g:
            continue
        if isinstance(expr, FloorDiv):
            return whole + simplify(FloorDiv(big, d // g), extents)
        return g * simplify(Mod(big, d // g), extents) + small
    return whole + FloorDiv(rest, divisor) if isinstance(expr, FloorDiv) else Mod(rest, divisor)


def _common_factors(expr: sympy.Expr, divisor: int) -> list[int]:
    """Divisors of `divisor` (largest first, above 1) that divide some term's coefficient."""
    found = set()
    for term in expr.args if expr.is_Add else (expr,):
        coeff, _ = term.as_coeff_Mul()
        if coeff.is_Integer and int(coeff) > 1:
            g = math.gcd(int(coeff), divisor)
            if g > 1:
                found.add(g)
    return sorted(found, reverse=True)


def _merge_div_mod_pairs(expr: sympy.Expr) -> sympy.Expr:
    """`c*Mod(x, m) + c*m*FloorDiv(x, m)` is `c*x`: a reshape's unravel followed by a re-flatten."""
    if not expr.is_Add:
        return expr
    terms = {}
    for term in expr.args:
        coeff, factor = term.as_coeff_Mul()
        terms[factor] = terms.get(factor, 0) + coeff
    changed = True
    while changed:
        changed = False
        for factor, coeff in list(terms.items()):
            if not isinstance(factor, REMAINDERS):
                continue
            x, m = factor.args
            partner = FloorDiv(x, m)
            if partner in terms and terms[partner] == coeff * m:
                del terms[factor], terms[partner]
                terms[x] = terms.get(x, 0) + coeff
                changed = True
                break
    return sympy.Add(*(c * f for f, c in terms.items()))


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
