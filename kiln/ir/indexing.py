"""Index arithmetic the IR needs beyond polynomials: floor division and remainder (for views that
unravel a flat index).

Both are kiln's own functions, which evaluate only what is plain (numbers, a zero operand, a
divisor of 1): `sympy.Mod` tries to simplify every remainder it is built with (polynomial gcds and
sign queries), which a chain of reshapes and permutes pays again on every read of every element
expression (a windowed-attention model's window partitions: most of a minute of its compile).
kiln's own simplification, with the loops' extents, is `kiln/ir/index_bounds.py`'s `simplify`."""

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


class Mod(sympy.Function):
    """`a % b` for non-negative integer index expressions (a positive divisor)."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
        if b == 1 or a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) % int(b))
        return None


# What index code treats as a remainder: kiln's, and sympy's should an expression bring one.
REMAINDERS = (Mod, sympy.Mod)
