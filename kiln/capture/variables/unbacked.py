"""Numbers read from a tensor's data, kept in the graph (the setting `capture.scalar_outputs`, as
Dynamo's `capture_scalar_outputs`).

By default `t.item()` breaks the graph: the number is needed now and exists only when the graph
runs. With the setting, `t.item()` is a node of the graph whose value is a new *unbacked* symbol of
the shape environment (`u0`): arithmetic on it, `torch._check(u0 >= 0)` and tensor operations
taking it (`torch.arange(u0)`, `x + u0`) stay in the graph, sizes made from it included. Where
Python needs the number itself (a branch the shape environment cannot decide, `range(u0)`), the
graph breaks there, as before. `t.tolist()` is the items' `item()`s, `int(t)`/`float(t)`/`bool(t)`
the item converted in the graph (`torch.sym_int`, `torch.sym_float`, `!= 0`). Under
`fullgraph=True` the reads are kept so without the setting (as Dynamo does): the alternative is an
error.

kiln's own backend compiles a graph that reads an input's number once per value read (kiln/passes/
specialize_sizes.py); one that reads a number from a tensor it computes runs through ATen, recorded
as a fallback (kiln/backend/driver.py).

Example::

    with kiln.config.patch({"capture.scalar_outputs": True}):
        f = kiln.compile(lambda x, y: torch.arange(x.item()) + y, fullgraph=True)
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, free_unbacked_symbols

from kiln.capture.break_records import unsupported
from kiln.capture.user_exceptions import raise_real
from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.containers import ListVariable
from kiln.capture.variables.symbolic import SymNodeVariable, has_symbolic

# Tensor methods that read one number (or all of them) and what Python type each gives.
SCALAR_READS = {"item": None, "tolist": None, "__int__": int, "__index__": int, "__float__": float, "__bool__": bool}


def item(tx: Any, tensor: Variable) -> Variable:
    """`tensor.item()` as a graph node: an unbacked SymInt, SymFloat or SymBool."""
    numel = tensor.example.numel()
    if not isinstance(numel, int) or has_symbolic(numel):
        raise unsupported("data_dependent", "tensor.item() of a tensor whose element count is symbolic",
                          "the graph breaks here")
    if numel != 1:
        raise raise_real(RuntimeError(f"a Tensor with {numel} elements cannot be converted to Scalar"))
    return tx.output.call("call_method", "item", [tensor], {})


def tolist(tx: Any, tensor: Variable) -> Variable:
    """`tensor.tolist()`: nested lists of each element's `item()`; a dynamic size is specialized
    (the list's length is Python's, guarded by the shape environment)."""
    try:
        shape = tuple(int(d) for d in tensor.example.shape)
    except GuardOnDataDependentSymNode:
        raise unsupported("data_dependent", "tensor.tolist() of a tensor whose size is read from tensor data",
                          "the graph breaks here") from None

    def nested(t: Variable, dims: tuple) -> Variable:
        if not dims:
            return item(tx, t)
        return ListVariable([nested(tx.output.call("call_function", operator.getitem, [t, ConstantVariable(i)], {}), dims[1:])
                             for i in range(dims[0])])

    return nested(tensor, shape)


def is_data_dependent(var: Variable) -> bool:
    """Whether `var` is a number read from tensor data (an expression over unbacked symbols)."""
    return isinstance(var, SymNodeVariable) and bool(free_unbacked_symbols(var.value))


def as_python_type(tx: Any, number: Variable, cls: type) -> Variable:
    """`cls(number)` of a data-dependent number, in the graph (int() of a float truncates, as Python)."""
    if not isinstance(number, SymNodeVariable) or number.python_type() is cls:
        return number
    if cls is int:
        return tx.output.call("call_function", torch.sym_int, [number], {})
    if cls is float:
        return tx.output.call("call_function", torch.sym_float, [number], {})
    return tx.output.call("call_function", operator.ne, [number, ConstantVariable(0)], {})


def read(tx: Any, tensor: Variable, name: str) -> Variable:
    """The tensor method `name` of SCALAR_READS, kept in the graph."""
    if name == "tolist":
        return tolist(tx, tensor)
    number = item(tx, tensor)
    cls = SCALAR_READS[name]
    if name == "__index__" and tensor.example.dtype.is_floating_point:
        raise raise_real(TypeError("only integer tensors of a single element can be converted to an index"))
    return number if cls is None else as_python_type(tx, number, cls)
