"""Immutable Python values known while capturing: None, numbers, strings, dtypes, devices, slices..."""

from __future__ import annotations

import enum
import types
from typing import Any, Sequence

import torch

from kiln.capture.break_records import unsupported
from kiln.capture.user_exceptions import raise_real
from kiln.capture.variables.base import RealValueVariable, Variable
from kiln.capture.variables.wrapping import wrap_constant_result

LITERAL_TYPES = (
    type(None), bool, int, float, complex, str, bytes, type(Ellipsis), type(NotImplemented),
    range, slice, torch.dtype, torch.device, torch.layout, torch.memory_format, enum.Enum,
    types.CodeType,
)


def is_literal(value: Any) -> bool:
    if isinstance(value, slice):
        return all(is_literal(part) for part in (value.start, value.stop, value.step))
    return isinstance(value, LITERAL_TYPES) and not isinstance(value, torch.Tensor)


def is_plain_data(var: Variable) -> bool:
    """A constant, or a list/tuple/set/dict built only of constants: safe to hand to a pure function."""
    # containers.py imports this module (ConstantVariable)
    from kiln.capture.variables.containers import BaseSequenceVariable, DictVariable, SetVariable

    if var.is_constant():
        return True
    if isinstance(var, BaseSequenceVariable):
        return all(is_plain_data(item) for item in var.items)
    if isinstance(var, SetVariable):
        return all(is_plain_data(item) for item in var.entries.values())
    if isinstance(var, DictVariable):
        return all(is_plain_data(k) and is_plain_data(v) for k, v in var.entries.values())
    return False


def plain_data(var: Variable) -> Any:
    """The Python value of a variable that `is_plain_data`: a fresh copy for mutable containers."""
    # containers.py imports this module (ConstantVariable)
    from kiln.capture.variables.containers import BaseSequenceVariable, SetVariable

    if var.is_constant():
        return var.as_constant()
    if isinstance(var, BaseSequenceVariable):
        items = [plain_data(item) for item in var.items]
        return items if isinstance(var.python_type(), type) and issubclass(var.python_type(), list) else tuple(items)
    if isinstance(var, SetVariable):
        return var.python_type()(plain_data(item) for item in var.entries.values())
    return {plain_data(k): plain_data(v) for k, v in var.entries.values()}


class ConstantVariable(RealValueVariable):
    """A Python value that cannot change: operations on it are computed while capturing."""

    def describe(self) -> str:
        text = repr(self.value)
        return text if len(text) < 60 else text[:57] + "..."

    def truth(self, tx: Any) -> bool:
        return bool(self.value)

    def get_iter(self, tx: Any) -> Variable:
        iterator = super().get_iter(tx)
        if isinstance(self.value, (str, bytes, range)):  # (`isinstance(iter(range(5)), range_iterator)`)
            iterator.cls = type(iter(self.value))
        return iterator

    def iterate(self, tx: Any) -> list[Variable]:
        if isinstance(self.value, (str, bytes, range)):
            return [ConstantVariable(v) for v in self.value]
        if isinstance(self.value, (tuple, frozenset)):  # (a folded constant: `{("a", 1), ("b", 2)}`)
            return [wrap_constant_result(v) for v in self.value]
        if not hasattr(type(self.value), "__iter__") and not hasattr(type(self.value), "__getitem__"):
            # (`d.update(1)`, `for x in None`: Python's TypeError, which the code may catch)
            raise raise_real(TypeError(f"'{type(self.value).__name__}' object is not iterable"))
        return super().iterate(tx)

    def length(self, tx: Any) -> int:
        try:
            return len(self.value)
        except TypeError as error:
            raise raise_real(error) from None

    def getattr(self, tx: Any, name: str) -> Variable:
        try:
            attr = getattr(self.value, name)
        except AttributeError as error:
            raise raise_real(error) from None
        if callable(attr) and not isinstance(attr, type):
            return ConstantMethodVariable(self.value, name)
        return wrap_constant_result(attr)


class ConstantMethodVariable(Variable):
    """A method of a constant, e.g. `"{}-{}".format` or `(3).bit_length`: called for real."""

    def __init__(self, obj: Any, name: str) -> None:
        super().__init__(None)
        self.obj, self.name = obj, name

    def python_type(self) -> type:
        return types.BuiltinMethodType

    def describe(self) -> str:
        return f"method {type(self.obj).__name__}.{self.name}"

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if self.name == "__iter__" and not args and not kwargs:  # (`range(3).__iter__()`: iter() of it)
            return wrap_constant_result(self.obj).get_iter(tx)
        if self.name == "join" and len(args) == 1 and not is_plain_data(args[0]):
            from kiln.capture.variables.containers import TupleVariable  # containers.py imports this module

            args = [TupleVariable(args[0].iterate(tx))]  # "".join(generator): the items it yields
        if not all(is_plain_data(a) for a in (*args, *kwargs.values())):
            raise unsupported(
                "unsupported_call",
                f"{self.describe()} called with values that are not constants while capturing",
                "compute the value outside the compiled function, or from constants",
            )
        try:
            result = getattr(self.obj, self.name)(*[plain_data(a) for a in args], **{k: plain_data(v) for k, v in kwargs.items()})
        except Exception as error:  # noqa: BLE001 - the user's code raised; it lands in its handler
            raise raise_real(error) from None
        return wrap_constant_result(result)
