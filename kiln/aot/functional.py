"""Functionalization under the tracer, through PyTorch's `FunctionalTensorMode`.

Inside `functional_mode()`, tensors wrapped by `to_functional` record in-place ops as functional
ones; `from_functional` gives a wrapped tensor's latest value, and `has_data_mutation` tells
whether an input was written. The Python dispatcher is on so that ops whose C++ schema hides a
mutation (batch norm's running statistics) decompose into ones whose schema declares it.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode


@contextlib.contextmanager
def functional_mode() -> Iterator[None]:
    # Functionalization must be the innermost layer, under the tracer; the C++ key is excluded
    # so that only the Python mode does it.
    no_cpp = torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Functionalize))
    with enable_python_dispatcher(), no_cpp, FunctionalTensorMode() as mode:
        _seed_effect_tokens(mode)
        yield


def _seed_effect_tokens(mode: FunctionalTensorMode) -> None:
    """Ops with side effects (linear algebra's error checks) are kept in order by a token that
    each `with_effects` call takes and returns. The first token is made in the traced program
    itself, an empty tensor, so the graph's signature is unchanged; a graph without such ops
    loses it to dead-code elimination."""
    from torch._higher_order_ops.effects import _EffectType

    for effect in _EffectType:
        mode._tokens[effect] = torch.empty(0)  # made under the mode, so already functional


def to_functional(value: Any) -> Any:
    return FunctionalTensor.to_functional(value) if isinstance(value, torch.Tensor) else value


def from_functional(value: Any) -> Any:
    if not isinstance(value, FunctionalTensor):
        return value
    torch._sync(value)
    return torch._from_functional_tensor(value.elem)


def has_data_mutation(value: Any) -> bool:
    if not isinstance(value, FunctionalTensor):
        return False
    torch._sync(value)
    return bool(torch._functionalize_has_data_mutation(value.elem))


def has_metadata_mutation(value: Any) -> bool:
    return isinstance(value, FunctionalTensor) and bool(torch._functionalize_has_metadata_mutation(value.elem))
