"""Triton spellings of the ops protocol's scalar ops, Triton's name for each dtype, constants and
index expressions; kiln/codegen/triton/body.py prints loop bodies with them.

Every value in a Triton kernel is a block (a tensor of lanes), so one spelling serves the whole
body: there is no scalar/vector split as in the C++ printer. Ops whose meaning depends on the
operands' dtype (NaN-propagating max, floor division, sign) call the `kiln_*` helpers of the
kernel module's preamble (kiln/codegen/triton/module.py), which branch on `x.dtype` at compile
time, as the C++ helpers are templates.

Math functions go through `libdevice` (NVIDIA's accurate device library on a GPU); under Triton's
interpreter, kiln/runtime/triton_math.py gives the same names torch's CPU implementations. Only
functions libdevice has are printed, so every kernel also compiles for a GPU; an op without one
raises NotImplementedError, and the graph runs through ATen (recorded as a fallback).
"""

from __future__ import annotations

from typing import Any

import sympy
import torch

from kiln.codegen.index_printer import IndexSpelling, print_index
from kiln.codegen.special_functions import SPECIAL_FUNCTIONS
from kiln.codegen.value_rules import HALF_DTYPES

TRITON_DTYPES = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16", torch.int64: "tl.int64", torch.int32: "tl.int32", torch.int16: "tl.int16",
    torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}  # fmt: skip

UNARY = {
    "neg": "(-{0})", "abs": "tl.abs({0})", "relu": "tl.where({0} < 0, 0, {0})", "logical_not": "({0} == 0)",
    "sign": "kiln_sign({0})", "bitwise_not": "(~{0})",
    "sigmoid": "(1 / (1 + libdevice.exp(-{0})))", "reciprocal": "(1 / {0})",
    "round": "libdevice.nearbyint({0})", "signbit": "(libdevice.signbit({0}) != 0)",
}  # fmt: skip
# Ops that are libdevice's function of the same name.
LIBDEVICE_UNARY = (
    "exp", "expm1", "log", "log1p", "sqrt", "rsqrt", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
    "tanh", "asinh", "acosh", "atanh", "exp2", "log2", "log10", "erf", "erfc", "lgamma", "trunc", "floor", "ceil",
)  # fmt: skip
UNARY.update({name: f"libdevice.{name}({{0}})" for name in LIBDEVICE_UNARY})

BINARY = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "truediv": "({0} / {1})",
    "maximum": "kiln_maximum({0}, {1})", "minimum": "kiln_minimum({0}, {1})",
    "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})", "le": "({0} <= {1})",
    "gt": "({0} > {1})", "ge": "({0} >= {1})", "logical_and": "(({0} != 0) & ({1} != 0))",
    "logical_or": "(({0} != 0) | ({1} != 0))", "floordiv": "kiln_floordiv({0}, {1})",
    "remainder": "kiln_remainder({0}, {1})", "pow": "kiln_pow({0}, {1})", "atan2": "libdevice.atan2({0}, {1})",
    "fmod": "libdevice.fmod({0}, {1})", "hypot": "libdevice.hypot({0}, {1})",
    "copysign": "libdevice.copysign({0}, {1})",
    "bitwise_and": "({0} & {1})", "bitwise_or": "({0} | {1})", "bitwise_xor": "({0} ^ {1})",
    "bitwise_left_shift": "kiln_shift_left({0}, {1})", "bitwise_right_shift": "kiln_shift_right({0}, {1})",
    "rand": "kiln_rand({0}, {1})",  # float32, the module's Philox helper
}  # fmt: skip
# The special functions: libdevice's or the module's own, from kiln/codegen/special_functions.py
# (polygamma is TritonBody's method; those the table has no Triton for stay unprintable).
for _function in SPECIAL_FUNCTIONS.values():
    if _function.triton_call is not None:
        (UNARY if _function.arity == 1 else BINARY)[_function.op] = _function.triton_call


# Triton's `//` and `%` round toward zero, as C's.
TRITON_INDEX = IndexSpelling("Triton", "{0}", "({0} // {1})", "({0} % {1})", "kiln_floordiv({0}, {1})",
                             "kiln_remainder({0}, {1})", "tl.minimum({0}, {1})", "tl.maximum({0}, {1})")


def triton_index(expr: sympy.Expr) -> str:
    """An integer index expression as Triton (Python syntax on integer blocks)."""
    return print_index(expr, TRITON_INDEX)


def round_to(dtype: torch.dtype, value: str) -> str:
    """A value of any dtype rounded to the 16-bit float `dtype`, held in float32. It goes through
    float32 first, as eager's casts do (c10's 16-bit types are made from a float): an integer,
    bool or float64 converts to float32, then rounds once more to 16 bits. (kiln_round_bf16 reads
    its argument's bits as a float32's: handed an int32 it gave wrong values, and other widths
    failed to compile.)"""
    as_float = f"{value}.to(tl.float32)"
    if dtype == torch.bfloat16:
        return f"kiln_round_bf16({as_float})"
    return f"{as_float}.to(tl.float16).to(tl.float32)"


def triton_constant(value: Any, dtype: torch.dtype) -> str:
    """A block of one element holding `value` as `dtype` (a 16-bit float: rounded to it, held
    in float32)."""
    if dtype in HALF_DTYPES:
        return round_to(dtype, triton_constant(value, torch.float32))
    if dtype == torch.bool or isinstance(value, bool):
        return f"tl.full([], {1 if value else 0}, {TRITON_DTYPES[dtype]})"
    if dtype.is_floating_point:
        value = float(value)
        text = repr(value) if value == value and abs(value) != float("inf") else f'float("{value}")'
        return f"tl.full([], {text}, {TRITON_DTYPES[dtype]})"
    return f"tl.full([], {int(value)}, {TRITON_DTYPES[dtype]})"
