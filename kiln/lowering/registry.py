"""The one lowering table, keyed by ATen overload.

    @register_lowering(aten.relu.default)
    def relu(x: TensorValue) -> TensorValue: ...

An op without an entry becomes an `Extern` call of the ATen op (graph.py), so every graph lowers.
"""

from __future__ import annotations

from typing import Callable

import torch

LOWERINGS: dict[torch._ops.OpOverload, Callable] = {}


def register_lowering(*ops: torch._ops.OpOverload) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        for op in ops:
            if op in LOWERINGS:
                raise ValueError(f"{op} already has a lowering")
            LOWERINGS[op] = fn
        return fn

    return register
