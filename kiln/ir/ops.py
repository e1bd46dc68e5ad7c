"""The ops-handler protocol: the one vocabulary every loop body is written in.

An IR node's body is a Python function `inner_fn(index)` that calls `ops.load`, `ops.add`,
`ops.exp`, ... on whatever handler is current. Running the same body under a different handler
turns it into C++, Triton, a dependency list, an op count or a reference result (seed 003's
define-by-run IR). The op names and their meanings are listed here once; each handler implements
them all (`missing_ops(handler)` says which it lacks).

    with use_handler(OpCounter()) as counter:
        node.inner_fn(node.index_vars())
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

import sympy

# name -> arity, for the pointwise ops every handler implements.
# Each means what the torch function of the same name means on operands of one dtype (the
# reference executor calls it), except truediv/floordiv (torch.div and its rounding modes).
# Float-only: the transcendental ones, trunc, round (half to even), fmod, hypot, copysign.
# Integer or bool only: the bitwise ops and shifts (shifts by a negative amount or by the bit
# width or more give 0, or -1 for a negative value shifted right, as eager's kernels do).
UNARY_OPS = (
    "neg", "abs", "exp", "expm1", "log", "log1p", "sqrt", "rsqrt", "reciprocal", "sin", "cos",
    "tanh", "sigmoid", "erf", "relu", "floor", "ceil", "logical_not", "sign",
    "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "exp2", "log2", "log10",
    "erfc", "lgamma", "trunc", "round", "signbit", "bitwise_not",
)  # fmt: skip
BINARY_OPS = (
    "add", "sub", "mul", "truediv", "floordiv", "remainder", "pow", "maximum", "minimum", "atan2",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
    "fmod", "hypot", "copysign", "bitwise_and", "bitwise_or", "bitwise_xor",
    "bitwise_left_shift", "bitwise_right_shift",
)  # fmt: skip
# Special functions, float only, each meaning its torch.special (or torch) function: polygamma's
# first operand is the order n, the polynomials' second the degree n (truncated to an integer).
# frexp_mantissa and frexp_exponent are torch.frexp's two results (the exponent is int32).
SPECIAL_FUNCTION_UNARY_OPS = (
    "digamma", "erfinv", "erfcx", "ndtri", "i0", "i0e", "i1", "i1e", "bessel_j0", "bessel_j1",
    "bessel_y0", "bessel_y1", "modified_bessel_k0", "modified_bessel_k1", "scaled_modified_bessel_k0",
    "scaled_modified_bessel_k1", "airy_ai", "spherical_bessel_j0", "frexp_mantissa", "frexp_exponent",
)  # fmt: skip
SPECIAL_FUNCTION_BINARY_OPS = (
    "polygamma", "zeta", "igamma", "igammac", "nextafter",
    "chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
    "laguerre_polynomial_l", "legendre_polynomial_p",
)  # fmt: skip
# Ops with their own signatures:
#   load(buffer_name, index) -> value          store(buffer_name, index, value) -> None
#   constant(value, dtype) -> value             index_expr(expr, dtype) -> value
#   to_dtype(value, dtype) -> value             where(condition, if_true, if_false) -> value
#   reduction(reduction_type, dtype, value) -> value   (over the node's reduction ranges)
#   indirect_indexing(value, size) -> sympy.Symbol
#       an integer tensor value used as an index into a dimension of `size` elements (negative
#       values count from the end, as in eager); the symbol can appear in later load indices.
SPECIAL_OPS = ("load", "store", "constant", "index_expr", "to_dtype", "where", "reduction", "indirect_indexing")
# argmax/argmin: the flat position (over the reduction ranges, row-major) of the first max/min,
# NaN counting as the largest and the smallest, as in eager. Their dtype is int64.
# welford: the sum of the values' squared deviations from their own mean (a variance's
# numerator), which needs no mean computed first: Welford's running update reads a long row
# once. A code generator without it (C++) declines it, and the lowering computes the mean first.
REDUCTION_TYPES = ("sum", "prod", "max", "min", "any", "all", "argmax", "argmin", "welford")
# rand(seed, offset) -> float32 in [0, 1): Philox4x32-10 of the offset under the seed's key (both
# non-negative int64 values), kiln/ir/philox.py; the same number on every handler, bit for bit.
RANDOM_OPS = ("rand",)

ALL_OPS = UNARY_OPS + BINARY_OPS + SPECIAL_FUNCTION_UNARY_OPS + SPECIAL_FUNCTION_BINARY_OPS + SPECIAL_OPS + RANDOM_OPS

_current: contextvars.ContextVar[Any] = contextvars.ContextVar("kiln_ops_handler", default=None)


class _Ops:
    """`ops.<name>(...)` calls `<name>` on the current handler."""

    def __getattr__(self, name: str) -> Any:
        handler = _current.get()
        if handler is None:
            raise RuntimeError(f"ops.{name} called outside `with use_handler(...)`")
        if name not in ALL_OPS:
            raise AttributeError(f"ops.{name} is not an op of the protocol; known ops: {', '.join(ALL_OPS)}")
        return getattr(handler, name)

    def constant(self, value: Any, dtype: Any) -> Any:
        """A number; or a symbolic size (an expression over size symbols, kiln/ir/sizes.py), which
        is an index expression, computed where the kernel runs, for every handler alike."""
        if isinstance(value, sympy.Basic):
            if not value.is_number:
                return self.index_expr(value, dtype)
            value = int(value) if value.is_Integer else float(value)
        return self.__getattr__("constant")(value, dtype)


ops = _Ops()


@contextlib.contextmanager
def use_handler(handler: Any) -> Iterator[Any]:
    """Make `handler` the target of `ops.*` inside the block (nests; restores the previous one)."""
    token = _current.set(handler)
    try:
        yield handler
    finally:
        _current.reset(token)


def missing_ops(handler: Any) -> list[str]:
    """The protocol's ops that `handler` does not implement (a complete handler has none)."""
    return [name for name in ALL_OPS if not callable(getattr(handler, name, None))]
