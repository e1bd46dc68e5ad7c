"""User-defined objects and classes, Python modules, `super()`, and HuggingFace `ModelOutput`s.

Attribute reads follow Python's rules (data descriptors, then the instance dict, then class
attributes and methods, then `__getattr__`), with properties and methods inlined. Writes to an
object that outlives the call are recorded as side effects; objects made during the trace hold
their attributes here and are rebuilt if they escape.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import operator
import re
import types
from typing import Any, Sequence

from torch import nn

from kiln.capture.break_records import unsupported
from kiln.capture.guards import Guard
from kiln.capture.sources import AttrSource, ClassDictSource, ConstSource, InstanceDictSource, ItemSource, KeysSource, Source
from kiln.capture.user_exceptions import ExceptionVariable, UserRaise, raise_real
from kiln.capture.variables.base import BoundBuiltinMethod, RealValueVariable, Variable
from kiln.capture.variables.constant import ConstantVariable, is_literal, is_plain_data, plain_data
from kiln.capture.variables.containers import (GENERATOR_ITEM_LIMIT, DequeVariable, DictVariable, IteratorVariable, ListViewVariable, NamedTupleVariable,
                                              TupleVariable, hash_key, wrap_dict_contents, wrap_list_contents)
from kiln.capture.variables.functions import BoundMethodVariable
from kiln.capture.variables.wrapping import wrap, wrap_constant_result

_MISSING = object()
_CONTAINER_BASES = (dict, collections.OrderedDict, set, frozenset, list)


def class_lookup(cls: type, name: str) -> tuple[Any, type | None]:
    """The raw class attribute `name` (as stored in the defining class's __dict__) and its owner."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name], klass
    return _MISSING, None


def class_attr_source(owner: type, name: str) -> Source:
    return ItemSource(ClassDictSource(owner), name)


def _pinned_function(tx: Any, fn: Any, owner: type, name: str) -> Variable:
    """The variable for a function the class dict holds, pinned by the guard on that entry. It gets
    a source of its own so that what it reaches through its closure has one too: a list a method
    appends to from its enclosing function is then changed for real (replayed), not in a copy."""
    if tx is None or not isinstance(fn, types.FunctionType):
        return wrap_constant_result(fn)
    return wrap(tx, fn, ConstSource(fn, f"{owner.__qualname__}.{name}"))


def wrap_class_attr(tx: Any, raw: Any, owner: type, name: str, instance: Variable | None, cls_var: Variable | None = None) -> Variable:
    """What `instance.name` (or `cls.name`) gives for a class attribute `raw`, descriptors applied."""
    pending = pending_class_attr(tx, owner, name)
    if pending is not None:
        return pending
    if _is_descriptor_or_function(raw):
        # The class dict can be patched between calls (`Cls.method = other`): pin the entry.
        tx.output.guards.add(Guard("ID_MATCH", class_attr_source(owner, name), raw))
    if isinstance(raw, staticmethod):
        return _pinned_function(tx, raw.__func__, owner, name)
    if isinstance(raw, classmethod):
        # Bound to the instance's class, not to the class that defines it (`cls(...)` inside
        # Set._from_iterable builds an OrderedSet when reached from one).
        if cls_var is not None or isinstance(instance, ClassVariable):  # (super() in a classmethod: the class)
            bound_to = cls_var or instance
        else:
            bound_to = ClassVariable(instance.python_type() if instance is not None else owner)
        return BoundMethodVariable(_pinned_function(tx, raw.__func__, owner, name), bound_to)
    if isinstance(raw, property):
        if instance is None:
            return OpaqueVariable(raw)
        if raw.fget is None:
            raise raise_real(AttributeError(f"property {name!r} has no getter"))
        if not isinstance(raw.fget, types.FunctionType) and isinstance(instance, UserObjectVariable):
            # A getter written in C (a pybind11 class's property): read for real, guarded where the
            # object lives (an object made or changed by the trace cannot be: a break).
            if getattr(instance, "_written", False):
                raise unsupported("unsupported_attribute", f"property {name!r} written in C, of a {instance.describe()} the trace changed")
            return instance.getattr_real(tx, name)
        return _pinned_function(tx, raw.fget, owner, name).call(tx, [instance], {})
    if isinstance(raw, functools.cached_property):
        if instance is None:
            return OpaqueVariable(raw)
        value = _pinned_function(tx, raw.func, owner, name).call(tx, [instance], {})
        instance.setattr_plain(tx, raw.attrname or name, value)
        return value
    if isinstance(raw, types.FunctionType):
        func = _pinned_function(tx, raw, owner, name)
        return func if instance is None else BoundMethodVariable(func, instance)
    # Functions and descriptors are pinned by the class; plain values are guarded where they live.
    getter = _python_descriptor_method(raw, "__get__")
    if getter is not None and isinstance(instance, UserObjectVariable) and (instance.is_new or getattr(instance, "_written", False)):
        # A descriptor written in Python, on an object the trace made or changed: its `__get__`
        # inlined reads the trace's writes (a real read would see the object as it was).
        descriptor = wrap(tx, raw, class_attr_source(owner, name))
        return wrap_constant_result(getter).call(tx, [descriptor, instance, ClassVariable(instance.python_type())], {})
    if instance is not None and hasattr(type(raw), "__get__") and not isinstance(raw, type):
        return instance.getattr_real(tx, name)
    if raw is dict.__dict__["fromkeys"] and isinstance(cls_var, ClassVariable) and cls_var.value not in (dict, collections.OrderedDict, collections.defaultdict):
        return SubclassFromKeysVariable(cls_var)
    if isinstance(raw, types.ClassMethodDescriptorType) and isinstance(cls_var, ClassVariable):
        # A classmethod written in C read from the class (`itertools.chain.from_iterable`): bound
        # to it as Python binds it (a builtin method that kiln's handlers know by equality).
        return wrap(tx, raw.__get__(None, cls_var.value), None)
    return wrap(tx, raw, class_attr_source(owner, name))


class SubclassFromKeysVariable(Variable):
    """`D.fromkeys(keys, value)` of a dict subclass D, as dict's C code does it for one: `D()`,
    then `d[key] = value` for each key (D's own __init__ and __setitem__, where it has them)."""

    def __init__(self, cls_var: "ClassVariable") -> None:
        super().__init__(None)
        self.cls_var = cls_var

    def python_type(self) -> type:
        return types.BuiltinMethodType

    def getattr(self, tx: Any, name: str) -> Variable:
        if name in ("__name__", "__qualname__", "__self__"):
            return self.cls_var if name == "__self__" else ConstantVariable(getattr(dict.fromkeys, name))
        return super().getattr(tx, name)

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if kwargs or not 1 <= len(args) <= 2:
            raise raise_real(TypeError(f"fromkeys expected 1 to 2 arguments, got {len(args) + len(kwargs)}"))
        value = args[1] if len(args) == 2 else ConstantVariable(None)
        obj = self.cls_var.call(tx, [], {})
        for key in args[0].iterate(tx):
            obj.call_method(tx, "__setitem__", [key, value], {})
        return obj


def _python_descriptor_method(raw: Any, name: str) -> types.FunctionType | None:
    """`__get__`/`__set__`/`__delete__` of a descriptor whose class is written in Python."""
    method = getattr(type(raw), name, None) if not isinstance(raw, type) else None
    return method if isinstance(method, types.FunctionType) else None


def _is_descriptor_or_function(raw: Any) -> bool:
    return isinstance(raw, (types.FunctionType, staticmethod, classmethod, property, functools.cached_property)) or (
        hasattr(type(raw), "__get__") and not isinstance(raw, type))


def pending_class_attr(tx: Any, cls: type, name: str) -> Variable | None:
    """The value the trace assigned to `cls.name` (or to the class of `cls`'s MRO that it reads), if any."""
    for klass in cls.__mro__:
        written, value = tx.output.side_effects.pending_attr(klass, name)
        if written:
            return value
        if name in klass.__dict__:
            return None
    return None


_CONTENT_TYPES = (dict, list, set, frozenset)


class UserObjectVariable(Variable):
    """An instance of a user class. `value` is the real object, or None for one made in the trace."""

    # One variable for one real object, however many places the trace reaches it from (wrapping.py).
    one_per_object = True

    def __init__(self, value: Any, source: Source | None = None, cls: type | None = None) -> None:
        super().__init__(source)
        self.value = value
        self.cls = cls if cls is not None else type(value)
        self.attrs: dict[str, Variable] = {}  # a new object's attributes
        # Names written through `obj.__dict__` past a data descriptor: put back into the dict.
        self.dict_writes: frozenset[str] | set[str] = frozenset()

    @property
    def is_new(self) -> bool:
        return self.value is None

    def python_type(self) -> type:
        return self.cls

    def is_constant(self) -> bool:
        # A real object the trace has not written to can be passed to functions computed now —
        # but not an instance of a builtin container's subclass: its contents (what `in`, `len`,
        # `bool` and iteration read from C) have no guard, so it is read through its methods.
        return not self.is_new and not getattr(self, "_written", False) and not isinstance(self.value, _CONTENT_TYPES)

    def as_constant(self) -> Any:
        if not self.is_constant():
            return super().as_constant()
        return self.value

    def describe(self) -> str:
        return f"{self.cls.__qualname__} object"

    # --- attributes -------------------------------------------------------------------------

    def _instance_attr(self, tx: Any, name: str) -> Variable | None:
        if self.is_new:
            return self.attrs.get(name)
        written, value = tx.output.side_effects.pending_attr(self, name)
        if written:
            if value is None:
                return None
            return value
        instance_dict = getattr(self.value, "__dict__", None)
        if instance_dict is not None and name in instance_dict:
            # Guarded through the dict, as read: no class __getattribute__ runs in the guard.
            return wrap(tx, instance_dict[name], ItemSource(self._dict_source(), name) if self.source is not None else None)
        return None

    def _dict_source(self) -> Source:
        return InstanceDictSource(self.source)

    def container_view(self, tx: Any) -> Variable | None:
        """For a dict or set subclass: its contents as a DictVariable/SetVariable (a real one's
        guarded; one made in the trace holds them from its construction)."""
        if self.is_new:
            return getattr(self, "container", None)
        if not isinstance(self.value, (dict, list)):
            return None
        view = tx.output.wrapped.get(("view", self.source)) if self.source is not None else None
        if view is None:
            view = (wrap_dict_contents if isinstance(self.value, dict) else wrap_list_contents)(tx, self.value, self.source)
            if self.source is not None:
                tx.output.wrapped[("view", self.source)] = view
        return view

    def _guard_not_in_instance(self, tx: Any, name: str) -> None:
        # The class attribute is what the trace read: an instance attribute set later shadows it.
        if not self.is_new and self.source is not None and isinstance(getattr(self.value, "__dict__", None), dict):
            tx.output.guards.add(Guard("DICT_CONTAINS", self._dict_source(), False, name))

    def _guard_missing(self, tx: Any, name: str) -> None:
        """`obj.name` raised AttributeError: neither the instance nor a class of its MRO may gain it."""
        if self.is_new or self.source is None:
            return
        if not isinstance(getattr(self.value, "__dict__", None), dict):
            tx.output.guards.add(Guard("HASATTR", self.source, False, name))
            return
        self._guard_not_in_instance(tx, name)
        for klass in self.cls.__mro__[:-1]:  # `object` is builtin and cannot change
            tx.output.guards.add(Guard("DICT_CONTAINS", ClassDictSource(klass), False, name))

    def getattr_real(self, tx: Any, name: str) -> Variable:
        if self.is_new:
            raise unsupported("unsupported_attribute", f"attribute {name!r} of a {self.describe()} made while capturing")
        try:
            value = getattr(self.value, name)
        except AttributeError as error:
            if self.source is not None:  # an unset slot, a descriptor that raises: it must stay so
                tx.output.guards.add(Guard("HASATTR", self.source, False, name))
            raise raise_real(error) from None
        var = wrap(tx, value, AttrSource(self.source, name) if self.source is not None else None)
        if self.source is None and type(value) in (list, dict, set):
            # The container of a real object kiln holds without a way to reach it again (one a
            # folded call returned: `inspect.signature(f).bind(...).arguments`): changing it would
            # change only kiln's copy, not the object the frame returns (containers.record_change).
            var.unreplayable = True
        return var

    def getattr(self, tx: Any, name: str) -> Variable:
        hook, owner = class_lookup(self.cls, "__getattribute__")
        if not isinstance(hook, types.FunctionType) or name == "__class__":
            return self.generic_getattr(tx, name)
        # A class's own __getattribute__ (HuggingFace configs map names through `attribute_map`) is
        # inlined; `super().__getattribute__` inside it comes back to generic_getattr.
        try:
            return wrap_class_attr(tx, hook, owner, "__getattribute__", self).call(tx, [ConstantVariable(name)], {})
        except UserRaise as error:
            getattr_hook, getattr_owner = class_lookup(self.cls, "__getattr__")
            if not error.is_instance(AttributeError) or not isinstance(getattr_hook, types.FunctionType):
                raise
            return wrap_class_attr(tx, getattr_hook, getattr_owner, "__getattr__", self).call(tx, [ConstantVariable(name)], {})

    def generic_getattr(self, tx: Any, name: str, fallback: bool = True) -> Variable:
        """`object.__getattribute__` (data descriptors, instance dict, class), then `__getattr__` if `fallback`."""
        if name == "__class__":
            return ClassVariable(self.cls)
        if name == "__dict__" and (not self.is_new or self.cls.__dictoffset__):
            return InstanceDictVariable(self)
        raw, owner = class_lookup(self.cls, name)
        if owner in _CONTAINER_BASES:
            view = self.container_view(tx)
            if view is not None:
                # (a dunder read as an attribute is called back on the object: _contents_call)
                return BoundBuiltinMethod(self, name) if name.startswith("__") else view.getattr(tx, name)
        if self.is_new and isinstance(raw, types.MemberDescriptorType):
            # A __slots__ slot of an object made in the trace: its value is what the trace set.
            if name in self.attrs:
                return self.attrs[name]
            raise raise_real(AttributeError(f"'{self.cls.__name__}' object has no attribute '{name}'"))
        is_data_descriptor = raw is not _MISSING and (isinstance(raw, property) or hasattr(type(raw), "__set__") and not isinstance(raw, functools.cached_property))
        if is_data_descriptor and (isinstance(raw, property) or hasattr(type(raw), "__get__")):
            return wrap_class_attr(tx, raw, owner, name, self)
        # (a data descriptor without `__get__` yields to the instance's dict, then is itself the value)
        found = self._instance_attr(tx, name)
        if found is not None:
            return found
        if raw is not _MISSING:
            self._guard_not_in_instance(tx, name)
            return wrap_class_attr(tx, raw, owner, name, self)
        self._guard_missing(tx, name)  # also when __getattr__ answers: it runs only while `name` is missing
        getattr_hook, _ = class_lookup(self.cls, "__getattr__")
        if fallback and isinstance(getattr_hook, types.FunctionType):
            return wrap_constant_result(getattr_hook).call(tx, [self, ConstantVariable(name)], {})
        raise raise_real(AttributeError(f"'{self.cls.__name__}' object has no attribute '{name}'"))

    def setattr(self, tx: Any, name: str, value: Variable) -> None:
        if name == "__class__":
            self._set_class(value)
            return
        hook, _ = class_lookup(self.cls, "__setattr__")
        if isinstance(hook, types.FunctionType):
            wrap_constant_result(hook).call(tx, [self, ConstantVariable(name), value], {})
            return
        raw, owner = class_lookup(self.cls, name)
        if isinstance(raw, property):
            if raw.fset is None:
                raise raise_real(AttributeError(f"can't set attribute {name!r}"))
            wrap_constant_result(raw.fset).call(tx, [self, value], {})
            return
        setter = _python_descriptor_method(raw, "__set__")
        if setter is not None:  # a data descriptor written in Python: its `__set__`, inlined
            wrap_constant_result(setter).call(tx, [wrap(tx, raw, class_attr_source(owner, name)), self, value], {})
            return
        self.setattr_plain(tx, name, value)

    def _set_class(self, value: Variable) -> None:
        """`obj.__class__ = Other` on an object the trace made (one that outlives the call would
        need the change replayed: a break)."""
        new_cls = value.as_constant() if value.is_constant() else None
        if not self.is_new or not isinstance(new_cls, type) or new_cls.__module__ == "builtins" \
                or getattr(self.cls, "__slots__", None) is not None or getattr(new_cls, "__slots__", None) is not None:
            raise unsupported("unsupported_setattr", f"setting __class__ of a {self.describe()}")
        self.cls = new_cls

    def delattr(self, tx: Any, name: str) -> None:
        """`del obj.name`: the class's own `__delattr__` where it has one, else object's."""
        hook, _ = class_lookup(self.cls, "__delattr__")
        if isinstance(hook, types.FunctionType):
            wrap_constant_result(hook).call(tx, [self, ConstantVariable(name)], {})
            return
        self.delattr_plain(tx, name)

    def delattr_plain(self, tx: Any, name: str) -> None:
        """`object.__delattr__`: out of the instance dict; Python's AttributeError where a new
        object has no such attribute."""
        if self.is_new and name not in self.attrs:
            raise raise_real(AttributeError(f"'{self.cls.__name__}' object has no attribute '{name}'"))
        self.setattr_plain(tx, name, None)

    def setattr_plain(self, tx: Any, name: str, value: Variable | None) -> None:
        """`object.__setattr__`: into the instance dict (recorded if the object is real)."""
        if self.is_new:
            if value is None:
                self.attrs.pop(name, None)
            else:
                self.attrs[name] = value
            return
        if self.source is None:
            raise unsupported("unsupported_setattr", f"setting {name!r} on a {self.describe()} that kiln cannot reach after the call")
        self._written = True
        written, before = tx.output.side_effects.pending_attr(self, name)
        if value is None and written and before is not None and not hasattr(type(self.value), name):
            # Set by the trace, then deleted (`obj.c = y; del obj.c`): gone afterwards whether or not
            # the object had it before, so the replay takes it out of the instance dict if there.
            self.dict_writes = {*self.dict_writes, name}
        tx.output.side_effects.record_setattr(self, name, value)

    # --- protocols through dunder methods -----------------------------------------------------

    def _dunder(self, tx: Any, name: str, args: Sequence[Variable]) -> Variable | None:
        raw, owner = class_lookup(self.cls, name)
        if raw is _MISSING or owner is object:
            return None
        if owner in _CONTAINER_BASES:
            view = self.container_view(tx)
            if view is not None:
                return self._contents_call(tx, view, name, list(args), {})
        return wrap_class_attr(tx, raw, owner, name, self).call(tx, list(args), {})

    _CONTENTS_PROTOCOL = ("__contains__", "__len__", "__getitem__", "__setitem__", "__delitem__", "__iter__")

    def _contents_call(self, tx: Any, view: Variable, name: str, args: list, kwargs: dict) -> Variable:
        """A base type's method (dict's, set's) on the modelled contents: its operators through
        the operator (`__ior__` is `|=`: the object itself back), its protocol and named methods
        as the contents answer them; another dunder (`__repr__`, ...) is not modelled."""
        from kiln.capture.python_operators import BY_DUNDER, apply_binary  # python_operators.py imports this module

        if name in BY_DUNDER and len(args) == 1 and not kwargs:
            result = apply_binary(tx, BY_DUNDER[name], view, args[0])
            return self if result is view else result
        if name in ("__repr__", "__str__") and not args and is_plain_data(view):
            # The base's text of a real copy (`CustomSet({1, 2})`): its contents are constants.
            real = new_container_object(self.cls, plain_data(view))
            return ConstantVariable(getattr(_container_base(self.cls), name)(real))
        if name.startswith("__") and name not in self._CONTENTS_PROTOCOL:
            raise unsupported("unsupported_call", f"{name} of a {self.cls.__qualname__} object (a subclass of "
                              f"{_container_base(self.cls).__name__}) while capturing")
        return view.call_method(tx, name, args, kwargs)

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        raw, owner = class_lookup(self.cls, "__call__")
        if raw is _MISSING:
            raise raise_real(TypeError(f"'{self.cls.__name__}' object is not callable"))
        if not isinstance(raw, (types.FunctionType, staticmethod, classmethod)):
            raise unsupported("unsupported_call", f"calling {self.describe()} (its __call__ is implemented in C)")
        return wrap_class_attr(tx, raw, owner, "__call__", self).call(tx, args, kwargs)

    def truth(self, tx: Any) -> bool:
        view = self.container_view(tx)
        if view is not None and class_lookup(self.cls, "__len__")[1] in _CONTAINER_BASES:
            return view.truth(tx)
        for name in ("__bool__", "__len__"):
            result = self._dunder(tx, name, [])
            if result is not None:
                value = result.as_constant()
                if name == "__bool__" and not isinstance(value, bool):  # (Python checks what __bool__ gives)
                    raise raise_real(TypeError(f"__bool__ should return bool, returned {type(value).__name__}"))
                if name == "__len__" and (isinstance(value, bool) or not isinstance(value, int)):
                    raise raise_real(TypeError(f"'{type(value).__name__}' object cannot be interpreted as an integer"))
                if name == "__len__" and value < 0:
                    raise raise_real(ValueError("__len__() should return >= 0"))
                return bool(value)
        return True

    def iterate(self, tx: Any) -> list[Variable]:
        view = self.container_view(tx)
        if view is not None and class_lookup(self.cls, "__iter__")[1] in _CONTAINER_BASES:
            return view.iterate(tx)
        iterator = self.get_iter(tx)
        if not isinstance(iterator, UserIteratorVariable):
            return iterator.iterate(tx)
        items = []
        while (item := iterator.next(tx)) is not None:
            items.append(item)
            if len(items) > GENERATOR_ITEM_LIMIT:
                raise unsupported("unsupported_iteration", f"an iterator consumed whole yielded more than {GENERATOR_ITEM_LIMIT} items")
        return items

    def get_iter(self, tx: Any) -> Variable:
        view = self.container_view(tx)
        if view is not None and class_lookup(self.cls, "__iter__")[1] in _CONTAINER_BASES:
            return view.get_iter(tx)
        result = self._dunder(tx, "__iter__", [])
        if result is None:
            raise raise_real(TypeError(f"'{self.cls.__name__}' object is not iterable"))
        if isinstance(result, UserObjectVariable) and isinstance(class_lookup(result.cls, "__next__")[0], types.FunctionType):
            return UserIteratorVariable(result)  # (`__iter__` returning self: its `__next__`, one item at a time)
        return result.get_iter(tx)

    def length(self, tx: Any) -> int:
        result = self._dunder(tx, "__len__", [])
        if result is None:
            raise raise_real(TypeError(f"object of type '{self.cls.__name__}' has no len()"))
        return int(result.as_constant())

    def call_method(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if name in ("__getitem__", "__setitem__", "__contains__", "__delitem__") or name.startswith("__") and name.endswith("__"):
            raw, owner = class_lookup(self.cls, name)
            if raw is not _MISSING and owner in _CONTAINER_BASES and self.container_view(tx) is not None:
                return self._contents_call(tx, self.container_view(tx), name, list(args), kwargs)
            if raw is not _MISSING and owner is not object:
                return wrap_class_attr(tx, raw, owner, name, self).call(tx, list(args), kwargs)
            if name == "__setattr__" and raw is not _MISSING:
                self.setattr_plain(tx, args[0].as_constant(), args[1])
                return ConstantVariable(None)
        return self.getattr(tx, name).call(tx, args, kwargs)


class ClassVariable(RealValueVariable):
    """A class: calling it builds an object (its `__init__` inlined)."""

    def describe(self) -> str:
        return f"class {self.value.__qualname__}"

    def getattr(self, tx: Any, name: str) -> Variable:
        raw, owner = class_lookup(self.value, name)
        if name == "__new__" and owner in (object, tuple, *_CONTAINER_BASES):  # (`C.__new__(C)` inherited from a base)
            return NewObjectVariable(owner)
        if owner in _CONTAINER_BASES and isinstance(raw, (types.WrapperDescriptorType, types.MethodDescriptorType)):
            # A dict/set subclass's inherited builtin method read from the class (`C.__ior__`,
            # `C.add`): called with the object first, as the base's unbound method.
            from kiln.capture.variables.builtins import UnboundBuiltinMethod  # builtins.py imports this module

            return UnboundBuiltinMethod(owner, name)
        written, value = tx.output.side_effects.pending_attr(self.value, name)
        if written:
            if value is None:
                raise raise_real(AttributeError(f"type object '{self.value.__name__}' has no attribute '{name}'"))
            return value
        if name in ("__name__", "__qualname__", "__module__"):
            return ConstantVariable(getattr(self.value, name))
        if name == "__mro__":
            return TupleVariable([ClassVariable(k) for k in self.value.__mro__])
        raw, owner = class_lookup(self.value, name)
        if raw is _MISSING:
            meta_raw, meta_owner = class_lookup(type(self.value), name)
            if meta_raw is not _MISSING and isinstance(meta_raw, types.FunctionType):
                return BoundMethodVariable(wrap_constant_result(meta_raw), self)
            if isinstance(meta_raw, property) and isinstance(meta_raw.fget, types.FunctionType):
                # A property of the metaclass, read on the class (torch.distributed's `GroupMember.WORLD`)
                tx.output.guards.add(Guard("ID_MATCH", class_attr_source(meta_owner, name), meta_raw))
                return wrap_constant_result(meta_raw.fget).call(tx, [self], {})
            raise raise_real(AttributeError(f"type object '{self.value.__name__}' has no attribute '{name}'"))
        from kiln.capture.variables.autograd_function import PY_APPLY, FunctionApplyVariable  # (imports this module)

        if raw is PY_APPLY:  # `MyFunction.apply` of an autograd.Function that keeps torch's apply
            return FunctionApplyVariable(self.value)
        return wrap_class_attr(tx, raw, owner, name, None, self)

    def setattr(self, tx: Any, name: str, value: Variable | None) -> None:
        """`Cls.name = value`: recorded and replayed after the graph, as for any object that outlives the call."""
        if self.source is None:
            self.source = ConstSource(self.value, self.value.__qualname__)
        tx.output.side_effects.record_setattr(self, name, value, key=self.value)

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        cls = self.value
        if issubclass(cls, BaseException):
            return ExceptionVariable.construct(cls, tuple(args), kwargs)
        if _is_model_output(cls):
            return ModelOutputVariable.construct(tx, cls, args, kwargs)
        if hasattr(cls, "_fields") and issubclass(cls, tuple):
            fields = list(cls._fields)
            values = dict(zip(fields, args))
            values.update(kwargs)
            defaults = getattr(cls, "_field_defaults", {})
            items = [values[f] if f in values else _constant(defaults[f]) for f in fields]
            return NamedTupleVariable(items, cls)
        if cls is collections.deque:
            return _new_deque(tx, args, kwargs)
        if issubclass(cls, tuple) and hasattr(cls, "n_sequence_fields") and len(args) == 1 and not kwargs:
            # A struct sequence (`torch.return_types.max((values, indices))`, `os.stat_result`):
            # built from one sequence of exactly its fields.
            items = args[0].iterate(tx)
            if len(items) != cls.n_sequence_fields or cls.n_fields != cls.n_sequence_fields:
                raise raise_real(TypeError(f"{cls.__module__}.{cls.__name__}() takes a {cls.n_sequence_fields}-sequence "
                                           f"({len(items)}-sequence given)"))
            return NamedTupleVariable(items, cls)
        if all(a.is_constant() for a in (*args, *kwargs.values())) and _constructs_constant(cls):
            try:
                value = cls(*[a.as_constant() for a in args], **{k: v.as_constant() for k, v in kwargs.items()})
            except Exception as error:  # noqa: BLE001
                raise raise_real(error) from None
            return ConstantVariable(value)
        new, new_owner = class_lookup(cls, "__new__")
        if new_owner in _CONTAINER_BASES and not issubclass(cls, nn.Module):
            return _new_container_subclass(tx, cls, args, kwargs)
        if issubclass(cls, nn.Module):
            from kiln.capture.variables.modules import ephemeral_module  # modules.py imports this module

            return ephemeral_module(tx, cls, args, kwargs)
        if new_owner is tuple and not hasattr(cls, "_fields"):
            return _tuple_subclass_object(tx, cls, args, kwargs)
        if isinstance(new, staticmethod) and isinstance(new.__func__, types.FunctionType) and \
                all(base in (object, tuple, *_CONTAINER_BASES) or "__new__" not in vars(base) or base is new_owner for base in cls.__mro__):
            return self._call_user_new(tx, new, new_owner, args, kwargs)
        if new is not object.__new__ and not isinstance(new, staticmethod) or isinstance(new, staticmethod) and new.__func__ is not object.__new__:
            raise unsupported("unsupported_call", f"building a {cls.__qualname__} (it defines __new__) while capturing")
        obj = UserObjectVariable(None, None, cls)
        init, owner = class_lookup(cls, "__init__")
        if isinstance(init, types.FunctionType):
            wrap_class_attr(tx, init, owner, "__init__", obj).call(tx, args, kwargs)
        elif args or kwargs:
            raise raise_real(TypeError(f"{cls.__name__}() takes no arguments"))
        return obj

    def _call_user_new(self, tx: Any, new: staticmethod, owner: type, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        """`C(...)` where C defines `__new__` in Python: it inlined (its `super().__new__(cls)`
        reaching object's or a container base's, NewObjectVariable), then, as `type.__call__`
        does, `__init__` on what it returned when that is an instance of C."""
        cls = self.value
        obj = _pinned_function(tx, new.__func__, owner, "__new__").call(tx, [self, *args], kwargs)
        if isinstance(obj, NamedTupleVariable) and issubclass(obj.cls, cls):  # (a tuple subclass's)
            init, init_owner = class_lookup(obj.cls, "__init__")
            if isinstance(init, types.FunctionType):
                wrap_class_attr(tx, init, init_owner, "__init__", obj).call(tx, args, kwargs)
            return obj
        if not (isinstance(obj, UserObjectVariable) and issubclass(obj.cls, cls)):
            return obj
        init, init_owner = class_lookup(obj.cls, "__init__")
        if isinstance(init, types.FunctionType):
            wrap_class_attr(tx, init, init_owner, "__init__", obj).call(tx, args, kwargs)
        elif getattr(obj, "container", None) is not None and init_owner is not frozenset:
            _fill_container(tx, obj, args, kwargs)  # (the base's __init__: dict(...)/set(...) fill it)
        return obj

    def call_method(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if name == "__call__":
            return self.call(tx, args, kwargs)
        return super().call_method(tx, name, args, kwargs)


class UserIteratorVariable(IteratorVariable):
    """An object of a class with a Python `__next__`, being iterated: each item its `__next__`
    (inlined) until that raises StopIteration."""

    def __init__(self, obj: UserObjectVariable) -> None:
        super().__init__([])
        self.obj = obj

    def python_type(self) -> type:
        return self.obj.cls

    def next(self, tx: Any) -> Variable | None:
        try:
            return self.obj._dunder(tx, "__next__", [])
        except UserRaise as error:
            if error.is_instance(StopIteration):
                return None
            raise

    def iterate(self, tx: Any) -> list[Variable]:
        return self.obj.iterate(tx)

    # (`it = iter(obj)` is obj itself in Python: its attributes and other methods are the object's)
    def getattr(self, tx: Any, name: str) -> Variable:
        return super().getattr(tx, name) if name in ("__next__", "__iter__") else self.obj.getattr(tx, name)

    def setattr(self, tx: Any, name: str, value: Variable) -> None:
        self.obj.setattr(tx, name, value)


class NewObjectVariable(Variable):
    """`object.__new__` or a container base's (`dict.__new__`, `set.__new__`, ...), as a class's
    own `__new__` calls it (`super().__new__(cls)`): a new object of the class given, without
    its `__init__` run; a container's contents empty (a frozenset's, its first argument's items)."""

    def __init__(self, base: type) -> None:
        super().__init__(None)
        self.base = base

    def python_type(self) -> type:
        return types.BuiltinFunctionType

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        from kiln.capture.variables.containers import SetVariable  # containers.py imports this module

        cls = getattr(args[0], "value", None) if args else None
        if not isinstance(cls, type) or not issubclass(cls, self.base):
            raise unsupported("unsupported_call", f"{self.base.__name__}.__new__ of {args[0].describe() if args else 'nothing'}")
        if self.base is tuple:  # (`tuple.__new__(cls, items)`: the items, as an object of cls)
            if len(args) > 2 or kwargs:
                raise raise_real(TypeError("tuple expected at most 1 argument"))
            items = args[1].iterate(tx) if len(args) > 1 else []
            return TupleVariable(items) if cls is tuple else NamedTupleVariable(items, cls)
        if cls in _CONTAINER_BASES:  # (`dict.__new__(dict)`: an empty dict, as the type itself makes)
            if cls is frozenset:
                return SetVariable(list(args[1].iterate(tx)) if len(args) > 1 else [], frozen=True)
            return _empty_contents(cls)
        if self.base is object and _container_base_or_none(cls) is not None or issubclass(cls, (nn.Module, BaseException)):
            raise unsupported("unsupported_call", f"{self.base.__name__}.__new__({cls.__qualname__})")
        obj = UserObjectVariable(None, None, cls)
        if self.base is not object:
            base = _container_base(cls)
            obj.container = _empty_contents(base)
            if base is frozenset:
                _fill_container(tx, obj, args[1:2], {})
        return obj


def _empty_contents(base: type) -> Variable:
    from kiln.capture.variables.containers import DictVariable, ListVariable, SetVariable  # containers.py imports this module

    if issubclass(base, dict):
        return DictVariable(cls=base)
    return ListVariable([]) if base is list else SetVariable([], frozen=base is frozenset)


def _container_base_or_none(cls: type) -> type | None:
    return next((base for base in cls.__mro__ if base in _CONTAINER_BASES), None)


def _container_base(cls: type) -> type:
    return next(base for base in cls.__mro__ if base in _CONTAINER_BASES)


def _new_container_subclass(tx: Any, cls: type, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
    """`C(...)` for a subclass C of dict, OrderedDict, set or frozenset: an object of C whose
    contents are a modelled dict or set (what the base's methods and operators act on), filled
    by C's own __init__ if it has one (its super().__init__ reaching the base's), else by the
    base's. A frozenset takes its items at construction, from the arguments."""
    from kiln.capture.variables.containers import DictVariable, SetVariable  # containers.py imports this module

    base = _container_base(cls)
    obj = UserObjectVariable(None, None, cls)
    obj.container = _empty_contents(base)
    init, owner = class_lookup(cls, "__init__")
    if base is frozenset:
        _fill_container(tx, obj, args[:1], {})
        if isinstance(init, types.FunctionType):
            wrap_class_attr(tx, init, owner, "__init__", obj).call(tx, args, kwargs)
    elif isinstance(init, types.FunctionType):
        wrap_class_attr(tx, init, owner, "__init__", obj).call(tx, args, kwargs)
    else:
        _fill_container(tx, obj, args, kwargs)
    return obj


def new_container_object(cls: type, contents: Any) -> Any:
    """A real object of a dict/set subclass holding `contents`, its own __init__ not run."""
    if issubclass(cls, frozenset):
        return cls.__new__(cls, contents)
    obj = cls.__new__(cls)
    if isinstance(obj, list):
        list.extend(obj, contents)
    elif isinstance(obj, collections.OrderedDict):  # (its own order table: dict.update would bypass it)
        for key, value in contents.items():
            collections.OrderedDict.__setitem__(obj, key, value)
    else:
        (dict.update if isinstance(obj, dict) else set.update)(obj, contents)
    return obj


def _fill_container(tx: Any, obj: UserObjectVariable, args: Sequence[Variable], kwargs: dict[str, Variable]) -> None:
    """The base type's __init__ on the object's contents: dict(mapping or pairs, **kw), set(iterable)."""
    from kiln.capture.variables.containers import ListVariable, SetVariable, hash_key  # containers.py imports this module

    if len(args) > 1:
        raise raise_real(TypeError(f"{obj.cls.__name__} expected at most 1 argument, got {len(args)}"))
    container = obj.container
    if isinstance(container, ListVariable):
        if kwargs:
            raise raise_real(TypeError(f"{obj.cls.__name__}() takes no keyword arguments"))
        container.items[:] = list(args[0].iterate(tx)) if args else []
    elif isinstance(container, SetVariable):
        if kwargs:
            raise raise_real(TypeError(f"{obj.cls.__name__}() takes no keyword arguments"))
        for item in args[0].iterate(tx) if args else []:
            container.entries.setdefault(hash_key(item), item)
    else:
        container._update(tx, *args, **kwargs)


class ContainerInitVariable(Variable):
    """`super().__init__` of a dict or set subclass made in the trace: the base's __init__."""

    def __init__(self, obj: UserObjectVariable) -> None:
        super().__init__(None)
        self.obj = obj

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if _container_base(self.obj.cls) is not frozenset:  # (frozenset.__init__ takes and ignores them)
            _fill_container(tx, self.obj, args, kwargs)
        return ConstantVariable(None)


def _is_model_output(cls: type) -> bool:
    return any(base.__name__ == "ModelOutput" and base.__module__.startswith("transformers") for base in cls.__mro__)


def _constant(value: Any) -> Variable:
    return wrap_constant_result(value)


def _constructs_constant(cls: type) -> bool:
    """Classes whose objects built from constants are constants: enums, NumPy's dtype and its
    integer and float limits (`np.iinfo(np.int16).max`)."""
    return issubclass(cls, enum.Enum) or cls.__module__ == "numpy" and cls.__name__ in ("dtype", "iinfo", "finfo")


class PythonModuleVariable(Variable):
    """A Python module (`math`, `torch.nn.functional`, the user's own module)."""

    def __init__(self, value: types.ModuleType, source: Source | None = None) -> None:
        super().__init__(source)
        self.value = value

    def python_type(self) -> type:
        return types.ModuleType

    def describe(self) -> str:
        return f"module {self.value.__name__}"

    def getattr(self, tx: Any, name: str) -> Variable:
        # A global of that module the trace wrote (a function of the module ran `global x; x += 1`)
        # is read as written: the write is replayed after the graph.
        pending = tx.output.side_effects.pending_global(self.value.__dict__, name) if tx is not None else None
        if pending is not None:
            return pending
        try:
            value = getattr(self.value, name)
        except AttributeError as error:
            raise raise_real(error) from None
        # The standard library and torch do not change under a running program: no guard.
        # The standard library's and torch's functions, classes and constants do not change under a
        # running program: no guard. Their mutable state (os.environ, a registry dict) is guarded.
        fixed = self.value.__name__.split(".")[0] in _FIXED_MODULES and _is_definition(value)
        if fixed:
            return wrap(tx, value, None)
        return wrap(tx, value, AttrSource(self.source or ConstSource(self.value, self.value.__name__), name))


def _is_definition(value: Any) -> bool:
    return callable(value) or isinstance(value, (type, types.ModuleType)) or is_literal(value)


_FIXED_MODULES = {"torch", "math", "operator", "functools", "itertools", "collections", "typing", "builtins", "inspect", "warnings", "dataclasses", "enum", "abc", "types", "copy", "numbers", "contextlib", "logging", "sys", "os"}


_IMMUTABLE = (str, bytes, int, float, complex, tuple, frozenset, range, type(None), types.MappingProxyType, re.Pattern)
_IMMUTABLE_TYPES = (str, bytes, int, bool, float, complex, tuple, frozenset)


def _tuple_subclass_object(tx: Any, cls: type, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
    """`C(items)` for a tuple subclass of the user's that keeps tuple's `__new__`: its items, as an
    object of C, then C's own `__init__` where it has one."""
    if len(args) > 1 or kwargs and not isinstance(class_lookup(cls, "__init__")[0], types.FunctionType):
        raise raise_real(TypeError(f"{cls.__name__} expected at most 1 argument, got {len(args)}"))
    obj = NamedTupleVariable(args[0].iterate(tx) if args else [], cls)
    init, owner = class_lookup(cls, "__init__")
    if isinstance(init, types.FunctionType):
        wrap_class_attr(tx, init, owner, "__init__", obj).call(tx, args, kwargs)
    return obj


def _new_deque(tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
    """`collections.deque(iterable=(), maxlen=None)`."""
    bound = dict(zip(("iterable", "maxlen"), args), **kwargs)
    if len(args) > 2 or set(bound) - {"iterable", "maxlen"}:
        raise raise_real(TypeError("deque() takes at most 2 arguments"))
    maxlen = bound["maxlen"].as_constant() if "maxlen" in bound else None
    if maxlen is not None and (not isinstance(maxlen, int) or maxlen < 0):
        raise raise_real(ValueError("maxlen must be non-negative"))
    deque = DequeVariable([], maxlen=maxlen)
    if "iterable" in bound:
        deque._extend(tx, bound["iterable"])
    return deque


class _DescriptorGet(BoundBuiltinMethod):
    """`Tensor.shape.__get__`: called, the attribute read from its argument (OpaqueVariable);
    compared, hashed or kept, the real method-wrapper (`Tensor.grad.__get__ in nowrap_functions`)."""

    def __init__(self, descriptor: "OpaqueVariable") -> None:
        super().__init__(descriptor, "__get__")

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.obj.value.__get__


class OpaqueVariable(RealValueVariable):
    """A real object kiln only passes along (descriptors, builtin methods of real objects)."""

    def getattr(self, tx: Any, name: str) -> Variable:
        if name == "__get__" and isinstance(self.value, (types.GetSetDescriptorType, types.MemberDescriptorType)):
            return _DescriptorGet(self)
        try:
            return _constant(getattr(self.value, name))
        except AttributeError as error:
            raise raise_real(error) from None

    def call_method(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if name == "__get__" and isinstance(self.value, (types.GetSetDescriptorType, types.MemberDescriptorType)):
            # `Tensor.shape.__get__(x)`: the attribute the descriptor stands for, read from x.
            if not args or kwargs or len(args) > 2:
                raise raise_real(TypeError(f"expected 1 or 2 arguments, got {len(args)}"))
            obj = args[0]
            if obj.is_constant() and obj.as_constant() is None:
                return self
            if not issubclass(obj.python_type(), self.value.__objclass__):
                raise raise_real(TypeError(f"descriptor '{self.value.__name__}' for '{self.value.__objclass__.__name__}' "
                                           f"objects doesn't apply to a '{obj.python_type().__name__}' object"))
            return obj.getattr(tx, self.value.__name__)
        return super().call_method(tx, name, args, kwargs)

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        owner = getattr(self.value, "__self__", None)
        if getattr(self.value, "__name__", None) == "__get__" and isinstance(owner, (types.GetSetDescriptorType, types.MemberDescriptorType)):
            # `type.__dict__["__dict__"].__get__(C)`: the descriptor's `__get__` taken beforehand, called.
            if owner is type.__dict__["__dict__"] and len(args) == 1 and not kwargs and isinstance(args[0], ClassVariable):
                return wrap(tx, args[0].value.__dict__, ClassDictSource(args[0].value))  # (the class's namespace)
            return OpaqueVariable(owner).call_method(tx, "__get__", args, kwargs)
        if isinstance(self.value, property) or not all(a.is_constant() for a in (*args, *kwargs.values())):
            raise unsupported("unsupported_call", f"calling {self.describe()} while capturing")
        if not isinstance(owner, _IMMUTABLE) and not any(owner is t for t in _IMMUTABLE_TYPES):
            # (a method of an immutable value, or a class method of its type, `int.from_bytes`,
            # `bool.__new__(bool, 1)`: a pure function of its arguments)
            # C code of unknown effects (random.random, time.time, a counter's __next__): its result
            # may differ on every call, so it cannot be computed once while capturing.
            raise unsupported("unsupported_call", f"calling {self.value!r}, C code kiln does not model, while capturing",
                              "the call runs outside the graph (a graph break); call it outside the compiled code and pass the result in")
        try:
            result = self.value(*[a.as_constant() for a in args], **{k: v.as_constant() for k, v in kwargs.items()})
        except Exception as error:  # noqa: BLE001
            raise raise_real(error) from None
        return _constant(result)


class SuperVariable(Variable):
    """`super()` / `super(cls, obj)`: attribute lookup starting after `cls` in obj's MRO."""

    def __init__(self, cls: type, obj: Variable) -> None:
        super().__init__(None)
        self.cls, self.obj = cls, obj

    def python_type(self) -> type:
        return super

    def getattr(self, tx: Any, name: str) -> Variable:
        obj_type = self.obj.value if isinstance(self.obj, ClassVariable) else self.obj.python_type()
        mro = obj_type.__mro__
        start = mro.index(self.cls) + 1 if self.cls in mro else len(mro)
        for klass in mro[start:]:
            if name in klass.__dict__:
                raw = klass.__dict__[name]
                instance = None if isinstance(self.obj, ClassVariable) else self.obj
                if klass in _CONTAINER_BASES and isinstance(self.obj, UserObjectVariable) and self.obj.container_view(tx) is not None:
                    if name == "__init__":  # dict.__init__(self, ...): fills the contents
                        return ContainerInitVariable(self.obj)
                    return self.obj.container_view(tx).getattr(tx, name)
                if isinstance(raw, classmethod):
                    cls_var = self.obj if isinstance(self.obj, ClassVariable) else ClassVariable(obj_type)
                    return BoundMethodVariable(_constant(raw.__func__), cls_var)
                if isinstance(raw, types.ClassMethodDescriptorType):
                    from kiln.capture.variables.autograd_function import C_APPLY, FunctionApplyVariable  # (imports this module)

                    if raw is C_APPLY:  # autograd.Function.apply's `super().apply` (HF's BLOOM GeLU)
                        return FunctionApplyVariable(obj_type)
                    # A classmethod written in C: bound to the class as Python binds it, called for real.
                    return _constant(raw.__get__(None, obj_type))
                if name == "__new__" and (klass is object or klass is tuple or klass in _CONTAINER_BASES):
                    return NewObjectVariable(klass)
                if raw is object.__init__ or raw is object.__setattr__ or klass is object and callable(raw):
                    return ObjectSlotVariable(name, self.obj)
                from kiln.capture.variables.torch_fns import special_callable  # torch_fns.py imports modules.py, which imports this module

                special = special_callable(raw)
                if special is not None:
                    return BoundMethodVariable(special, self.obj)
                return wrap_class_attr(tx, raw, klass, name, instance)
        raise raise_real(AttributeError(f"'super' object has no attribute '{name}'"))


class ObjectSlotVariable(Variable):
    """`object.__init__`, `object.__setattr__` and friends reached through super() or object."""

    def __init__(self, name: str, obj: Variable | None = None) -> None:
        super().__init__(None)
        self.name, self.obj = name, obj

    def python_type(self) -> type:
        return types.MethodWrapperType

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        args = list(args) if self.obj is None else [self.obj, *args]
        if self.name == "__init__":
            return ConstantVariable(None)
        if self.name in ("__setattr__", "__delattr__") and isinstance(args[0], UserObjectVariable):
            # Past the class's own __setattr__ (a frozen dataclass's): the replay must be too.
            args[0].raw_setattr = True
            if self.name == "__delattr__":
                args[0].delattr_plain(tx, args[1].as_constant())
            else:
                args[0].setattr_plain(tx, args[1].as_constant(), args[2])
            return ConstantVariable(None)
        if self.name == "__getattribute__":
            if isinstance(args[0], UserObjectVariable) and not isinstance(args[0], _module_variable_type()):
                return args[0].generic_getattr(tx, args[1].as_constant(), fallback=False)
            return args[0].getattr(tx, args[1].as_constant())
        if self.name in _OBJECT_COMPARISONS and len(args) == 2:
            return _object_comparison(tx, self.name, args[0], args[1])
        raise unsupported("unsupported_call", f"object.{self.name} on {args[0].describe()}")


_OBJECT_COMPARISONS = ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__")


def _object_comparison(tx: Any, name: str, a: Variable, b: Variable) -> Variable:
    """object's own comparison slots, as a `super().__ne__(other)` reaches them: `__eq__` is
    identity (else NotImplemented), `__ne__` inverts the class's `__eq__`, the orderings are
    NotImplemented."""
    from kiln.capture.python_operators import apply_binary, identical  # python_operators.py imports this module

    if name == "__eq__":
        return ConstantVariable(True if identical(a, b) else NotImplemented)
    if name == "__ne__":
        equal = a._dunder(tx, "__eq__", [b]) if isinstance(a, UserObjectVariable) else apply_binary(tx, operator.eq, a, b)
        if equal is None:
            equal = ConstantVariable(True if identical(a, b) else NotImplemented)
        if equal.is_constant() and equal.as_constant() is NotImplemented:
            return equal
        return ConstantVariable(not equal.truth(tx))
    return ConstantVariable(NotImplemented)


class InstanceDictVariable(Variable):
    """`obj.__dict__`: the object's instance attributes as a dict. A key read alone is guarded on
    its own; reading the whole (keys, items, iteration, `len`, `dict(...)`) guards the real dict's
    keys in order and reads a copy of the attributes as they stand, the trace's own writes included;
    writes (`d[k] = v`, `pop`, `update`, `del d[k]`, ...) are the object's attribute writes."""

    def __init__(self, obj: UserObjectVariable) -> None:
        super().__init__(obj._dict_source() if obj.source is not None else None)
        self.obj = obj

    def python_type(self) -> type:
        return dict

    def describe(self) -> str:
        return f"__dict__ of {self.obj.describe()}"

    def _read(self, tx: Any, key: Variable) -> Variable | None:
        name = key.as_constant()
        found = self.obj._instance_attr(tx, name) if isinstance(name, str) else None
        if found is None:
            self.obj._guard_not_in_instance(tx, name)
        return found

    def _names(self, tx: Any) -> list[str]:
        """The attribute names now, in the dict's order."""
        if self.obj.is_new:
            return list(self.obj.attrs)
        real = list(self.obj.value.__dict__)
        if self.source is not None:
            tx.output.guards.add(Guard("EQUALS", KeysSource(self.source), real))
        written = tx.output.side_effects.pending_attrs(self.obj)
        # (A name the trace deleted is gone; one it added comes after the real ones, as a new key would.)
        return [n for n in real if n not in written or written[n] is not None] + \
               [n for n, value in written.items() if n not in real and value is not None]

    def container_view(self, tx: Any) -> Variable:
        """A new dict of the attributes as they stand: what `dict(obj.__dict__)`, its views and
        its copies read (changing it changes nothing on the object)."""
        pairs = [(ConstantVariable(name), self.obj._instance_attr(tx, name)) for name in self._names(tx)]
        return DictVariable({hash_key(k): (k, v) for k, v in pairs})

    def iterate(self, tx: Any) -> list[Variable]:
        return [ConstantVariable(name) for name in self._names(tx)]

    def length(self, tx: Any) -> int:
        return len(self._names(tx))

    def truth(self, tx: Any) -> bool:
        return bool(self._names(tx))

    _READS = ("keys", "values", "items", "copy", "__iter__", "__len__")
    _WRITES = ("__setitem__", "__delitem__", "pop", "setdefault", "update", "clear", "popitem")

    def getattr(self, tx: Any, name: str) -> Variable:
        if name in ("get", "__getitem__", "__contains__", *self._READS, *self._WRITES):
            return BoundBuiltinMethod(self, name)
        raise unsupported("unsupported_attribute", f"{name} of {self.describe()}")

    def call_method(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if name == "get" and not kwargs and 1 <= len(args) <= 2:
            found = self._read(tx, args[0])
            return found if found is not None else (args[1] if len(args) == 2 else ConstantVariable(None))
        if name in ("__getitem__", "__delitem__", "pop") and not kwargs and 1 <= len(args) <= (2 if name == "pop" else 1):
            found = self._read(tx, args[0])
            if found is None:
                if len(args) == 2:  # pop's default
                    return args[1]
                raise UserRaise(ExceptionVariable(KeyError, (args[0],)))
            if name != "__getitem__":
                self.obj.setattr_plain(tx, args[0].as_constant(), None)
            return found if name != "__delitem__" else ConstantVariable(None)
        if name == "__contains__" and len(args) == 1:
            return ConstantVariable(self._read(tx, args[0]) is not None)
        if name == "__setitem__" and len(args) == 2:
            self._write(tx, args[0], args[1])
            return ConstantVariable(None)
        if name == "setdefault" and not kwargs and 1 <= len(args) <= 2:
            found = self._read(tx, args[0])
            if found is None:
                found = args[1] if len(args) == 2 else ConstantVariable(None)
                self._write(tx, args[0], found)
            return found
        if name == "update":
            pairs = DictVariable()
            pairs._update(tx, *args, **kwargs)  # (what update accepts, and its TypeErrors)
            for key, value in pairs.entries.values():
                self._write(tx, key, value)
            return ConstantVariable(None)
        if name in ("clear", "popitem") and not args and not kwargs:
            names = self._names(tx)
            if name == "popitem" and not names:
                raise raise_real(KeyError("popitem(): dictionary is empty"))
            for key in names if name == "clear" else names[-1:]:
                value = self.obj._instance_attr(tx, key)
                self.obj.setattr_plain(tx, key, None)
            return ConstantVariable(None) if name == "clear" else TupleVariable([ConstantVariable(names[-1]), value])
        if name in self._READS:
            return self.container_view(tx).call_method(tx, name, args, kwargs)
        raise unsupported("unsupported_call", f"{name} of {self.describe()} while capturing")

    def _write(self, tx: Any, key: Variable, value: Variable) -> None:
        if not (key.is_constant() and isinstance(key.as_constant(), str)):
            raise unsupported("unsupported_setattr", f"a key that is not a string in {self.describe()}")
        # `obj.__dict__[k] = v`: the instance attribute, past the class's __setattr__ and past a
        # data descriptor of that name (a property backed by the dict): replayed into the dict.
        # A slot or a C descriptor keeps a value apart from the dict's, which kiln does not model.
        name = key.as_constant()
        raw, _ = class_lookup(self.obj.cls, name)
        if raw is not _MISSING and hasattr(type(raw), "__set__"):
            if isinstance(raw, (types.MemberDescriptorType, types.GetSetDescriptorType)):
                raise unsupported("unsupported_setattr", f"writing {name!r} into {self.describe()} beside its slot or C attribute")
            self.obj.dict_writes = {*self.obj.dict_writes, name}
        self.obj.setattr_plain(tx, name, value)

    def contains(self, tx: Any, item: Variable) -> bool:
        return self._read(tx, item) is not None


def _module_variable_type() -> type:
    from kiln.capture.variables.modules import ModuleVariable  # modules.py imports this module (ModuleVariable is a UserObjectVariable)

    return ModuleVariable


class ModelOutputVariable(Variable):
    """A HuggingFace `ModelOutput` (an ordered dict that is also a dataclass) made in the trace."""

    def __init__(self, cls: type, fields: dict[str, Variable]) -> None:
        super().__init__(None)
        self.cls, self.fields = cls, fields

    @staticmethod
    def construct(tx: Any, cls: type, args: Sequence[Variable], kwargs: dict[str, Variable]) -> "ModelOutputVariable":
        names = [f.name for f in dataclasses.fields(cls)]
        values: dict[str, Variable] = {}
        for name, arg in zip(names, args):
            values[name] = arg
        values.update(kwargs)
        fields = {}
        for f in dataclasses.fields(cls):
            if f.name in values:
                fields[f.name] = values[f.name]
            elif f.default is not dataclasses.MISSING:
                fields[f.name] = _constant(f.default)
            else:
                fields[f.name] = ConstantVariable(None)
        return ModelOutputVariable(cls, fields)

    def python_type(self) -> type:
        return self.cls

    def describe(self) -> str:
        return f"{self.cls.__name__}"

    def _present(self) -> list[tuple[str, Variable]]:
        return [(k, v) for k, v in self.fields.items() if not (v.is_constant() and v.as_constant() is None)]

    def getattr(self, tx: Any, name: str) -> Variable:
        if name in self.fields:
            return self.fields[name]
        if name in ("to_tuple", "keys", "values", "items", "get", "__getitem__", "__setitem__", "__contains__", "__len__"):
            return BoundBuiltinMethod(self, name)
        raw, owner = class_lookup(self.cls, name)
        if raw is not _MISSING:
            return wrap_class_attr(tx, raw, owner, name, self)
        raise raise_real(AttributeError(f"'{self.cls.__name__}' object has no attribute '{name}'"))

    def setattr(self, tx: Any, name: str, value: Variable) -> None:
        self.fields[name] = value

    def call_method(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        present = self._present()
        if name == "to_tuple":
            return TupleVariable([v for _, v in present])
        if name == "keys":
            return ListViewVariable([ConstantVariable(k) for k, _ in present], "dict_keys")
        if name == "values":
            return ListViewVariable([v for _, v in present], "dict_values")
        if name == "items":
            return ListViewVariable([TupleVariable([ConstantVariable(k), v]) for k, v in present], "dict_items")
        if name == "__len__":
            return ConstantVariable(len(present))
        if name == "__contains__":
            return ConstantVariable(args[0].as_constant() in dict(present))
        if name == "get":
            return dict(present).get(args[0].as_constant(), args[1] if len(args) > 1 else ConstantVariable(None))
        if name == "__getitem__":
            key = args[0].as_constant()
            if isinstance(key, str):
                found = dict(present).get(key)
                if found is None:
                    raise UserRaise(ExceptionVariable(KeyError, (args[0],)))
                return found
            return TupleVariable([v for _, v in present]).getitem(tx, args[0])
        if name == "__setitem__":
            self.fields[args[0].as_constant()] = args[1]
            return ConstantVariable(None)
        return self.getattr(tx, name).call(tx, args, kwargs)

    def iterate(self, tx: Any) -> list[Variable]:
        return [ConstantVariable(k) for k, _ in self._present()]

    def length(self, tx: Any) -> int:
        return len(self._present())

    def truth(self, tx: Any) -> bool:
        return bool(self._present())
