"""The values of small tensors computed from constants alone, known while capturing.

HuggingFace's DeBERTa computes its attention span as `torch.tensor(min(q_len, max_positions))` and
slices its relative-position table with `table[max_positions - span : max_positions + span]`. The
bounds are tensors, which Python reads with `__index__`: tensor data, a graph break, and there one
that kiln cannot resume after (a slice is built by one instruction), so the whole frame ran
eagerly. Yet the value depends on nothing but constants (a size the graph's guards fix, a Python
number): capture can compute it. A tensor made from constants (`torch.tensor`, `torch.full`,
`torch.arange`, ...) gets its real value beside its fake one, and so does every op on tensors whose
values are all known, while it is deterministic and its result small (at most 64 elements). Reading
such a tensor's data — a slice bound, `int(t)`, `t.item()`, `bool(t)` in an `if` — gives the
constant, with no graph break and no new guard. The graph still computes the tensors (they may be
used as tensors too).

An op that writes into a tensor whose value is known (an in-place method, an `out=` argument, a
`t[i] = v`) makes every value sharing its storage unknown from then on: values computed from the
real ones share storage as the graph's tensors do (a view of a known tensor is a view here too).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.tensor import TensorVariable, tensor_setitem

MAX_ELEMENTS = 64  # a value this small is cheap to compute twice, and no larger one is read as data
# Ops that make a tensor from constants alone.
_ROOTS = {torch.tensor, torch.as_tensor, torch.scalar_tensor, torch.full, torch.zeros, torch.ones, torch.arange}
_RANDOM = ("rand", "normal", "bernoulli", "dropout", "multinomial", "poisson", "uniform", "exponential", "cauchy",
           "geometric", "seed")
_INPLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.imod,
                      operator.ipow, operator.iand, operator.ior, operator.ixor, operator.ilshift, operator.irshift,
                      operator.imatmul, tensor_setitem}
_NOT_INPLACE_DUNDERS = {"__index__", "__int__", "__invert__", "__iter__", "__init__"}


def _name(target: Any) -> str:
    return target if isinstance(target, str) else getattr(target, "__name__", "")


def _writes(kind: str, target: Any, kwargs: dict[str, Any]) -> bool:
    """Does the call write into its first tensor argument (or its `out=`)?"""
    name = _name(target)
    if "out" in kwargs or target in _INPLACE_OPERATORS:
        return True
    if name.startswith("__i") and name.endswith("__"):
        return name not in _NOT_INPLACE_DUNDERS
    return name.endswith("_") and not name.endswith("__")


class KnownValues:
    """The real values of one capture's small constant tensors, by graph node."""

    def __init__(self) -> None:
        self.values: dict[fx.Node, torch.Tensor] = {}
        self.written: set[int] = set()  # storages written by an op whose effect is not followed

    def record(self, kind: str, target: Any, args: tuple, kwargs: dict[str, Any], node: fx.Node, fake: Any) -> None:
        """After the graph gained `node` = target(*args, **kwargs) with fake result `fake`."""
        if _writes(kind, target, kwargs):
            for written in (kwargs.get("out"), args[0] if args else None):
                value = self.values.get(written) if isinstance(written, fx.Node) else None
                if value is not None:
                    self.written.add(value.untyped_storage().data_ptr())
            return
        if not isinstance(fake, torch.Tensor) or fake.device.type != "cpu":
            return
        if any(isinstance(d, torch.SymInt) for d in fake.shape) or fake.numel() > MAX_ELEMENTS:
            return  # (symbolic sizes are never compared: that would guard them)
        if any(word in _name(target).lower() for word in _RANDOM):
            return
        nodes: list[fx.Node] = []
        fx.node.map_arg((args, kwargs), nodes.append)
        if not nodes and target not in _ROOTS:
            return
        if any(self._value(n) is None for n in nodes):
            return
        real_args, real_kwargs = fx.node.map_arg((args, kwargs), self._value)
        try:
            if kind == "call_method":
                value = getattr(real_args[0], target)(*real_args[1:], **real_kwargs)
            else:
                value = target(*real_args, **real_kwargs)
        except Exception:  # noqa: BLE001 - the value stays unknown; the graph computes it anyway
            return
        if isinstance(value, torch.Tensor) and value.shape == fake.shape and value.dtype == fake.dtype:
            self.values[node] = value

    def _value(self, node: fx.Node) -> torch.Tensor | None:
        value = self.values.get(node)
        if value is None or value.untyped_storage().data_ptr() in self.written:
            return None
        return value

    def of(self, variable: Variable) -> torch.Tensor | None:
        """The real value of a tensor variable, where it is known."""
        return self._value(variable.node) if isinstance(variable, TensorVariable) else None

    def as_index(self, variable: Variable) -> Variable:
        """`variable` as the constant `operator.index` reads from it, where its value is known (a
        slice bound); else itself."""
        value = self.of(variable)
        if value is None or value.numel() != 1 or value.dtype.is_floating_point or value.dtype.is_complex:
            return variable
        return ConstantVariable(operator.index(value))
