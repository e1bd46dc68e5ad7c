"""`libdevice` for kernels run by Triton's interpreter.

Triton's interpreter runs a kernel's body as Python over numpy arrays, but cannot run libdevice,
NVIDIA's device math library (an external call of the GPU's code). kiln's Triton kernels call
libdevice for every math function (kiln/codegen/triton/printer.py), so under the interpreter
the module's `libdevice` is this stand-in: each function of libdevice's that kiln prints, by
the same name, computed by torch's CPU implementation of the op (what eager computes), on the
interpreter's arrays; the special functions' stand-ins are named in their table
(kiln/codegen/special_functions.py). On a GPU the real libdevice runs; the two agree to libdevice's documented
accuracy, not bit for bit.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import numpy as np
import torch

from kiln.codegen.special_functions import libdevice_stand_ins


def _as_tensor(x):
    import triton.language as tl

    if isinstance(x, tl.tensor):
        return torch.from_numpy(np.ascontiguousarray(x.handle.data))
    return torch.tensor(x)


def _block(result: torch.Tensor, args):
    """`result` as an interpreter value: of the first argument's element type (int32 for
    signbit), a scalar when every argument is one (the interpreter holds a scalar's data as a
    one-element array), else a block of the broadcast shape."""
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    tensors = [a for a in args if isinstance(a, tl.tensor)]
    scalar = tl.int32 if result.dtype == torch.int32 else tensors[0].dtype.scalar
    blocks = [a.type.get_block_shapes() for a in tensors if a.type.is_block()]
    if not blocks:
        return tl.tensor(TensorHandle(result.reshape(-1).numpy(), scalar), scalar)
    shape = list(torch.broadcast_shapes(*(tuple(int(s) for s in b) for b in blocks)))
    data = result.expand(shape).contiguous().numpy() if list(result.shape) != shape else result.numpy()
    return tl.tensor(TensorHandle(data, scalar), tl.block_type(scalar, shape))


def _function(torch_fn: Callable, result_dtype: torch.dtype | None = None) -> Callable:
    def apply(*args, _semantic=None, **_):
        result = torch_fn(*(_as_tensor(a) for a in args))
        if result_dtype is not None:
            result = result.to(result_dtype)
        return _block(result, args)

    return apply


_FUNCTIONS = {
    "exp": torch.exp, "expm1": torch.expm1, "log": torch.log, "log1p": torch.log1p, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "asin": torch.asin,
    "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh, "tanh": torch.tanh,
    "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh, "exp2": torch.exp2, "log2": torch.log2,
    "log10": torch.log10, "erf": torch.erf, "erfc": torch.erfc, "lgamma": torch.lgamma, "trunc": torch.trunc,
    "floor": torch.floor, "ceil": torch.ceil, "nearbyint": torch.round, "atan2": torch.atan2, "fmod": torch.fmod,
    "hypot": torch.hypot, "copysign": torch.copysign, "pow": torch.pow,
    # The special functions libdevice computes: the table names each beside its C++.
    **libdevice_stand_ins(),
}  # fmt: skip

INTERPRETER_LIBDEVICE = SimpleNamespace(
    **{name: _function(fn) for name, fn in _FUNCTIONS.items()},
    signbit=_function(torch.signbit, torch.int32),
)
