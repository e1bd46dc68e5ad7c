"""C++ spellings of the ops protocol's scalar ops, the C type of each dtype, constants and index
expressions; kiln/codegen/cpp/body.py prints loop bodies with them (and lane by lane in vectors).

Values are computed in the IR's dtypes; C++ types come from `CTYPES`. Index expressions are
sympy, printed by `cpp_index` (non-negative, so `/` and `%` are floor division and modulo).
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

from kiln.codegen.index_printer import IndexSpelling, print_index
from kiln.codegen.special_functions import SPECIAL_FUNCTIONS

CTYPES = {
    torch.float32: "float", torch.float64: "double", torch.int64: "int64_t", torch.int32: "int32_t",
    torch.int16: "int16_t", torch.int8: "int8_t", torch.uint8: "uint8_t", torch.bool: "bool",
}  # fmt: skip

_UNARY = {
    "neg": "-({0})", "abs": "std::abs({0})", "exp": "std::exp({0})", "expm1": "std::expm1({0})",
    "log": "std::log({0})", "log1p": "std::log1p({0})", "sqrt": "std::sqrt({0})",
    "rsqrt": "(1 / std::sqrt({0}))", "reciprocal": "(1 / ({0}))", "sin": "std::sin({0})",
    "cos": "std::cos({0})", "tanh": "std::tanh({0})", "sigmoid": "(1 / (1 + std::exp(-({0}))))",
    "erf": "std::erf({0})", "relu": "std::max({0}, decltype({0})(0))", "floor": "std::floor({0})",
    "ceil": "std::ceil({0})", "logical_not": "!({0})", "sign": "decltype({0})((({0}) > 0) - (({0}) < 0))",
    "tan": "std::tan({0})", "asin": "std::asin({0})", "acos": "std::acos({0})", "atan": "std::atan({0})",
    "sinh": "std::sinh({0})", "cosh": "std::cosh({0})", "asinh": "std::asinh({0})",
    "acosh": "std::acosh({0})", "atanh": "std::atanh({0})", "exp2": "std::exp2({0})",
    "log2": "std::log2({0})", "log10": "std::log10({0})", "erfc": "std::erfc({0})",
    "lgamma": "std::lgamma({0})", "trunc": "std::trunc({0})", "round": "std::nearbyint({0})",
    "signbit": "std::signbit({0})",
    # x ^ all-ones flips every bit and, for bool, is logical not (~true would be -2, also true).
    "bitwise_not": "decltype({0})({0} ^ decltype({0})(-1))",
}  # fmt: skip
_BINARY = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "truediv": "({0} / {1})",
    "pow": "std::pow({0}, {1})", "maximum": "kiln_max({0}, {1})", "minimum": "kiln_min({0}, {1})",
    "atan2": "std::atan2({0}, {1})", "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})",
    "le": "({0} <= {1})", "gt": "({0} > {1})", "ge": "({0} >= {1})", "logical_and": "({0} && {1})",
    "logical_or": "({0} || {1})", "floordiv": "kiln_floordiv({0}, {1})", "remainder": "kiln_remainder({0}, {1})",
    "fmod": "std::fmod({0}, {1})", "hypot": "std::hypot({0}, {1})", "copysign": "std::copysign({0}, {1})",
    # C++ promotes narrow integers to int; the cast gives the operands' type back, as eager's kernels.
    "bitwise_and": "decltype({0})({0} & {1})", "bitwise_or": "decltype({0})({0} | {1})",
    "bitwise_xor": "decltype({0})({0} ^ {1})",
    # Shifts outside [0, bits) are undefined in C++; eager gives 0 (or -1 for negatives shifted right).
    "bitwise_left_shift": "(({1}) < 0 || ({1}) >= decltype({1})(8 * sizeof({0})) ? decltype({0})(0)"
                          " : decltype({0})(static_cast<std::make_unsigned_t<decltype({0})>>({0}) << ({1})))",
    "bitwise_right_shift": "(({1}) < 0 || ({1}) >= decltype({1})(8 * sizeof({0})) ? decltype({0})({0} < 0 ? -1 : 0)"
                           " : decltype({0})({0} >> ({1})))",
}  # fmt: skip

# The special functions: their C++ is kiln/codegen/special_functions.py's, beside their Triton.
for _function in SPECIAL_FUNCTIONS.values():
    (_UNARY if _function.arity == 1 else _BINARY)[_function.op] = _function.cpp_call
_BINARY.update(rand="kiln_rand(int64_t({0}), int64_t({1}))")  # float32, include/kiln_scalar.h


CPP_INDEX = IndexSpelling("C++", "{0}L", "({0} / {1})", "({0} % {1})", "kiln_floordiv<int64_t>({0}, {1})",
                          "kiln_remainder<int64_t>({0}, {1})", "std::min<int64_t>({0}, {1})", "std::max<int64_t>({0}, {1})")


def cpp_index(expr: sympy.Expr) -> str:
    """A non-negative integer index expression as C++ (int64_t arithmetic)."""
    return print_index(expr, CPP_INDEX)


def cpp_constant(value: Any, dtype: torch.dtype) -> str:
    ctype = CTYPES[dtype]
    if isinstance(value, bool) or dtype == torch.bool:
        return "true" if value else "false"
    if isinstance(value, float):
        if value != value:
            return f"std::numeric_limits<{ctype}>::quiet_NaN()"
        if value in (float("inf"), float("-inf")):
            return f"{'-' if value < 0 else ''}std::numeric_limits<{ctype}>::infinity()"
        return f"{ctype}({value!r})"
    return f"{ctype}({int(value)}L)"
