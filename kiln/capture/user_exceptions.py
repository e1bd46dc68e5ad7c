"""Exceptions raised by the user's code while it is being captured.

When traced code raises (a `raise` statement, a KeyError from a dict lookup, an AttributeError
that `getattr(obj, name, default)` expects), the interpreter raises `UserRaise` carrying the
exception as a variable. The frame's exception table decides where it lands, as in CPython; one
that leaves the captured frame makes the frame run eagerly, where it raises for real.
"""

from __future__ import annotations

from typing import Any

from kiln.capture.break_records import unsupported
from kiln.capture.variables.base import Variable
from kiln.capture.variables.wrapping import wrap_constant_result


class ExceptionVariable(Variable):
    """An exception object: its class and its argument variables."""

    def __init__(self, exc_type: type[BaseException], args: tuple[Variable, ...] = (), value: BaseException | None = None) -> None:
        super().__init__(None)
        self.exc_type, self.args, self.value = exc_type, tuple(args), value

    @staticmethod
    def construct(exc_type: type[BaseException], args: tuple[Variable, ...], kwargs: dict[str, Variable]) -> "ExceptionVariable":
        """`exc_type(*args, **kwargs)` in the traced code."""
        if not kwargs and not _custom_init(exc_type):
            return ExceptionVariable(exc_type, args)
        # A class with its own __init__ may compute its args and attributes: build the real
        # exception, which needs its arguments as Python values.
        if not all(a.is_constant() for a in (*args, *kwargs.values())):
            raise unsupported("unsupported_raise", f"building {exc_type.__name__}, whose __init__ is Python code, from non-constant arguments")
        try:
            value = exc_type(*[a.as_constant() for a in args], **{k: v.as_constant() for k, v in kwargs.items()})
        except Exception as error:  # noqa: BLE001 - a bad call raises in the traced code
            raise raise_real(error) from None
        return ExceptionVariable(exc_type, (), value)

    def python_type(self) -> type:
        return self.exc_type

    def describe(self) -> str:
        return f"{self.exc_type.__name__} exception"

    def real(self) -> BaseException:
        if self.value is None:
            try:
                self.value = self.exc_type(*[a.as_constant() if a.is_constant() else a for a in self.args])
            except Exception:  # noqa: BLE001 - a message we cannot rebuild still names the type
                self.value = self.exc_type()
        return self.value

    def getattr(self, tx: Any, name: str) -> Variable:
        from kiln.capture.variables.containers import TupleVariable  # containers.py imports this module (UserRaise)
        if name == "args":
            if not self.args and self.value is not None:
                return wrap_constant_result(self.value.args)
            return TupleVariable(list(self.args))
        if name == "with_traceback":  # (unittest's assertRaises stores the exception without one)
            from kiln.capture.variables.base import BoundBuiltinMethod

            return BoundBuiltinMethod(self, name)
        try:
            return wrap_constant_result(getattr(self.real(), name))
        except AttributeError as error:
            raise raise_real(error) from None

    def truth(self, tx: Any) -> bool:
        return True

    def call_method(self, tx: Any, name: str, args: Any, kwargs: Any) -> Variable:
        if name == "with_traceback" and len(args) == 1 and not kwargs:
            return self  # a traced exception carries no traceback to replace
        return super().call_method(tx, name, args, kwargs)


def _custom_init(exc_type: type) -> bool:
    """Whether constructing `exc_type` runs Python code (__init__ or __new__ defined in Python)."""
    for klass in exc_type.__mro__:
        if klass.__module__ == "builtins":
            return False
        if "__init__" in vars(klass) or "__new__" in vars(klass):
            return True
    return False


class UserRaise(Exception):
    """Carries an exception raised by traced user code to the frame that handles it."""

    def __init__(self, exc: ExceptionVariable) -> None:
        super().__init__(f"{exc.exc_type.__name__} raised by the captured code")
        self.exc = exc

    def is_instance(self, cls: type | tuple[type, ...]) -> bool:
        return issubclass(self.exc.exc_type, cls)


def raise_real(error: BaseException) -> UserRaise:
    """Turn an exception that Python raised on constants into the traced code's exception."""
    return UserRaise(ExceptionVariable(type(error), (), error))
