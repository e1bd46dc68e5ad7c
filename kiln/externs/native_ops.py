"""kiln's operators written in C++ (kiln/native/src/kiln_runtime.cpp, `KILN_OPERATOR`): their fake
functions, and `load`, which defines them.

The runtime library defines such an operator (its schema and CPU kernel) with the dispatcher when
it is loaded (kiln/native/runtime.py `library`; built first where the C++ cache lacks it), so
Python code asks for one through `op(name)`, which loads the runtime once and registers the fake
functions below beside it. A C++ wrapper calls the same C++ function without the dispatcher
(kiln_find_op); docs/native.md.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from kiln.native import runtime


def _attention_fake(q, k, v, attn_mask, scale, is_causal):
    # The output as ATen's CPU kernel makes it (its meta function: `empty_like(query)`), so that
    # the graph's later views of it stay valid: q's order of dimensions, v's head size. The C++
    # kernel makes the same (kiln_runtime.cpp `attention_output`).
    dv = v.shape[3]
    if dv == q.shape[-1]:
        return torch.empty_like(q)
    order = sorted(range(4), key=lambda i: -q.stride(i))
    return torch.empty_permuted((*q.shape[:3], dv), order, dtype=q.dtype, device=q.device)


# The fake function of each operator the runtime defines, by name in the kiln namespace.
FAKES: dict[str, Callable] = {"attention": _attention_fake}


@functools.cache
def load() -> None:
    """Load kiln's runtime (its operators defined) and register their fake functions, once."""
    runtime.library()
    for name, fake in FAKES.items():
        torch.library.register_fake(f"kiln::{name}", fake)


@functools.cache
def op(name: str) -> torch._ops.OpOverload:
    """The operator kiln::`name` (its only overload), defined first where it is not yet."""
    load()
    return getattr(torch.ops.kiln, name).default


def names_in(text: bytes | str) -> bool:
    """Whether `text` (a pickled graph's code) calls one of these operators: it then needs `load`
    before it is unpickled."""
    data = text.encode() if isinstance(text, str) else text
    return any(f"kiln.{name}".encode() in data for name in FAKES)
