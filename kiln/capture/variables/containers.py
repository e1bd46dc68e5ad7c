"""Tuples, lists, dicts, sets and iterators whose items are variables.

Containers made during the trace are changed in place. Containers read from the frame's inputs
(they have a source) record their changes as side effects, replayed on the real objects after the
graph runs.
"""

from __future__ import annotations

import collections
import functools
import inspect
import operator
import sys
import types
from collections import OrderedDict, defaultdict
from typing import Any, Callable, Sequence

import torch

from kiln.capture.break_records import unsupported
from kiln.capture.guards import Guard
from kiln.capture.sources import ItemSource, KeysSource, Source
from kiln.capture.user_exceptions import ExceptionVariable, UserRaise, raise_real
from kiln.capture.variables.base import BoundBuiltinMethod, Variable
from kiln.capture.variables.constant import ConstantVariable, is_literal
from kiln.capture.variables.wrapping import wrap, wrap_constant_result


def const(value: Any) -> ConstantVariable:
    return ConstantVariable(value)


def hash_key(var: Variable) -> Any:
    """The dict/set key a variable stands for: its value for constants, its identity otherwise."""
    if var.is_constant():
        value = var.as_constant()
        try:
            hash(value)
        except TypeError as error:
            raise raise_real(error) from None
        return ("const", value)
    if isinstance(var, TupleVariable):
        return ("tuple", tuple(hash_key(item) for item in var.items))
    from kiln.capture.variables.tensor import TensorVariable  # tensor.py imports this module (SizeVariable)

    if isinstance(var, TensorVariable):  # (one tensor object is one fake tensor: f(x, x) gives its two variables one)
        return ("tensor", id(var.example))
    real = getattr(var, "value", None)
    if real is not None and not isinstance(real, (list, dict, set)):
        return ("id", id(real))
    if isinstance(var, (ListVariable, DictVariable)) or isinstance(var, SetVariable) and not var.frozen:
        raise raise_real(TypeError(f"unhashable type: '{var.python_type().__name__}'"))
    return ("var", id(var))


def operator_method(tx: Any, obj: Variable, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable | None:
    """`d.__ior__(e)`, `s.__and__(t)`, ...: the operator (an in-place one gives `obj` back); None
    for any other name."""
    from kiln.capture.python_operators import BY_DUNDER, apply_binary  # python_operators.py imports this module

    if name not in BY_DUNDER or kwargs or len(args) != 1:
        return None
    return apply_binary(tx, BY_DUNDER[name], obj, args[0])


def _operator_of_type(cls: type, name: str) -> bool:
    """Whether `name` is an operator method (`__ior__`, `__and__`) the builtin type has."""
    from kiln.capture.python_operators import BY_DUNDER  # python_operators.py imports this module

    return name in BY_DUNDER and hasattr(cls, name)


# Positional arguments of set methods, where not exactly one: a count or a (least, most) range.
_SET_ARITY: dict[str, Any] = {"pop": 0, "clear": 0, "copy": 0, "__len__": 0, "union": (0, 1 << 30), "intersection": (0, 1 << 30),
                              "difference": (0, 1 << 30), "update": (0, 1 << 30), "intersection_update": (0, 1 << 30),
                              "difference_update": (0, 1 << 30)}


def _index(tx: Any, var: Variable, length: int) -> int | slice:
    if tx is not None:  # (a tensor made from constants, whose value is known: `l[torch.as_tensor(2)]`)
        var = tx.output.known.as_index(var)
    from kiln.capture.variables.symbolic import SliceVariable, SymNodeVariable  # symbolic.py imports this module

    if not var.is_constant() and not (isinstance(var, SymNodeVariable) and var.python_type() is int or isinstance(var, SliceVariable)):
        raise unsupported("unsupported_index", f"indexing a sequence with {var.describe()}", "index with Python ints")
    value = var.as_constant()  # (a symbolic int specialized to its value, guarded: which item is Python's choice)
    if isinstance(value, bool) or not isinstance(value, (int, slice)):
        if hasattr(value, "__index__"):
            return operator.index(value)
        raise raise_real(TypeError(f"indices must be integers or slices, not {type(value).__name__}"))
    return value


def _raise(exc_type: type[BaseException], *args: Any) -> UserRaise:
    return UserRaise(ExceptionVariable(exc_type, tuple(const(a) for a in args)))


def equal(tx: Any, a: Variable, b: Variable) -> bool:
    """Python `a == b` for the values a container compares (constants, or identity)."""
    if a is b:
        return True
    if a.is_constant() and b.is_constant():
        return bool(a.as_constant() == b.as_constant())
    if isinstance(a, BaseSequenceVariable) and isinstance(b, BaseSequenceVariable):
        return _sequence_kind(a) is _sequence_kind(b) and len(a.items) == len(b.items) and all(equal(tx, x, y) for x, y in zip(a.items, b.items))
    if isinstance(a, DictVariable) and isinstance(b, DictVariable):
        return a.entries.keys() == b.entries.keys() and all(equal(tx, v, b.entries[k][1]) for k, (_, v) in a.entries.items())
    if isinstance(a, SetVariable) and isinstance(b, SetVariable):
        return a.entries.keys() == b.entries.keys()
    from kiln.capture.variables.symbolic import SymNodeVariable  # symbolic.py imports this module (SizeVariable)
    from kiln.capture.variables.tensor import TensorVariable  # tensor.py imports this module (SizeVariable)

    if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):
        raise unsupported("data_dependent_branch", "comparing tensors with == inside a container operation")
    if isinstance(a, SymNodeVariable) or isinstance(b, SymNodeVariable):
        # A symbolic size against a number or another size (`x.size() != (5, 1, 2, 3)` under
        # dynamic shapes): decided by the shape environment, which guards the answer.
        from kiln.capture.python_operators import apply_binary  # python_operators.py imports this module

        return apply_binary(tx, operator.eq, a, b).truth(tx)
    return hash_key(a) == hash_key(b)


