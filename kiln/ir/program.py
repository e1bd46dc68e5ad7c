"""A lowered graph: loop-IR nodes and extern calls over named buffers, in program order.

Lowering (kiln/lowering/graph.py) builds a `Program`; the scheduler fuses its `ComputeStep`s into
kernels and keeps its `ExternStep`s; code generation prints both. An extern's arguments are read
and replaced by name through its operator's schema, never by position.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from kiln.ir.nodes import Buffer, Node


@dataclass
class ComputeStep:
    buffer: Buffer
    node: Node


@dataclass
class ExternStep:
    """One call of an ATen (or `kiln::`) operator; Buffers stand for tensors in args and kwargs."""

    outputs: list[Buffer | None]  # one per tensor the op returns
    op: Any
    args: tuple
    kwargs: dict

    def _position(self, name: str) -> int:
        schema = getattr(self.op, "_schema", None)
        names = [a.name for a in schema.arguments] if schema is not None else []
        if name not in names:
            raise KeyError(f"{self.op} has no argument {name!r}; its arguments: {names}")
        return names.index(name)

    def argument(self, name: str) -> Any:
        """The value passed for the schema argument `name` (its default when not passed)."""
        position = self._position(name)
        if position < len(self.args):
            return self.args[position]
        if name in self.kwargs:
            return self.kwargs[name]
        return self.op._schema.arguments[position].default_value

    def with_argument(self, name: str, value: Any) -> "ExternStep":
        """A copy of this step that passes `value` for the schema argument `name`."""
        position = self._position(name)
        if position < len(self.args):
            args = list(self.args)
            args[position] = value
            return dataclasses.replace(self, args=tuple(args))
        return dataclasses.replace(self, kwargs={**self.kwargs, name: value})


@dataclass
class Program:
    inputs: list[Buffer | None]  # None for a non-tensor input
    steps: list[ComputeStep | ExternStep] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)  # Buffers, or constants
    size_inputs: dict[int, Any] = field(default_factory=dict)  # position of an integer input -> its size symbol
    # An output that is the new value of a mutated input -> that input (graph_meta.WRITTEN_BACK_FROM):
    # the memory plan may compute it in the input's memory.
    written_back: dict[str, str] = field(default_factory=dict)

    @property
    def kernels(self) -> list[ComputeStep]:
        return [s for s in self.steps if isinstance(s, ComputeStep)]

    @property
    def externs(self) -> list[ExternStep]:
        """ATen calls that compute something (not the bindings of `binds_memory`)."""
        return [s for s in self.steps if isinstance(s, ExternStep) and not binds_memory(s)]


def binds_memory(step: ExternStep) -> bool:
    """An extern step that computes nothing: an as_strided view of a buffer (how a strided view
    reaches an extern), or the alias that names a tensor the graph module holds (a constant)."""
    aten = torch.ops.aten
    return step.op is aten.as_strided.default or (step.op is aten.alias.default and isinstance(step.args[0], torch.Tensor))
