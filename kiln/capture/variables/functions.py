"""Python functions the interpreter inlines, bound methods, partials and closure cells."""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any, Sequence

from kiln.capture.break_records import unsupported
from kiln.capture.sources import AttrSource, ClosureSource, ConstSource, DefaultSource, ItemSource
from kiln.capture.user_exceptions import raise_real
from kiln.capture.variables.base import BoundBuiltinMethod, Variable
from kiln.capture.variables.constant import ConstantVariable, is_literal
from kiln.capture.variables.containers import DictVariable, GeneratorIterator, TupleVariable, hash_key, stop_iteration
from kiln.capture.variables.wrapping import wrap, wrap_constant_result

CO_VARARGS, CO_VARKEYWORDS = inspect.CO_VARARGS, inspect.CO_VARKEYWORDS
CO_GENERATOR, CO_COROUTINE, CO_ASYNC_GENERATOR = inspect.CO_GENERATOR, inspect.CO_COROUTINE, inspect.CO_ASYNC_GENERATOR


class CellVariable(Variable):
    """A closure cell made during the trace (MAKE_CELL), shared by the frames that hold it."""

    def __init__(self, contents: Variable | None = None) -> None:
        super().__init__(None)
        self.contents = contents

    def python_type(self) -> type:
        return types.CellType


class RealCellVariable(Variable):
    """A cell of a function that existed before the trace: read through its source."""

    def __init__(self, cell: types.CellType, source: Any, cell_source: Any = None) -> None:
        super().__init__(source)  # (of its contents)
        self.cell = cell
        self.cell_source = cell_source  # of the cell itself, where it is not a pinned function's
        self.written: Variable | None = None

    def python_type(self) -> type:
        return types.CellType


def real_cell(tx: Any, cell: types.CellType, source: Any, cell_source: Any = None) -> "RealCellVariable":
    """The trace's one variable for the real cell `cell` (the first way it was reached names it)."""
    known = tx.output.real_cells.get(id(cell)) if tx is not None else None
    if known is None:
        known = RealCellVariable(cell, source, cell_source)
        if tx is not None:
            tx.output.real_cells[id(cell)] = known
    return known


