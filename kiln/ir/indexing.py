"""Index arithmetic the IR needs beyond polynomials: floor division (for views that unravel a flat
index). `sympy.Mod` serves for remainders."""

from __future__ import annotations

import sympy


class FloorDiv(sympy.Function):
    """`a // b` for non-negative integer index expressions."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
        if b == 1:
            return a
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) // int(b))
        if a == 0:
            return sympy.Integer(0)
        return None
