"""Special functions (gamma family, error function inverses, Bessel functions, orthogonal
polynomials, incomplete gamma) and the float helpers frexp, ldexp, nextafter and angle.

Each special function is one protocol op whose C++ is kiln's own scalar code
(kiln/codegen/special_functions.py, in double); integer operands promote to float as in eager.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Kind

from kiln.ir.ops import ops
from kiln.lowering.pointwise import pointwise, promoted_dtypes, register_pointwise
from kiln.lowering.registry import register_lowering
from kiln.lowering.values import TensorValue

aten = torch.ops.aten
_FLOAT = Kind.INT_TO_FLOAT

# op name -> the ATen ops it lowers (log_ndtr needs nothing: its decomposition uses erfcx).
_UNARY = {
    "digamma": [aten.digamma.default], "erfinv": [aten.erfinv.default], "erfcx": [aten.special_erfcx.default],
    "ndtri": [aten.special_ndtri.default], "i0": [aten.i0.default, aten.special_modified_bessel_i0.default],
    "i0e": [aten.special_i0e.default], "i1": [aten.special_i1.default, aten.special_modified_bessel_i1.default],
    "i1e": [aten.special_i1e.default],
}  # fmt: skip
_SPECIAL_UNARY = (
    "bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_k0", "modified_bessel_k1",
    "scaled_modified_bessel_k0", "scaled_modified_bessel_k1", "airy_ai", "spherical_bessel_j0",
)  # fmt: skip
# Binary special functions whose ATen names are `special_<name>`, with (Tensor, Tensor) and both
# Scalar overloads; the polynomials' second operand is the degree.
_SPECIAL_BINARY = (
    "chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v", "chebyshev_polynomial_w",
    "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
    "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
    "laguerre_polynomial_l", "legendre_polynomial_p",
)  # fmt: skip

for _name, _overloads in _UNARY.items():
    register_pointwise(_name, *_overloads, kind=_FLOAT)
for _name in _SPECIAL_UNARY:
    register_pointwise(_name, getattr(aten, f"special_{_name}").default, kind=_FLOAT)
for _name in _SPECIAL_BINARY:
    _packet = getattr(aten, f"special_{_name}")
    register_pointwise(_name, _packet.default, _packet.x_scalar, _packet.n_scalar, kind=_FLOAT)
register_pointwise("zeta", aten.special_zeta.default, aten.special_zeta.self_scalar, aten.special_zeta.other_scalar,
                   kind=_FLOAT)
register_pointwise("igamma", aten.igamma.default, kind=_FLOAT)
register_pointwise("igammac", aten.igammac.default, kind=_FLOAT)


def _compute_dtype(x: TensorValue) -> torch.dtype:
    """The dtype `x` computes in once promoted to float."""
    return promoted_dtypes([x], _FLOAT)[0]


@register_lowering(aten.polygamma.default)
def polygamma(n: int, x: TensorValue) -> TensorValue:
    return pointwise(lambda v: ops.polygamma(ops.constant(n, _compute_dtype(x)), v), [x], _FLOAT)


def _float_only(*args: Any) -> None:
    # Their results depend on the bits of the exact dtype: half types, held in float32 registers, would be wrong.
    if any(isinstance(a, TensorValue) and a.dtype not in (torch.float32, torch.float64) for a in args):
        raise NotImplementedError("float32 and float64 only")  # an extern call


@register_lowering(aten.nextafter.default)
def nextafter(x: TensorValue, other: TensorValue) -> TensorValue:
    _float_only(x, other)
    return pointwise("nextafter", [x, other])


@register_lowering(aten.frexp.Tensor)
def frexp(x: TensorValue) -> tuple[TensorValue, TensorValue]:
    _float_only(x)
    return (TensorValue(x.size, x.dtype, lambda index: ops.frexp_mantissa(x.loader(index))),
            TensorValue(x.size, torch.int32, lambda index: ops.frexp_exponent(x.loader(index))))


@register_lowering(aten.ldexp.Tensor)
def ldexp(x: TensorValue, other: TensorValue) -> TensorValue:
    # Eager's own definition: x * 2.0 ** other (so overflow of the power shows as in eager).
    return pointwise("mul", [x, pointwise("pow", [2.0, other], Kind.BOOL_TO_LONG)], _FLOAT)


@register_lowering(aten.angle.default)
def angle(x: TensorValue) -> TensorValue:
    if x.dtype.is_complex:
        raise NotImplementedError("complex angle")  # an extern call
    dtype = _compute_dtype(x)

    def body(v):
        c = lambda value: ops.constant(value, dtype)  # noqa: E731
        return ops.where(ops.ne(v, v), v, ops.where(ops.lt(v, c(0)), c(math.pi), c(0)))

    return pointwise(body, [x], _FLOAT)