class FunctionVariableBase(Variable):
    """What inlining needs from a function: code, globals, defaults, closure."""

    code: types.CodeType
    f_globals: dict

    def python_type(self) -> type:
        return types.FunctionType

    def defaults(self, tx: Any) -> list[Variable]:
        raise NotImplementedError

    def kwdefaults(self, tx: Any) -> dict[str, Variable]:
        raise NotImplementedError

    def closure(self, tx: Any) -> list[Variable]:
        raise NotImplementedError

    def name(self) -> str:
        return self.code.co_name

    def qualified_name(self) -> str:
        """The name CPython's call errors use (functools.wraps may have changed it)."""
        return getattr(self, "qualname", self.name())

    def describe(self) -> str:
        return f"function {self.name()} ({self.code.co_filename}:{self.code.co_firstlineno})"

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        flags = self.code.co_flags
        if flags & (CO_COROUTINE | CO_ASYNC_GENERATOR):
            raise unsupported("unsupported_call", f"calling async {self.describe()}")
        if flags & CO_GENERATOR:
            return GeneratorVariable(self, list(args), dict(kwargs))
        return tx.inline_call(self, args, kwargs)

    def getattr(self, tx: Any, name: str) -> Variable:
        if name == "__get__":
            return BoundBuiltinMethod(self, "__get__")
        if name in ("__name__", "__qualname__"):
            return ConstantVariable(self.name() if name == "__name__" else getattr(self, "qualname", self.name()))
        if name == "__code__":
            return ConstantVariable(self.code)
        if name == "__globals__":
            return wrap(tx, self.f_globals, ConstSource(self.f_globals, "globals"))
        return super().getattr(tx, name)

    def call_method(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if name == "__get__":
            instance = args[0]
            if instance.is_constant() and instance.as_constant() is None:
                return self
            return BoundMethodVariable(self, instance)
        if name == "__call__":
            return self.call(tx, args, kwargs)
        return super().call_method(tx, name, args, kwargs)


def _default(tx: Any, value: Any, source: Any) -> Variable:
    return wrap_constant_result(value) if is_literal(value) else wrap(tx, value, source)


class UserFunctionVariable(FunctionVariableBase):
    """A Python function object that exists outside the trace (guarded by identity)."""

    def __init__(self, fn: types.FunctionType, source: Any = None) -> None:
        super().__init__(source)
        self.value = fn
        self.code, self.f_globals = fn.__code__, fn.__globals__
        self.qualname = fn.__qualname__

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.value

    def defaults(self, tx: Any) -> list[Variable]:
        # Defaults belong to the function, which is pinned by identity; reassigning
        # `fn.__defaults__` later is not noticed (README: limits).
        values = self.value.__defaults__ or ()
        return [_default(tx, v, DefaultSource(self.source, i) if self.source is not None else None) for i, v in enumerate(values)]

    def kwdefaults(self, tx: Any) -> dict[str, Variable]:
        values = self.value.__kwdefaults__ or {}
        return {k: _default(tx, v, DefaultSource(self.source, k, True) if self.source is not None else None) for k, v in values.items()}

    def closure(self, tx: Any) -> list[Variable]:
        cells = self.value.__closure__ or ()
        if self.source is None:
            return [real_cell(tx, cell, None) for cell in cells]
        # The cell itself through its function (a closure handed in as an argument is a new
        # object each call, with new cells: not pinned, kiln/capture/variables/builder.py).
        pinned = isinstance(self.source, ConstSource)
        return [real_cell(tx, cell, ClosureSource(self.source, i),
                          None if pinned else ItemSource(AttrSource(self.source, "__closure__"), i))
                for i, cell in enumerate(cells)]

    def getattr(self, tx: Any, name: str) -> Variable:
        # __name__ and __qualname__ are read from the function: functools.wraps rewrites them
        if name in ("__get__", "__code__", "__globals__"):
            return super().getattr(tx, name)
        try:
            value = getattr(self.value, name)
        except AttributeError as error:
            raise raise_real(error) from None
        return wrap(tx, value, AttrSource(self.source, name) if self.source is not None else None)


class NestedFunctionVariable(FunctionVariableBase):
    """A function made by MAKE_FUNCTION during the trace (lambdas, closures, comprehensions)."""

    # Attributes a function keeps in slots, not in its __dict__ (functools.wraps assigns them).
    SLOTS = ("__name__", "__qualname__", "__doc__", "__module__", "__annotations__", "__type_params__")

    def __init__(self, code: types.CodeType, f_globals: dict, qualname: str, defaults: list[Variable], kwdefaults: dict[str, Variable], closure: list[Variable], annotations: Variable | None = None) -> None:
        super().__init__(None)
        self.code, self.f_globals, self.qualname = code, f_globals, qualname
        self._defaults, self._kwdefaults, self._closure = defaults, kwdefaults, closure
        self.attrs: dict[str, Variable] = {}
        self.annotations = annotations if annotations is not None else DictVariable()
        self.dict = DictVariable()  # the function's __dict__: __wrapped__ and user attributes

    def qualified_name(self) -> str:
        renamed = self.attrs.get("__qualname__")
        return renamed.as_constant() if renamed is not None and renamed.is_constant() else self.qualname

    def defaults(self, tx: Any) -> list[Variable]:
        return list(self._defaults)

    def kwdefaults(self, tx: Any) -> dict[str, Variable]:
        return dict(self._kwdefaults)

    def closure(self, tx: Any) -> list[Variable]:
        return list(self._closure)

    def _slot(self, name: str) -> Variable:
        if name == "__annotations__":
            return self.annotations
        if name == "__type_params__":
            return TupleVariable([])
        if name == "__doc__":
            consts = self.code.co_consts
            return ConstantVariable(consts[0] if consts and isinstance(consts[0], str) else None)
        if name == "__module__":
            return ConstantVariable(self.f_globals.get("__name__"))
        return super().getattr(None, name)

    def getattr(self, tx: Any, name: str) -> Variable:
        if name in self.attrs:
            return self.attrs[name]
        if name in self.SLOTS:
            return self._slot(name)
        if name == "__defaults__":
            return TupleVariable(list(self._defaults)) if self._defaults else ConstantVariable(None)
        if name == "__kwdefaults__":
            pairs = [(ConstantVariable(k), v) for k, v in self._kwdefaults.items()]
            return DictVariable.from_pairs(pairs) if pairs else ConstantVariable(None)
        if name == "__dict__":
            return self.dict
        entry = _dict_entry(self.dict, name)
        if entry is not None:
            return entry
        return super().getattr(tx, name)

    def setattr(self, tx: Any, name: str, value: Variable) -> None:
        none = value.is_constant() and value.as_constant() is None
        if name in self.SLOTS:
            self.attrs[name] = value
        elif name == "__defaults__":
            self._defaults = [] if none else list(value.iterate(tx))
        elif name == "__kwdefaults__":
            self._kwdefaults = {} if none else {k.as_constant(): v for k, v in value.entries.values()}
        elif name in ("__code__", "__closure__", "__globals__", "__builtins__"):
            raise unsupported("unsupported_setattr", f"assigning {name} of {self.describe()}")
        else:
            self.dict.setitem(tx, ConstantVariable(name), value)


def _dict_entry(d: Variable, name: str) -> Variable | None:
    entry = d.entries.get(hash_key(ConstantVariable(name)))
    return entry[1] if entry is not None else None


class BoundMethodVariable(Variable):
    """`obj.method`: a function with its first argument bound."""

    def __init__(self, func: Variable, obj: Variable, source: Any = None) -> None:
        super().__init__(source)
        self.func, self.obj = func, obj

    def python_type(self) -> type:
        return types.MethodType

    def describe(self) -> str:
        return f"bound method {self.func.describe()}"

    def is_constant(self) -> bool:
        return self.func.is_constant() and getattr(self.obj, "value", None) is not None and not getattr(self.obj, "is_new", False)

    def as_constant(self) -> Any:
        if not self.is_constant():
            return super().as_constant()
        return types.MethodType(self.func.as_constant(), self.obj.value)

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        return self.func.call(tx, [self.obj, *args], kwargs)

    def getattr(self, tx: Any, name: str) -> Variable:
        if name == "__self__":
            return self.obj
        if name == "__func__":
            return self.func
        return self.func.getattr(tx, name)


class CachedFunctionVariable(Variable):
    """A `functools.lru_cache` / `functools.cache` wrapper (C code), pinned by identity.

    Called with constant arguments, it is called for real while capturing, as eager's call would
    be (a cache lookup, or the one computation that fills it), and a constant result is a
    constant of the graph: later calls of the compiled code would only have hit the cache. With
    other arguments, or a result that is not a plain constant, the wrapped function is traced."""

    def __init__(self, wrapper: Any, wrapped: Variable, source: Any = None) -> None:
        super().__init__(source)
        self.wrapper, self.wrapped = wrapper, wrapped

    def python_type(self) -> type:
        return type(self.wrapper)

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if all(a.is_constant() for a in [*args, *kwargs.values()]):
            try:
                result = self.wrapper(*[a.as_constant() for a in args], **{k: v.as_constant() for k, v in kwargs.items()})
            except Exception:  # noqa: BLE001 - the traced call raises it as eager would
                return self.wrapped.call(tx, args, kwargs)
            if is_literal(result) or (isinstance(result, (tuple, frozenset)) and all(is_literal(r) for r in result)):
                return wrap_constant_result(result)
        return self.wrapped.call(tx, args, kwargs)

    def getattr(self, tx: Any, name: str) -> Variable:
        if name == "__wrapped__":
            return self.wrapped
        return super().getattr(tx, name)


class PartialVariable(Variable):
    def __init__(self, func: Variable, args: list[Variable], kwargs: dict[str, Variable], source: Any = None) -> None:
        super().__init__(source)
        self.func, self.args, self.kwargs = func, args, kwargs

    def python_type(self) -> type:
        return functools.partial

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        return self.func.call(tx, [*self.args, *args], {**self.kwargs, **kwargs})

    def getattr(self, tx: Any, name: str) -> Variable:
        if name == "func":
            return self.func
        if name == "args":
            return TupleVariable(self.args)
        if name == "keywords":
            return DictVariable.from_pairs([(ConstantVariable(k), v) for k, v in self.kwargs.items()])
        return super().getattr(tx, name)

    def hasattr(self, tx: Any, name: str) -> bool:
        """As a partial object answers: its three fields, what its class has (a partial made here
        has no attribute of its own)."""
        return hasattr(functools.partial(len), name)  # (not the class's: `partial.__name__` is the type's own)


def _exception_of(tx: Any, args: Sequence[Variable]) -> Variable:
    """The exception `gen.throw(*args)` raises: an instance as given, a class called."""
    exc = args[0]
    if exc.is_constant() and isinstance(exc.as_constant(), type) and issubclass(exc.as_constant(), BaseException):
        return exc.call(tx, list(args[1:2]), {})
    return exc


class GeneratorVariable(Variable):
    """A generator made by calling a generator function: run one yield at a time as it is consumed."""

    def __init__(self, fn: FunctionVariableBase, args: list[Variable], kwargs: dict[str, Variable]) -> None:
        super().__init__(None)
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.iterator: Any = None

    def python_type(self) -> type:
        return types.GeneratorType

    def _items(self, tx: Any) -> Any:
        if self.iterator is None:
            self.iterator = GeneratorIterator(tx.generator_frame(self.fn, self.args, self.kwargs))
        return self.iterator

    def iterate(self, tx: Any) -> list[Variable]:
        return self._items(tx).iterate(tx)

    def get_iter(self, tx: Any) -> Variable:
        return self._items(tx)

    def truth(self, tx: Any) -> bool:
        return True

    _PROTOCOL = ("__next__", "__iter__", "send", "throw", "close")

    def getattr(self, tx: Any, name: str) -> Variable:
        if name in self._PROTOCOL:
            return BoundBuiltinMethod(self, name)
        return super().getattr(tx, name)

    def call_method(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if name not in self._PROTOCOL or kwargs:
            return super().call_method(tx, name, args, kwargs)
        it = self._items(tx)
        if name == "__iter__":
            return self
        if name == "close":
            return it.close(tx)
        running = it.frame is not None
        if name == "__next__":
            item = it.next(tx)
        elif name == "send":
            item = it.send(tx, args[0])
        else:  # throw(exc) or throw(type[, value]): a class is instantiated as Python does
            item = it.throw(tx, _exception_of(tx, args))
        if item is None:
            raise stop_iteration(it, running)
        return item
