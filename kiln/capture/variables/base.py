"""`Variable`: what the interpreter keeps on its stack in place of a Python value.

Each kind of Python value has its own subclass (`ConstantVariable`, `TensorVariable`,
`ListVariable`, `UserFunctionVariable`, `ModuleVariable`, ...). A variable knows the Python type
it stands for, how it is reached from the frame's inputs (`source`, None for values made during
the trace), and how the Python operations the bytecode applies to it behave: attribute reads,
calls, method calls, iteration, truth. What a subclass does not model raises `Unsupported`, and
the frame runs eagerly.
"""

from __future__ import annotations

import itertools

import types
from typing import TYPE_CHECKING, Any, Sequence

from kiln.capture.break_records import unsupported

if TYPE_CHECKING:
    from kiln.capture.interpreter import Translator
    from kiln.capture.sources import Source


# Each variable's order of making: a change to one made inside a torch.cond branch stays in the
# branch (control_flow.py), a change to one made before would happen whichever branch runs.
_MADE = itertools.count()


def made_now() -> int:
    """A number below every variable made from now on."""
    return next(_MADE)


class Variable:
    source: "Source | None" = None
    made: int = -1  # (a subclass that skips __init__: as old as any)

    def __init__(self, source: "Source | None" = None) -> None:
        self.source = source
        self.made = next(_MADE)

    # --- what it is ---------------------------------------------------------------------------

    def python_type(self) -> type:
        raise unsupported("unknown_type", f"{type(self).__name__} does not know its Python type")

    def is_constant(self) -> bool:
        """Whether `as_constant()` gives the Python value (no tensors, nothing mutable tracked)."""
        return False

    def as_constant(self) -> Any:
        raise unsupported("not_constant", f"{self.describe()} is not a Python constant here")

    def describe(self) -> str:
        return f"a {self.python_type().__name__} value"

    # --- Python operations ------------------------------------------------------------------

    def getattr(self, tx: "Translator", name: str) -> "Variable":
        raise unsupported("unsupported_attribute", f"reading attribute {name!r} of {self.describe()} is not supported")

    def setattr(self, tx: "Translator", name: str, value: "Variable") -> None:
        raise unsupported("unsupported_setattr", f"setting attribute {name!r} of {self.describe()} is not supported")

    def call(self, tx: "Translator", args: Sequence["Variable"], kwargs: dict[str, "Variable"]) -> "Variable":
        raise unsupported("unsupported_call", f"calling {self.describe()} is not supported")

    def call_method(self, tx: "Translator", name: str, args: Sequence["Variable"], kwargs: dict[str, "Variable"]) -> "Variable":
        return self.getattr(tx, name).call(tx, args, kwargs)

    def iterate(self, tx: "Translator") -> list["Variable"]:
        """The items `for x in value` would produce (the whole sequence, eagerly)."""
        raise unsupported("unsupported_iteration", f"iterating over {self.describe()} is not supported")

    def get_iter(self, tx: "Translator") -> "Variable":
        from kiln.capture.variables.containers import IteratorVariable  # containers.py imports this module (Variable)

        return IteratorVariable(self.iterate(tx))

    def truth(self, tx: "Translator") -> bool:
        raise unsupported("unsupported_truth", f"the truth value of {self.describe()} is not known while capturing")

    def length(self, tx: "Translator") -> int:
        return len(self.iterate(tx))

    def hasattr(self, tx: "Translator", name: str) -> bool:
        from kiln.capture.user_exceptions import UserRaise  # user_exceptions.py imports this module (Variable)

        try:
            self.getattr(tx, name)
            return True
        except UserRaise as error:
            if error.is_instance(AttributeError):
                return False
            raise

    # --- graph arguments --------------------------------------------------------------------

    def as_fx_arg(self) -> Any:
        """The value as an argument of an fx node: a Node for tensors, plain Python otherwise."""
        return self.as_constant()

    def as_example(self) -> Any:
        """The value with fake tensors in place of graph values, to run an op on."""
        return self.as_constant()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"


class RealValueVariable(Variable):
    """A real Python object the trace uses as it is (a builtin, a torch function, a class, a
    descriptor): it is its own constant, pinned by a guard where it was read."""

    def __init__(self, value: Any, source: "Source | None" = None) -> None:
        super().__init__(source)
        self.value = value

    def python_type(self) -> type:
        return type(self.value)

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.value


class BoundBuiltinMethod(Variable):
    """A method of a modelled value (list.append, dict.get, ...), dispatched to its `call_method`."""

    def __init__(self, obj: "Variable", name: str) -> None:
        super().__init__(None)
        self.obj, self.name = obj, name

    def python_type(self) -> type:
        return types.BuiltinMethodType

    def describe(self) -> str:
        return f"method {self.name} of {self.obj.describe()}"

    def call(self, tx: "Translator", args: Sequence["Variable"], kwargs: dict[str, "Variable"]) -> "Variable":
        return self.obj.call_method(tx, self.name, args, kwargs)

    def getattr(self, tx: "Translator", name: str) -> "Variable":
        # What unittest's assertRaises(exc, d.pop, k) reads to name the call it checks.
        if name in ("__name__", "__qualname__"):
            from kiln.capture.variables.constant import ConstantVariable  # constant.py imports this module

            owner = getattr(self.obj.python_type(), "__name__", "object")
            return ConstantVariable(self.name if name == "__name__" else f"{owner}.{self.name}")
        if name == "__self__":
            return self.obj
        return super().getattr(tx, name)


class NullVariable(Variable):
    """The NULL that CPython pushes below a callable that is not a bound method."""

    def python_type(self) -> type:
        return type(None)

    def describe(self) -> str:
        return "NULL"


NULL = NullVariable()
