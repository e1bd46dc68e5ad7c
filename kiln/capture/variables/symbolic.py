"""Symbolic sizes: a size of a dynamic input dimension, and what is computed from it.

A `SymNodeVariable` is an fx node whose value is a SymInt (or SymBool, SymFloat) of the capture's
shape environment. Arithmetic and comparisons on it become graph nodes; passing it to a tensor
operation (`x.view(b, -1)`, `torch.arange(n)`) keeps the operation symbolic. Where Python needs
the number itself — a branch, `range(n)`, an index into a list — it is specialized: the value
seen now is used, and the shape environment records the guard that keeps it valid.
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any, Iterator

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from kiln.capture.break_records import unsupported

from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.containers import SizeVariable, TupleVariable
from kiln.capture.variables.wrapping import wrap_constant_result

SYMBOLIC = (torch.SymInt, torch.SymBool, torch.SymFloat)


def is_symbolic(value: Any) -> bool:
    return isinstance(value, SYMBOLIC)


def has_symbolic(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return any(has_symbolic(v) for v in value)
    return is_symbolic(value)


def wrap_symbolic(graph: fx.Graph, node: fx.Node, value: Any) -> Variable:
    """The variable for `node`, whose value is symbolic or a tuple/Size holding symbolic items."""
    if is_symbolic(value):
        return SymNodeVariable(node, value)
    node.meta["example_value"] = value
    items = [wrap_symbolic(graph, graph.call_function(operator.getitem, (node, i)), v) if has_symbolic(v) else wrap_constant_result(v)
             for i, v in enumerate(value)]
    return SizeVariable(items) if isinstance(value, torch.Size) else TupleVariable(items)


@contextlib.contextmanager
def _data_dependent_breaks(variable: "SymNodeVariable") -> Iterator[None]:
    """A number read from tensor data (capture.scalar_outputs' unbacked symbols) that Python needs
    now, where the shape environment cannot decide it: a graph break, not an error."""
    try:
        yield
    except GuardOnDataDependentSymNode:
        raise unsupported("data_dependent_branch", f"Python needs the value of {variable.describe()}, read from "
                          "tensor data, while capturing", "the graph breaks here") from None


class SymNodeVariable(Variable):
    def __init__(self, node: fx.Node, value: Any) -> None:
        super().__init__(None)
        self.node, self.value = node, value
        node.meta["example_value"] = value

    def python_type(self) -> type:
        return {torch.SymInt: int, torch.SymBool: bool, torch.SymFloat: float}[type(self.value)]

    def describe(self) -> str:
        return f"symbolic {self.python_type().__name__} {self.value}"

    def as_constant(self) -> Any:
        # Python needs the number: specialize on it (the shape environment guards the value).
        with _data_dependent_breaks(self):
            return self.python_type()(self.value)

    def truth(self, tx: Any) -> bool:
        with _data_dependent_breaks(self):
            return bool(self.value)

    def as_fx_arg(self) -> Any:
        return self.node

    def as_example(self) -> Any:
        return self.value

    def call_method(self, tx: Any, name: str, args: Any, kwargs: dict[str, Variable]) -> Variable:
        if name in ("__index__", "__int__"):
            return ConstantVariable(int(self.as_constant()))
        return super().call_method(tx, name, args, kwargs)

    def getattr(self, tx: Any, name: str) -> Variable:
        # An attribute of the number (`n.bit_length()`, `n.real`): Python needs the number itself,
        # so it is specialized (guarded) and read from the constant.
        return wrap_constant_result(self.as_constant()).getattr(tx, name)


class SliceVariable(Variable):
    """`a:b:c` with a symbolic bound (`x[:, :seq_len]`): symbolic in a tensor index, specialized elsewhere."""

    def __init__(self, parts: list[Variable]) -> None:
        super().__init__(None)
        self.parts = parts

    def python_type(self) -> type:
        return slice

    def as_constant(self) -> Any:
        return slice(*[p.as_constant() for p in self.parts])

    def as_fx_arg(self) -> Any:
        return slice(*[p.as_fx_arg() for p in self.parts])

    def as_example(self) -> Any:
        return slice(*[p.as_example() for p in self.parts])


def make_slice(parts: list[Variable]) -> Variable:
    """The variable for `slice(*parts)`: a constant unless a bound is symbolic."""
    if all(p.is_constant() for p in parts):
        return ConstantVariable(slice(*[p.as_constant() for p in parts]))
    if all(p.is_constant() or isinstance(p, SymNodeVariable) for p in parts):
        return SliceVariable(parts)
    return None


def size_item(tensor_node: fx.Node, dim: int, value: Any) -> Variable:
    """Dimension `dim` of a tensor's size: a constant, or a node reading it when symbolic."""
    if not is_symbolic(value):
        return ConstantVariable(int(value))
    node = tensor_node.graph.call_method("size", (tensor_node, dim))
    return SymNodeVariable(node, value)
