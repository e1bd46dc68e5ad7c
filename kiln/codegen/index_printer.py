"""Index expressions (sympy, over loop variables) printed in a target language; the C++ and Triton
printers differ only in spellings, given as an `IndexSpelling`.

Division and remainder of a non-negative operand by a positive one print as the language's
operators; otherwise (sympy reduces a Mod's constant term, which can leave a negative operand,
and C's and Triton's `/`, `//` and `%` round toward zero) as the floor helpers, since index
arithmetic floors.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from kiln.ir.indexing import REMAINDERS, FloorDiv, Mod


@dataclass(frozen=True)
class IndexSpelling:
    language: str  # for error messages
    integer: str  # "{0}L"
    floordiv: str  # "({0} / {1})", operands known non-negative and positive
    mod: str
    floordiv_any_sign: str  # "kiln_floordiv<int64_t>({0}, {1})"
    mod_any_sign: str
    minimum: str  # "std::min<int64_t>({0}, {1})"
    maximum: str


PYTHON_INDEX = IndexSpelling("Python", "{0}", "({0} // {1})", "({0} % {1})", "({0} // {1})", "({0} % {1})",
                             "min({0}, {1})", "max({0}, {1})")  # (Python's // and % floor)


def print_index(expr: sympy.Expr, spelling: IndexSpelling) -> str:
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return spelling.integer.format(int(expr))
    if expr.is_Symbol:
        return expr.name
    if isinstance(expr, (FloorDiv, *REMAINDERS)):
        a, b = (print_index(arg, spelling) for arg in expr.args)
        floor = isinstance(expr, FloorDiv)
        if expr.args[0].is_nonnegative and expr.args[1].is_positive:
            return (spelling.floordiv if floor else spelling.mod).format(a, b)
        return (spelling.floordiv_any_sign if floor else spelling.mod_any_sign).format(a, b)
    if expr.is_Add:
        return "(" + " + ".join(print_index(a, spelling) for a in expr.args) + ")"
    if expr.is_Mul:
        return "(" + " * ".join(print_index(a, spelling) for a in expr.args) + ")"
    if expr.is_Pow and expr.exp.is_Integer and int(expr.exp) > 0:  # a symbolic size squared
        return "(" + " * ".join([print_index(expr.base, spelling)] * int(expr.exp)) + ")"
    if isinstance(expr, (sympy.Min, sympy.Max)):
        form = spelling.minimum if isinstance(expr, sympy.Min) else spelling.maximum
        out = print_index(expr.args[0], spelling)
        for a in expr.args[1:]:
            out = form.format(out, print_index(a, spelling))
        return out
    raise NotImplementedError(f"index expression {expr} ({type(expr).__name__}) in {spelling.language}")
