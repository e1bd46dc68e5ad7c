"""What a value in a kernel is, the same for every code generator: the dtype it has in registers
and the identity a reduction starts from. It exists so the C++ and Triton printers follow one
rule each, spelling its result in their own language (kiln/codegen/cpp/, kiln/codegen/triton/)."""

from __future__ import annotations

import math

import torch

# Stored in 16 bits, computed in float32.
HALF_DTYPES = (torch.bfloat16, torch.float16)

# The identities of the reductions that start from one number whatever the dtype (welford's
# accumulators, the count, mean and squared deviations, start from 0).
_IDENTITIES = {"sum": 0, "prod": 1, "any": False, "all": True, "welford": 0}


def value_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a value of `dtype` has in registers."""
    return torch.float32 if dtype in HALF_DTYPES else dtype


def reduction_identity(kind: str, dtype: torch.dtype) -> bool | int | float:
    """The value a `kind` reduction of `dtype` values starts from: max and min (argmax and
    argmin too) from the end of the dtype's range, an infinity for floats; a float is returned
    for an infinity only."""
    kind = kind[3:] if kind in ("argmax", "argmin") else kind
    if kind in ("max", "min"):
        if dtype.is_floating_point:
            return -math.inf if kind == "max" else math.inf
        if dtype == torch.bool:
            return kind == "min"
        info = torch.iinfo(dtype)
        return info.min if kind == "max" else info.max
    return _IDENTITIES[kind]