def _sequence_kind(var: "BaseSequenceVariable") -> type:
    # Python compares a list only with lists; tuples, torch.Size and namedtuples with each other.
    kind = var.python_type()
    return tuple if issubclass(kind, tuple) else kind


class BaseSequenceVariable(Variable):
    mutable = False

    def __init__(self, items: Sequence[Variable], source: Any = None) -> None:
        super().__init__(source)
        self.items = list(items)

    def is_constant(self) -> bool:
        return not self.mutable and all(item.is_constant() for item in self.items)

    def as_constant(self) -> Any:
        return self.python_type()(item.as_constant() for item in self.items)

    def as_fx_arg(self) -> Any:
        kind = list if self.python_type() is list else tuple
        return kind(item.as_fx_arg() for item in self.items)

    def as_example(self) -> Any:
        kind = self.python_type()
        if kind is torch.Size:
            return torch.Size([item.as_example() for item in self.items])
        return (list if kind is list else tuple)(item.as_example() for item in self.items)

    def describe(self) -> str:
        return f"{self.python_type().__name__} of {len(self.items)} items"

    def iterate(self, tx: Any) -> list[Variable]:
        return list(self.items)

    def length(self, tx: Any) -> int:
        return len(self.items)

    def truth(self, tx: Any) -> bool:
        return bool(self.items)

    def getitem(self, tx: Any, key: Variable) -> Variable:
        index = _index(tx, key, len(self.items))
        if isinstance(index, slice):
            return self.rebuild(self.items[index])
        try:
            return self.items[index]
        except IndexError:
            raise _raise(IndexError, f"{self.python_type().__name__} index out of range") from None

    def rebuild(self, items: list[Variable]) -> Variable:
        return type(self)(items)

    def contains(self, tx: Any, item: Variable) -> bool:
        return any(equal(tx, item, x) for x in self.items)

    def getattr(self, tx: Any, name: str) -> Variable:
        if name in self.methods():
            return BoundBuiltinMethod(self, name)
        if name == "__class__":  # (`x.__class__(items)`: a container of the same type)
            return wrap_constant_result(self.python_type())
        raise raise_real(AttributeError(f"'{self.python_type().__name__}' object has no attribute '{name}'"))

    def methods(self) -> dict[str, Callable]:
        return {"index": self._index_of, "count": self._count, "__getitem__": self.getitem, "__len__": lambda tx: const(len(self.items)),
                "__contains__": lambda tx, x: const(self.contains(tx, x))}

    def call_method(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        method = self.methods().get(name)
        if method is None or kwargs and name != "sort":
            return super().call_method(tx, name, args, kwargs)
        return call_checked(tx, method, self.python_type().__name__, name, args, kwargs)

    def _index_of(self, tx: Any, value: Variable, *bounds: Variable) -> Variable:
        for i, item in enumerate(self.items):
            if equal(tx, value, item):
                return const(i)
        raise _raise(ValueError, f"{value.describe()} is not in {self.python_type().__name__}")

    def _count(self, tx: Any, value: Variable) -> Variable:
        return const(sum(equal(tx, value, item) for item in self.items))


class TupleVariable(BaseSequenceVariable):
    def python_type(self) -> type:
        return tuple


class SizeVariable(TupleVariable):
    """torch.Size: a tuple of ints that prints and compares as a size."""

    def python_type(self) -> type:
        return torch.Size

    def as_fx_arg(self) -> Any:
        return tuple(item.as_fx_arg() for item in self.items)

    def rebuild(self, items: list[Variable]) -> Variable:
        return SizeVariable(items)

    def methods(self) -> dict[str, Callable]:
        return {**super().methods(), "numel": lambda tx: const(int(torch.Size(self.as_constant()).numel()))}


def is_namedtuple_class(cls: type) -> bool:
    """collections.namedtuple classes and C struct sequences (torch.return_types.max, ...)."""
    return issubclass(cls, tuple) and (hasattr(cls, "_fields") or hasattr(cls, "n_sequence_fields"))


def tuple_fields(cls: type) -> tuple[str, ...]:
    """The field names of a namedtuple class or a struct sequence, in order (none for another
    tuple subclass)."""
    if hasattr(cls, "_fields"):
        return tuple(cls._fields)
    if not hasattr(cls, "n_sequence_fields"):
        return ()
    # A struct sequence keeps its names in member descriptors: read back which index each one gives.
    probe = cls(tuple(range(cls.n_sequence_fields)))
    names = [k for k, v in vars(cls).items() if isinstance(v, types.MemberDescriptorType)]
    return tuple(sorted((n for n in names if isinstance(getattr(probe, n), int)), key=lambda n: getattr(probe, n)))


def _make_struct_sequence(cls: type) -> Callable:
    return lambda *items: cls(items)


@functools.cache
def _make_tuple_subclass(cls: type) -> Callable:
    """The object of a tuple subclass of the user's with these items, its own `__new__` not run
    (the trace ran it)."""
    return lambda *items: tuple.__new__(cls, items)


class NamedTupleVariable(TupleVariable):
    def __init__(self, items: Sequence[Variable], cls: type, source: Any = None) -> None:
        super().__init__(items, source)
        self.cls = cls

    def python_type(self) -> type:
        return self.cls

    def fields(self) -> tuple[str, ...]:
        return tuple_fields(self.cls)

    def constructor(self) -> Callable:
        """Called with the items as positional arguments, builds the real tuple."""
        if hasattr(self.cls, "_fields"):
            return self.cls
        return _make_struct_sequence(self.cls) if hasattr(self.cls, "n_sequence_fields") else _make_tuple_subclass(self.cls)

    def as_constant(self) -> Any:
        return self.constructor()(*(item.as_constant() for item in self.items))

    def rebuild(self, items: list[Variable]) -> Variable:
        return TupleVariable(items)

    def getattr(self, tx: Any, name: str) -> Variable:
        fields = self.fields()
        if name in fields:
            return self.items[fields.index(name)]
        if name in self.attrs:
            return self.attrs[name]
        if name == "_fields" and hasattr(self.cls, "_fields"):
            return TupleVariable([const(f) for f in fields])
        if name not in self.methods() and not name.startswith("__"):
            # A method of the user's named tuple class (`def add(self)`, a staticmethod, a
            # classmethod), bound to this tuple as the class binds it.
            from kiln.capture.variables.objects import _MISSING, class_lookup, wrap_class_attr  # objects.py imports this module

            raw, owner = class_lookup(self.cls, name)
            if raw is not _MISSING and owner not in (tuple, object):
                return wrap_class_attr(tx, raw, owner, name, self)
        return super().getattr(tx, name)

    @property
    def attrs(self) -> dict[str, Variable]:
        """Attributes the trace set on the tuple object (a subclass with an instance `__dict__`)."""
        if "_attrs" not in self.__dict__:
            self._attrs: dict[str, Variable] = {}
        return self._attrs

    def setattr(self, tx: Any, name: str, value: Variable) -> None:
        """`tup.c = v` on a named tuple whose class gives its objects a `__dict__` (a subclass of
        one): kept for the trace's reads, written on the caller's object after the graph, or set on
        the tuple built for the output. Its fields are read-only, as in Python."""
        if getattr(self.cls, "__dictoffset__", 0) == 0 or name in self.fields() or name.startswith("__"):
            what = "can't set attribute" if name in self.fields() else f"'{self.cls.__name__}' object has no attribute '{name}'"
            raise raise_real(AttributeError(what))
        if self.source is not None:
            tx.output.side_effects.record_setattr(self, name, value)
        self.attrs[name] = value

    def methods(self) -> dict[str, Callable]:
        if not hasattr(self.cls, "_fields"):
            return super().methods()
        return {**super().methods(), "_replace": self._replace, "_asdict": self._asdict}

    def call_method(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if name == "_replace" and name in self.methods():
            return self._replace(tx, *args, **kwargs)
        return super().call_method(tx, name, args, kwargs)

    def _replace(self, tx: Any, **changes: Variable) -> Variable:
        fields = self.fields()
        unknown = [k for k in changes if k not in fields]
        if unknown:
            raise raise_real(ValueError(f"Got unexpected field names: {unknown!r}"))
        return NamedTupleVariable([changes.get(f, item) for f, item in zip(fields, self.items)], self.cls)

    def _asdict(self, tx: Any) -> Variable:
        return DictVariable.from_pairs([(const(f), item) for f, item in zip(self.fields(), self.items)])


class ListVariable(BaseSequenceVariable):
    mutable = True

    def python_type(self) -> type:
        return list

    def _changed(self, tx: Any) -> None:
        record_change(tx, self)

    def methods(self) -> dict[str, Callable]:
        return {
            **super().methods(),
            "append": self._append, "extend": self._extend, "insert": self._insert, "pop": self._pop,
            "remove": self._remove, "clear": self._clear, "reverse": self._reverse, "copy": lambda tx: ListVariable(self.items),
            "sort": self._sort, "__setitem__": self.setitem, "__delitem__": self.delitem,
        }

    def _append(self, tx: Any, item: Variable) -> Variable:
        self.items.append(item)
        self._changed(tx)
        return const(None)

    def _extend(self, tx: Any, other: Variable) -> Variable:
        source = other if isinstance(other, (ListVariable, TupleVariable)) else other.get_iter(tx)
        if isinstance(source, IteratorVariable) and (isinstance(source, GeneratorIterator) or type(source) is not IteratorVariable):
            # One item at a time, each appended before the next is made: a generator or a map may
            # read the list (`y.extend(y[-1] + z for z in ...)` sees the items already added).
            while (item := source.next(tx)) is not None:
                self.items.append(item)
        else:
            self.items.extend(source.iterate(tx))
        self._changed(tx)
        return const(None)

    def _insert(self, tx: Any, index: Variable, item: Variable) -> Variable:
        try:
            self.items.insert(operator.index(index.as_constant()), item)
        except TypeError as error:  # (a position that is not an int: Python's error, in the user's code)
            raise raise_real(error) from None
        self._changed(tx)
        return const(None)

    def _pop(self, tx: Any, index: Variable | None = None) -> Variable:
        if not self.items:
            raise _raise(IndexError, "pop from empty list")
        try:
            item = self.items.pop(-1 if index is None else operator.index(index.as_constant()))
        except (IndexError, TypeError) as error:  # (out of range, or not an int: Python's error)
            raise raise_real(error) from None
        self._changed(tx)
        return item

    def _remove(self, tx: Any, value: Variable) -> Variable:
        index = self._index_of(tx, value).as_constant()
        del self.items[index]
        self._changed(tx)
        return const(None)

    def _clear(self, tx: Any) -> Variable:
        self.items.clear()
        self._changed(tx)
        return const(None)

    def _reverse(self, tx: Any) -> Variable:
        self.items.reverse()
        self._changed(tx)
        return const(None)

    def _sort(self, tx: Any, key: Variable | None = None, reverse: Variable | None = None) -> Variable:
        keys = [item if key is None or key.is_constant() and key.as_constant() is None else key.call(tx, [item], {}) for item in self.items]
        if not all(k.is_constant() for k in keys):
            raise unsupported("unsupported_call", "list.sort of values that are not constants (tensors compare by data)")
        flip = bool(reverse.as_constant()) if reverse is not None else False
        order = {id(item): k.as_constant() for item, k in zip(self.items, keys)}
        try:
            self.items.sort(key=lambda v: order[id(v)], reverse=flip)
        except TypeError as error:
            raise raise_real(error) from None
        self._changed(tx)
        return const(None)

    def setitem(self, tx: Any, key: Variable, value: Variable) -> Variable:
        index = _index(tx, key, len(self.items))
        try:
            if isinstance(index, slice):
                self.items[index] = value.iterate(tx)
            else:
                self.items[index] = value
        except IndexError:
            raise _raise(IndexError, "list assignment index out of range") from None
        except ValueError as error:  # (a zero step; an extended slice of another length)
            raise raise_real(error) from None
        self._changed(tx)
        return const(None)

    def delitem(self, tx: Any, key: Variable) -> Variable:
        try:
            del self.items[_index(tx, key, len(self.items))]
        except IndexError:
            raise _raise(IndexError, "list assignment index out of range") from None
        except ValueError as error:  # (a zero step)
            raise raise_real(error) from None
        self._changed(tx)
        return const(None)



class DequeVariable(ListVariable):
    """`collections.deque`: a list's items open at both ends, `maxlen` kept (an append past it
    drops an item from the other end, as the deque does)."""

    def __init__(self, items: Sequence[Variable], source: Any = None, maxlen: int | None = None) -> None:
        super().__init__(items, source)
        self.maxlen = maxlen

    def python_type(self) -> type:
        return collections.deque

    def rebuild(self, items: list[Variable]) -> Variable:
        return DequeVariable(items, maxlen=self.maxlen)

    def getitem(self, tx: Any, key: Variable) -> Variable:
        if key.is_constant() and isinstance(key.as_constant(), slice):
            raise _raise(TypeError, "sequence index must be integer, not 'slice'")
        return super().getitem(tx, key)

    def getattr(self, tx: Any, name: str) -> Variable:
        if name == "maxlen":
            return const(self.maxlen)
        return super().getattr(tx, name)

    def methods(self) -> dict[str, Callable]:
        methods = {name: method for name, method in super().methods().items() if name != "sort"}
        methods.update({
            "appendleft": self._appendleft, "extendleft": self._extendleft, "popleft": self._popleft,
            "pop": self._pop_right, "rotate": self._rotate, "copy": lambda tx: self.rebuild(list(self.items)),
        })
        return methods

    def _trim(self, from_left: bool) -> None:
        while self.maxlen is not None and len(self.items) > self.maxlen:
            self.items.pop(0 if from_left else -1)

    def _append(self, tx: Any, item: Variable) -> Variable:
        self.items.append(item)
        self._trim(from_left=True)
        self._changed(tx)
        return const(None)

    def _extend(self, tx: Any, other: Variable) -> Variable:
        result = super()._extend(tx, other)
        self._trim(from_left=True)
        return result

    def _appendleft(self, tx: Any, item: Variable) -> Variable:
        self.items.insert(0, item)
        self._trim(from_left=False)
        self._changed(tx)
        return const(None)

    def _extendleft(self, tx: Any, other: Variable) -> Variable:
        # Item by item, each put first before the next is made (a map or generator may read the deque).
        source = other.get_iter(tx) if not isinstance(other, BaseSequenceVariable) else IteratorVariable(list(other.items))
        while (item := source.next(tx)) is not None:
            self.items.insert(0, item)
            self._trim(from_left=False)
        self._changed(tx)
        return const(None)

    def _popleft(self, tx: Any) -> Variable:
        if not self.items:
            raise _raise(IndexError, "pop from an empty deque")
        item = self.items.pop(0)
        self._changed(tx)
        return item

    def _pop_right(self, tx: Any) -> Variable:
        if not self.items:
            raise _raise(IndexError, "pop from an empty deque")
        item = self.items.pop()
        self._changed(tx)
        return item

    def _rotate(self, tx: Any, steps: Variable | None = None) -> Variable:
        n = operator.index(steps.as_constant()) if steps is not None else 1
        if self.items:
            n %= len(self.items)
            self.items[:] = self.items[-n:] + self.items[:-n] if n else self.items
        self._changed(tx)
        return const(None)

class DictVariable(Variable):
    """A dict (or OrderedDict/defaultdict) with variable keys and values, in insertion order."""

    def __init__(self, entries: dict[Any, tuple[Variable, Variable]] | None = None, source: Any = None, cls: type = dict, default_factory: Variable | None = None) -> None:
        super().__init__(source)
        self.entries: dict[Any, tuple[Variable, Variable]] = dict(entries or {})
        self.cls, self.default_factory = cls, default_factory

    @staticmethod
    def from_pairs(pairs: Sequence[tuple[Variable, Variable]], cls: type = dict) -> "DictVariable":
        d = DictVariable(cls=cls)
        for k, v in pairs:
            d.entries[hash_key(k)] = (k, v)
        return d

    def python_type(self) -> type:
        return self.cls

    def describe(self) -> str:
        return f"{self.cls.__name__} with {len(self.entries)} keys"

    def as_fx_arg(self) -> Any:
        return {k.as_constant(): v.as_fx_arg() for k, v in self.entries.values()}

    def as_example(self) -> Any:
        return {k.as_constant(): v.as_example() for k, v in self.entries.values()}

    def keys(self) -> list[Variable]:
        return [k for k, _ in self.entries.values()]

    def iterate(self, tx: Any) -> list[Variable]:
        return self.keys()

    def length(self, tx: Any) -> int:
        return len(self.entries)

    def truth(self, tx: Any) -> bool:
        return bool(self.entries)

    def _changed(self, tx: Any) -> None:
        record_change(tx, self)

    def getitem(self, tx: Any, key: Variable) -> Variable:
        entry = self.entries.get(hash_key(key))
        if entry is None:
            if self.default_factory is not None:
                value = self.default_factory.call(tx, [], {})
                self.setitem(tx, key, value)
                return value
            raise UserRaise(ExceptionVariable(KeyError, (key,)))
        return entry[1]

    def setitem(self, tx: Any, key: Variable, value: Variable) -> Variable:
        self.entries[hash_key(key)] = (key, value)
        self._changed(tx)
        return const(None)

    def delitem(self, tx: Any, key: Variable) -> Variable:
        if self.entries.pop(hash_key(key), None) is None:
            raise UserRaise(ExceptionVariable(KeyError, (key,)))
        self._changed(tx)
        return const(None)

    def contains(self, tx: Any, key: Variable) -> bool:
        return hash_key(key) in self.entries

    def getattr(self, tx: Any, name: str) -> Variable:
        if name in self.methods() or _operator_of_type(self.cls, name):
            return BoundBuiltinMethod(self, name)
        if name == "default_factory" and issubclass(self.cls, defaultdict):
            return self.default_factory or const(None)
        if name == "__class__":
            return wrap_constant_result(self.cls)
        raise raise_real(AttributeError(f"'{self.cls.__name__}' object has no attribute '{name}'"))

    def call_method(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        method = self.methods().get(name)
        if method is None:
            return operator_method(tx, self, name, args, kwargs) or super().call_method(tx, name, args, kwargs)
        if kwargs and name not in ("update", "popitem"):
            raise unsupported("unsupported_call", f"dict.{name} with keyword arguments")
        return call_checked(tx, method, self.cls.__name__, name, args, kwargs)

    def methods(self) -> dict[str, Callable]:
        return {
            "__getitem__": self.getitem, "__setitem__": self.setitem, "__delitem__": self.delitem,
            "__contains__": lambda tx, k: const(self.contains(tx, k)), "__len__": lambda tx: const(len(self.entries)),
            "get": self._get, "keys": lambda tx: ListViewVariable([], "dict_keys", self),
            "values": lambda tx: ListViewVariable([], "dict_values", self),
            "items": lambda tx: ListViewVariable([], "dict_items", self),
            "pop": self._pop, "setdefault": self._setdefault, "update": self._update, "copy": lambda tx: DictVariable(self.entries, cls=self.cls),
            "clear": self._clear, "popitem": self._popitem,
        }

    def _get(self, tx: Any, key: Variable, default: Variable | None = None) -> Variable:
        entry = self.entries.get(hash_key(key))
        return entry[1] if entry is not None else (default or const(None))

    def _pop(self, tx: Any, key: Variable, *default: Variable) -> Variable:
        entry = self.entries.pop(hash_key(key), None)
        if entry is None:
            if default:
                return default[0]
            raise UserRaise(ExceptionVariable(KeyError, (key,)))
        self._changed(tx)
        return entry[1]

    def _popitem(self, tx: Any, last: Variable | None = None) -> Variable:
        if last is not None and not issubclass(self.cls, OrderedDict):
            raise raise_real(TypeError("dict.popitem() takes no arguments (1 given)"))
        if not self.entries:
            raise _raise(KeyError, "popitem(): dictionary is empty")
        if last is None or last.truth(tx):  # (OrderedDict.popitem(last=False): the first item)
            _, (k, v) = self.entries.popitem()
        else:
            k, v = self.entries.pop(next(iter(self.entries)))
        self._changed(tx)
        return TupleVariable([k, v])

    def _setdefault(self, tx: Any, key: Variable, default: Variable | None = None) -> Variable:
        entry = self.entries.get(hash_key(key))
        if entry is not None:
            return entry[1]
        value = default or const(None)
        self.setitem(tx, key, value)
        return value

    def _update(self, tx: Any, *others: Variable, **kwargs: Variable) -> Variable:
        if len(others) > 1:
            raise raise_real(TypeError(f"update expected at most 1 argument, got {len(others)}"))
        for other in others:
            view = other.container_view(tx) if hasattr(other, "container_view") else None
            if isinstance(view, DictVariable):  # a dict subclass's object: its contents, as dict(other) reads them
                other = view
            pairs = other.entries.values() if isinstance(other, DictVariable) else [tuple(p.iterate(tx)) for p in other.iterate(tx)]
            for i, pair in enumerate(pairs):
                if len(pair) != 2:
                    raise raise_real(ValueError(f"dictionary update sequence element #{i} has length {len(pair)}; 2 is required"))
            for k, v in pairs:
                self.entries[hash_key(k)] = (k, v)
        for k, v in kwargs.items():
            self.entries[hash_key(const(k))] = (const(k), v)
        self._changed(tx)
        return const(None)

    def _clear(self, tx: Any) -> Variable:
        self.entries.clear()
        self._changed(tx)
        return const(None)


def call_checked(tx: Any, method: Callable, owner: str, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
    """A modelled container's method called with the user's arguments; a call Python would refuse
    (`p.append()`, `d.get()`) raises Python's TypeError in the user's code, not kiln's."""
    try:
        inspect.signature(method).bind(tx, *args, **kwargs)
    except TypeError as error:
        raise raise_real(TypeError(f"{owner}.{name}(): {error}")) from None
    return method(tx, *args, **kwargs)


def record_change(tx: Any, container: Variable) -> None:
    """A list, dict or set changed in place: replayed on the real object when it has a source.

    A real object reached without a source (`unreplayable`: through the closure of a function
    kiln cannot name, an attribute of an object a folded call returned) cannot be changed after the
    graph runs: that is a graph break, never a change silently made only to kiln's copy."""
    tx.output.side_effects.check_allowed(f"changing {container.describe()}", container)
    if container.source is not None:
        tx.output.side_effects.record_mutation(container)
    elif getattr(container, "unreplayable", False):
        kind = container.python_type().__name__
        raise unsupported("unreplayable_change", f"changing a real {kind} kiln reached without a way to name it "
                          "again (a closure cell of a function with no source, an attribute of an object computed while "
                          "capturing); the change could not be replayed")


def wrap_dict_contents(tx: Any, value: dict, source: Source | None) -> Variable:
    """A DictVariable of `value`'s items, guarding its keys (not its type: the caller's business)."""
    if source is not None:
        keys = list(value.keys())
        if all(is_literal(k) for k in keys):
            tx.output.guards.add(Guard("EQUALS", KeysSource(source), keys))
        elif tx is not None:
            tx.output.guards.add(Guard("LENGTH_MATCH", source, len(value)))
    pairs = []
    for i, (k, v) in enumerate(value.items()):
        key_source = None
        if source is not None and not is_literal(k) and tx is not None:
            # A key that is an object (a tensor, a module): that very object, read back by its
            # position (a tensor key is then an input of the graph like any tensor it reads).
            key_source = ItemSource(KeysSource(source), i)
            tx.output.guards.add(Guard("ID_MATCH", key_source, k))
        key = wrap(tx, k, key_source)
        pairs.append((key, wrap(tx, v, ItemSource(source, k)) if source is not None else wrap(tx, v, None)))
    d = DictVariable.from_pairs(pairs, cls=type(value) if type(value) in (dict, OrderedDict, defaultdict) else dict)
    d.source = source
    if isinstance(value, defaultdict) and value.default_factory is not None:
        d.default_factory = wrap(tx, value.default_factory, None)
    return d


def wrap_list_contents(tx: Any, value: list, source: Source | None) -> Variable:
    """A ListVariable of a list subclass object's items, guarding its length (not its type: the
    caller's business)."""
    if source is not None:
        tx.output.guards.add(Guard("LENGTH_MATCH", source, len(value)))
    items = [wrap(tx, item, ItemSource(source, i) if source is not None else None) for i, item in enumerate(list.__iter__(value))]
    return ListVariable(items, source)


class MappingProxyVariable(Variable):
    """`types.MappingProxyType(d)`: a read-only view of a dict, live (it shows the dict's later
    changes). Made in the trace over a DictVariable, returned as a proxy of that dict (the
    caller's own when it has a source); one handed in is read through its keys and items."""

    _READS = ("get", "keys", "values", "items", "copy", "__getitem__", "__contains__", "__len__", "__iter__")

    def __init__(self, contents: DictVariable, source: Source | None = None, real: Any = None) -> None:
        super().__init__(source)
        self.contents, self.real = contents, real

    def python_type(self) -> type:
        return types.MappingProxyType

    def is_constant(self) -> bool:
        # A real one computed while capturing (`inspect.signature(f).parameters`): no code in the
        # trace can reach its dict, so it stays a constant that functions may be computed on.
        return self.real is not None and self.source is None

    def as_constant(self) -> Any:
        return self.real if self.is_constant() else super().as_constant()

    def describe(self) -> str:
        return "a mappingproxy"

    def container_view(self, tx: Any) -> DictVariable:
        return self.contents

    def getattr(self, tx: Any, name: str) -> Variable:
        if name in self._READS:
            return BoundBuiltinMethod(self, name)
        raise raise_real(AttributeError(f"'mappingproxy' object has no attribute '{name}'"))

    def call_method(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if name == "__setitem__" or name == "__delitem__":
            raise raise_real(TypeError(f"'mappingproxy' object does not support item {'assignment' if name == '__setitem__' else 'deletion'}"))
        if name not in self._READS:
            return super().call_method(tx, name, args, kwargs)
        return self.contents.call_method(tx, name, args, kwargs)

    def getitem(self, tx: Any, key: Variable) -> Variable:
        return self.contents.getitem(tx, key)

    def contains(self, tx: Any, key: Variable) -> bool:
        return self.contents.contains(tx, key)

    def iterate(self, tx: Any) -> list[Variable]:
        return self.contents.iterate(tx)

    def truth(self, tx: Any) -> bool:
        return self.contents.truth(tx)


class ListViewVariable(TupleVariable):
    """dict.keys()/values()/items(): of a dict the trace holds (`of`), live views of its entries as
    they are when read (`keys = d.keys(); d[4] = v; 4 in keys` is True); else their snapshot."""

    def __init__(self, items: Sequence[Variable], kind: str, of: "DictVariable | None" = None) -> None:
        self._of, self.kind = of, kind
        super().__init__(items)

    @property
    def items(self) -> list[Variable]:
        if self._of is None:
            return self._items
        entries = self._of.entries.values()
        if self.kind == "dict_keys":
            return [k for k, _ in entries]
        if self.kind == "dict_values":
            return [v for _, v in entries]
        return [TupleVariable([k, v]) for k, v in entries]

    @items.setter
    def items(self, items: list[Variable]) -> None:
        self._items = items

    def python_type(self) -> type:
        return {"dict_keys": type({}.keys()), "dict_values": type({}.values()), "dict_items": type({}.items())}[self.kind]

    def as_example(self) -> Any:
        return [item.as_example() for item in self.items]

    def as_constant(self) -> Any:
        """A real view of the same kind over a dict of the items (comparisons with sets use it)."""
        items = [item.as_constant() for item in self.items]
        if self.kind == "dict_keys":
            return dict.fromkeys(items).keys()
        if self.kind == "dict_items":
            return dict(items).items()
        return dict(enumerate(items)).values()


class SetVariable(Variable):
    def __init__(self, items: Sequence[Variable], source: Any = None, frozen: bool = False) -> None:
        super().__init__(source)
        self.entries: dict[Any, Variable] = {}
        self.frozen = frozen
        for item in items:
            self.entries.setdefault(hash_key(item), item)

    def python_type(self) -> type:
        return frozenset if self.frozen else set

    def is_constant(self) -> bool:
        return self.frozen and all(v.is_constant() for v in self.entries.values())

    def as_constant(self) -> Any:
        return self.python_type()(v.as_constant() for v in self.entries.values())

    def iterate(self, tx: Any) -> list[Variable]:
        return list(self.entries.values())

    def length(self, tx: Any) -> int:
        return len(self.entries)

    def truth(self, tx: Any) -> bool:
        return bool(self.entries)

    def contains(self, tx: Any, item: Variable) -> bool:
        if isinstance(item, SetVariable) and not item.frozen:  # (Python looks a set up as its frozenset)
            item = SetVariable(list(item.entries.values()), frozen=True)
        return hash_key(item) in self.entries

    def _changed(self, tx: Any) -> None:
        record_change(tx, self)

    def getattr(self, tx: Any, name: str) -> Variable:
        if name in _SET_METHODS or name == "__init__" or _operator_of_type(self.python_type(), name):
            return BoundBuiltinMethod(self, name)
        if name == "__class__":
            return wrap_constant_result(self.python_type())
        raise raise_real(AttributeError(f"'{self.python_type().__name__}' object has no attribute '{name}'"))

    def call_method(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        operator_result = operator_method(tx, self, name, args, kwargs)
        if operator_result is not None:
            return operator_result
        if name == "__init__" and not kwargs and len(args) <= 1:
            # `s.__init__(items)`: a set's contents become the items; a frozenset's stay (its
            # contents were fixed by __new__, and object's __init__ ignores the arguments).
            if not self.frozen:
                self.entries.clear()
                for item in (args[0].iterate(tx) if args else []):
                    self.entries.setdefault(hash_key(item), item)
                self._changed(tx)
            return const(None)
        if name not in _SET_METHODS:
            return super().call_method(tx, name, args, kwargs)
        if kwargs:
            raise raise_real(TypeError(f"set.{name}() takes no keyword arguments"))
        wanted = _SET_ARITY.get(name, 1)
        if len(args) != wanted if isinstance(wanted, int) else not wanted[0] <= len(args) <= wanted[1]:
            raise raise_real(TypeError(f"set.{name}() takes {wanted if isinstance(wanted, int) else wanted} arguments "
                                       f"({len(args)} given)"))
        if name in _SET_MUTATORS and self.frozen:
            raise raise_real(AttributeError(f"'frozenset' object has no attribute '{name}'"))
        if name == "add":
            self.entries.setdefault(hash_key(args[0]), args[0])
        elif name in ("discard", "remove"):
            if self.entries.pop(hash_key(args[0]), None) is None and name == "remove":
                raise UserRaise(ExceptionVariable(KeyError, (args[0],)))
        elif name == "update":
            for other in args:
                for item in other.iterate(tx):
                    self.entries.setdefault(hash_key(item), item)
        elif name == "clear":
            self.entries.clear()
        elif name.endswith("_update"):  # intersection_update, difference_update, ...
            self.entries = self.call_method(tx, name[: -len("_update")], args, {}).entries
        elif name == "pop":
            if not self.entries:
                raise _raise(KeyError, "pop from an empty set")
            item = self.entries.pop(next(iter(self.entries)))
            self._changed(tx)
            return item
        elif name == "__contains__":
            return const(self.contains(tx, args[0]))
        elif name == "__len__":
            return const(len(self.entries))
        elif name in ("union", "intersection", "difference", "symmetric_difference", "copy"):
            return self._combined(tx, name, args)
        elif name in ("isdisjoint", "issuperset") and not isinstance(args[0], SetVariable):
            # Python reads an iterable only up to the first item that decides: a generator
            # passed in runs that far and no further (its side effects are the program's).
            iterator = args[0].get_iter(tx)
            if not isinstance(iterator, IteratorVariable):
                iterator = IteratorVariable(iterator.iterate(tx))
            while (item := iterator.next(tx)) is not None:
                if (hash_key(item) in self.entries) == (name == "isdisjoint"):
                    return const(False)
            return const(True)
        else:  # issubset, issuperset, isdisjoint
            other = {hash_key(i) for i in args[0].iterate(tx)}
            mine = set(self.entries)
            return const({"issubset": mine <= other, "issuperset": mine >= other, "isdisjoint": not mine & other}[name])
        self._changed(tx)
        return const(None)

    def _combined(self, tx: Any, name: str, others: Sequence[Variable]) -> "SetVariable":
        result = SetVariable(list(self.entries.values()), frozen=self.frozen)
        for other in others:
            keys = {hash_key(i): i for i in other.iterate(tx)}
            if name == "union":
                for k, v in keys.items():
                    result.entries.setdefault(k, v)
            elif name == "intersection":
                result.entries = {k: v for k, v in result.entries.items() if k in keys}
            elif name == "difference":
                result.entries = {k: v for k, v in result.entries.items() if k not in keys}
            else:
                mine = result.entries
                result.entries = {**{k: v for k, v in mine.items() if k not in keys}, **{k: v for k, v in keys.items() if k not in mine}}
        return result


_SET_MUTATORS = {"add", "discard", "remove", "update", "pop", "clear", "intersection_update", "difference_update", "symmetric_difference_update"}
_SET_METHODS = _SET_MUTATORS | {"union", "intersection", "difference", "symmetric_difference", "issubset", "issuperset",
                                "isdisjoint", "copy", "__contains__", "__len__"}


class IteratorVariable(Variable):
    """An iterator over items known now (iter(list), zip, enumerate, map, reversed, ...). One the
    caller holds (`source`) is advanced for real after the graph runs by the items the trace took
    (`taken`, side_effects.py)."""

    def __init__(self, items: Sequence[Variable], source: Any = None) -> None:
        super().__init__(source)
        self.items, self.position = list(items), 0
        self.cls: type = type(iter([]))  # (a range's or a string's iterator says so)
        self.taken = 0

    def python_type(self) -> type:
        return self.cls

    def took(self, tx: Any, count: int = 1) -> None:
        """`count` items were taken: from the caller's iterator too, once the graph has run."""
        if self.source is not None and count:
            self.taken += count
            tx.output.side_effects.record_mutation(self)

    def next(self, tx: Any) -> Variable | None:
        """The next item, or None when exhausted."""
        if self.position >= len(self.items):
            return None
        item = self.items[self.position]
        self.position += 1
        self.took(tx)
        return item

    def iterate(self, tx: Any) -> list[Variable]:
        rest = self.items[self.position:]
        self.position = len(self.items)
        self.took(tx, len(rest))
        return rest

    def get_iter(self, tx: Any) -> Variable:
        return self

    def truth(self, tx: Any) -> bool:
        return True

    def getattr(self, tx: Any, name: str) -> Variable:
        if name in ("__next__", "__iter__"):
            return BoundBuiltinMethod(self, name)
        return super().getattr(tx, name)

    def call_method(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if name == "__iter__" and not args and not kwargs:
            return self
        if name == "__next__" and not args and not kwargs:
            item = self.next(tx)
            if item is None:
                raise UserRaise(ExceptionVariable(StopIteration))
            return item
        return super().call_method(tx, name, args, kwargs)


GENERATOR_ITEM_LIMIT = 10_000


def stop_iteration(iterator: Variable, was_running: bool) -> UserRaise:
    """The StopIteration an exhausted iterator raises: a generator that returned just now (it was
    `was_running` before the call) carries what it returned, as `StopIteration(value)`."""
    returned = getattr(iterator, "result", None) if was_running and isinstance(iterator, GeneratorIterator) else None
    if returned is None or returned.is_constant() and returned.as_constant() is None:
        return UserRaise(ExceptionVariable(StopIteration))
    return UserRaise(ExceptionVariable(StopIteration, (returned,)))


class GeneratorIterator(IteratorVariable):
    """A user generator being consumed: its frame runs to the next yield each time an item is asked
    for, so the generator's effects interleave with the consumer's as in Python."""

    def __init__(self, frame: Any) -> None:
        super().__init__([])
        self.frame = frame  # None once the generator returned or raised
        self.started = False  # past its first yield's request: suspended at a yield from then on
        self.result: Variable = const(None)  # what it returned, once it has
        if frame is not None:
            frame.output.generators.append(self)

    def suspended_at(self) -> tuple[Any, int] | None:
        """(code, offset of its yield) where the generator waits, or None if it finished or never ran."""
        if self.frame is None or not self.started:
            return None
        return self.frame.code, self.frame.instructions[self.frame.ip - 1].offset

    def python_type(self) -> type:
        return types.GeneratorType

    def send(self, tx: Any, value: Variable) -> Variable | None:
        """`gen.send(value)`: the suspended yield's value is `value`, then on to the next yield."""
        if not self.started:
            if not (value.is_constant() and value.as_constant() is None):
                raise raise_real(TypeError("can't send non-None value to a just-started generator"))
        elif self.frame is not None:
            self.frame.stack[-1] = value  # (YIELD_VALUE left None there for the resumed code)
        return self.next(tx)

    def throw(self, tx: Any, exc: Variable) -> Variable | None:
        """`gen.throw(exc)`: `exc` raised at the suspended yield (into the generator's own
        handlers), then on to the next yield; a generator that does not catch it is finished."""
        if self.frame is None or not self.started:
            self.frame = None
            raise UserRaise(exc)
        frame = self.frame
        at_yield = frame.instructions[frame.ip - 1]  # (suspended just after its YIELD_VALUE)
        if frame.ip >= 2 and frame.instructions[frame.ip - 2].opname == "SEND":
            raise unsupported("unsupported_call", "throw() or close() into a generator inside `yield from` (Python hands it "
                              "to the inner generator)")
        frame.stack.pop()
        error = UserRaise(exc)
        if not frame._to_handler(error, at_yield):
            self.frame = None
            raise error
        return self.next(tx)

    def close(self, tx: Any) -> Variable:
        """`gen.close()`: GeneratorExit at the suspended yield; one it lets out, or a return, ends
        it; a yield instead is Python's RuntimeError. Its value: None, or from 3.13 what the
        generator returned when closed."""
        if self.frame is None or not self.started:
            self.frame = None
            return const(None)
        try:
            item = self.throw(tx, ExceptionVariable(GeneratorExit))
        except UserRaise as error:
            if error.is_instance(GeneratorExit) or error.is_instance(StopIteration):
                return const(None)
            raise
        if item is not None:
            raise raise_real(RuntimeError("generator ignored GeneratorExit"))
        return self.result if sys.version_info >= (3, 13) else const(None)

    def next(self, tx: Any) -> Variable | None:
        if self.frame is None:
            return None
        self.started = True
        try:
            self.frame.run()
        except UserRaise as error:
            self.frame = None  # a generator that raised is finished
            if error.is_instance(StopIteration):  # PEP 479: it leaves the generator as a RuntimeError
                raise UserRaise(ExceptionVariable(RuntimeError, (const("generator raised StopIteration"),))) from None
            raise
        if self.frame.yields:
            return self.frame.yields.pop(0)
        self.result = self.frame.return_value  # (a `yield from` expression's value)
        self.frame = None  # returned
        return None

    def iterate(self, tx: Any) -> list[Variable]:
        # zip, map and enumerate consume whole iterators while capturing: an endless generator
        # under them must stop capture, not hang it.
        items = []
        while (item := self.next(tx)) is not None:
            items.append(item)
            if len(items) > GENERATOR_ITEM_LIMIT:
                raise unsupported("unsupported_iteration", f"a generator consumed whole yielded more than {GENERATOR_ITEM_LIMIT} items",
                                  "pass a finite generator, or take its items with next() or a for loop")
        return items
