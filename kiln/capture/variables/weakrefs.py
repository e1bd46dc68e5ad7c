"""`weakref.ref` objects: one made inside the compiled function (a reference to a variable of the
trace), or one the frame reads (its referent read through it, guarded, on every call).

Example::

    def fn(x_weak, y):
        x = x_weak()                 # the tensor, an input read as `x_weak()`; None once it is freed
        return torch.sin(y) if x is not None else torch.cos(y)
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

from kiln.capture.break_records import unsupported
from kiln.capture.sources import ConvertedSource, Source
from kiln.capture.user_exceptions import raise_real
from kiln.capture.variables.base import Variable
from kiln.capture.variables.wrapping import wrap


def dereference(ref: weakref.ref) -> Any:
    """What `ref` refers to now (None once it is freed): how guards and the graph's inputs read it."""
    return ref()


class WeakRefVariable(Variable):
    """A weak reference: to `referent` (made inside), or the frame's own `real` one at `source`."""

    def __init__(self, referent: Variable | None = None, source: Source | None = None, real: weakref.ref | None = None) -> None:
        super().__init__(source)
        self.referent, self.real = referent, real

    def python_type(self) -> type:
        return weakref.ReferenceType

    def describe(self) -> str:
        return "weak reference" + (f" to {self.referent.describe()}" if self.referent is not None else f" {self.source}")

    def truth(self, tx: Any) -> bool:
        return True

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if args or kwargs:
            raise raise_real(TypeError(f"weakref.ReferenceType() takes no arguments ({len(args) + len(kwargs)} given)"))
        if self.referent is not None:
            return self.referent  # (alive: the trace holds it)
        if self.source is None:
            raise unsupported("unsupported_call", "calling a weak reference kiln cannot read again on the next call")
        return wrap(tx, dereference(self.real), ConvertedSource(self.source, dereference))


def make_weakref(tx: Any, obj: Variable, callback: Variable | None = None) -> Variable:
    """`weakref.ref(obj)` inside the compiled function."""
    if callback is not None and not (callback.is_constant() and callback.as_constant() is None):
        raise unsupported("unsupported_call", "weakref.ref with a callback inside a compiled function",
                          "make the reference outside the compiled function")
    return WeakRefVariable(referent=obj)
