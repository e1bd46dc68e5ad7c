"""Python's builtins (len, isinstance, getattr, zip, ...) and `operator`/`math` functions.

Each modelled builtin is one small handler in `HANDLERS`. A builtin without a handler that is
pure on constants (`math.sqrt`, `str.upper` called through the class, `ord`) is computed now when
its arguments are constants.
"""

from __future__ import annotations

import ast
import builtins
import cmath
import collections
import copy
import dataclasses
import functools
import inspect
import itertools
import math
import operator
import os
import sys
import types
import typing
import warnings
import weakref
from typing import Any, Callable, Sequence

import torch

from kiln.capture.break_records import unsupported
from kiln.capture.guards import Guard
from kiln.capture.python_operators import (_BY_FUNCTION, _INPLACE_TO_BINARY, BY_DUNDER, apply_binary, apply_unary, contains, identical,
                                           store_subscript, subscript, text_of)
from kiln.capture.user_exceptions import UserRaise, raise_real
from kiln.capture.variables.base import BoundBuiltinMethod, RealValueVariable, Variable
from kiln.capture.variables.constant import ConstantVariable, is_plain_data, plain_data
from kiln.capture.resume_code import stack_name
from kiln.capture.sources import ConstSource
from kiln.capture.variables.containers import (
    GENERATOR_ITEM_LIMIT, DictVariable, GeneratorIterator, IteratorVariable, ListVariable, MappingProxyVariable, SetVariable, TupleVariable,
    hash_key, stop_iteration,
)
from kiln.capture.variables.functions import BoundMethodVariable, FunctionVariableBase, PartialVariable
from kiln.capture.variables.objects import (ClassVariable, NewObjectVariable, ObjectSlotVariable, SuperVariable, UserObjectVariable,
                                            class_lookup)
from kiln.capture.variables import unbacked
from kiln.capture.variables.symbolic import SymNodeVariable
from kiln.capture.variables.tensor import TensorVariable
from kiln.capture.variables.weakrefs import make_weakref
from kiln.capture.variables.wrapping import wrap_constant_result

Handler = Callable[..., Variable]
HANDLERS: dict[Any, Handler] = {}

# Pure functions computed now when all arguments are constants.
_PURE_MODULES = (math, cmath, operator)
_PURE = {abs, chr, ord, divmod, pow, round, hex, oct, bin, hash, repr, format, ascii, os.fspath,
         collections.namedtuple}  # (a class made once while capturing: Dynamo's choice too)
# The dict classes kiln's DictVariable stands for.
_DICT_TYPES = (dict, collections.OrderedDict, collections.defaultdict)
# Calls kiln refuses rather than run at capture time.
_SIDE_EFFECTS = {print, input, open, exec, eval, compile, globals, breakpoint}
# Callable objects of the operator module, applied to variables by `_call_getter`.
_GETTER_TYPES = (operator.itemgetter, operator.attrgetter, operator.methodcaller)


def handles(*fns: Any) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        for fn in fns:
            HANDLERS[fn] = handler
        return handler

    return register


def has_handler(value: Any) -> bool:
    try:
        return value in HANDLERS
    except TypeError:  # (unhashable)
        return False


def is_builtin_callable(value: Any) -> bool:
    if isinstance(value, _GETTER_TYPES):
        return True
    try:
        if value in _SIDE_EFFECTS or value in HANDLERS or value in _PURE:
            return True
    except TypeError:
        return False
    if isinstance(value, types.BuiltinFunctionType) and getattr(value, "__module__", None) in ("math", "cmath", "_operator", "operator"):
        return True
    return False


def const(value: Any) -> ConstantVariable:
    return ConstantVariable(value)


class BuiltinVariable(RealValueVariable):
    def describe(self) -> str:
        return f"builtin {getattr(self.value, '__name__', self.value)}"

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        fn = self.value
        if fn in (eval, exec) and len(args) < 2 and "globals" not in kwargs:
            # (its namespace is the calling frame's: behind a break, a resume function's, whose
            # variables are not the user's — so the whole frame runs eagerly)
            raise unsupported("frame_dependent", f"{fn.__name__}() of the calling frame's own variables")
        if fn in _SIDE_EFFECTS:
            raise unsupported("unsupported_call", f"{fn.__name__}() inside a compiled function has effects kiln does not replay",
                              "the call runs outside the graph (a graph break); remove it from the compiled code to keep one graph")
        if isinstance(fn, _GETTER_TYPES):
            return _call_getter(tx, fn, args, kwargs)
        handler = HANDLERS.get(fn)
        if handler is not None:
            return handler(tx, *args, **kwargs)
        if fn in _BY_FUNCTION or fn in _INPLACE_TO_BINARY:
            return apply_binary(tx, fn, *args)
        return constant_fold(fn, args, kwargs)

    def getattr(self, tx: Any, name: str) -> Variable:
        if name in ("__name__", "__qualname__", "__module__"):
            return const(getattr(self.value, name))
        if name == "fromkeys" and self.value in _DICT_TYPES:  # a classmethod: see call_method
            return BoundBuiltinMethod(self, name)
        if name == "__new__" and self.value in (object, dict, collections.OrderedDict, set, frozenset, list, tuple):
            return NewObjectVariable(self.value)  # (`object.__new__(cls)`, `dict.__new__(cls)`)
        if self.value is object and name in _OBJECT_SLOTS:  # `object.__setattr__(self, ...)` (frozen dataclasses)
            return ObjectSlotVariable(name)
        if isinstance(self.value, type) and not name.startswith("__") and isinstance(inspect.getattr_static(self.value, name, None), _METHOD_DESCRIPTORS):
            return UnboundBuiltinMethod(self.value, name)
        if self.value in _OPERATOR_TYPES and name in _DUNDER_OPERATORS and hasattr(self.value, name):
            return UnboundBuiltinMethod(self.value, name)
        if isinstance(self.value, type):
            return ClassVariable(self.value).getattr(tx, name)
        return super().getattr(tx, name)

    def call_method(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if self.value in _DICT_TYPES and name == "fromkeys":
            # (OrderedDict's takes `value=` by name too; dict's arguments are positional only)
            named = {"value"} if self.value is collections.OrderedDict else set()
            if set(kwargs) - named or not 1 <= len(args) + len(kwargs) <= 2 or not args:
                raise raise_real(TypeError(f"fromkeys expected 1 to 2 arguments, got {len(args) + len(kwargs)}"))
            value = args[1] if len(args) > 1 else kwargs.get("value", const(None))
            return DictVariable.from_pairs([(k, value) for k in args[0].iterate(tx)], cls=self.value)
        if self.value is object and name in _OBJECT_SLOTS:
            return ObjectSlotVariable(name).call(tx, args, kwargs)
        if isinstance(self.value, type) and self.value in (str, int, float, tuple, list, dict, bytes):
            # str.join(sep, items) and the like: unbound methods of builtin types
            return args[0].call_method(tx, name, args[1:], kwargs)
        return super().call_method(tx, name, args, kwargs)


_METHOD_DESCRIPTORS = (types.MethodDescriptorType, types.WrapperDescriptorType)
# The operators' methods of builtin types, called unbound (`set.__and__(p, q)`, `dict.__ior__(d, e)`).
_DUNDER_OPERATORS = BY_DUNDER
_OPERATOR_TYPES = (set, frozenset, dict, list, tuple, str, int, float)
_MODELLED = (DictVariable, SetVariable, ListVariable, TupleVariable)
_OBJECT_SLOTS = ("__new__", "__init__", "__setattr__", "__delattr__", "__getattribute__")


class UnboundBuiltinMethod(Variable):
    """`str.upper`, `dict.get`, `list.append` read from the class: calling it calls the method on its first argument."""

    def __init__(self, cls: type, name: str) -> None:
        super().__init__(None)
        self.cls, self.name = cls, name

    def python_type(self) -> type:
        return type(inspect.getattr_static(self.cls, self.name))

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return getattr(self.cls, self.name)

    def describe(self) -> str:
        return f"method {self.cls.__name__}.{self.name}"

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if not args:
            raise raise_real(TypeError(f"unbound method {self.cls.__name__}.{self.name}() needs an argument"))
        if self.name in _DUNDER_OPERATORS and len(args) == 2 and not kwargs:
            # set.__and__(p, q); an in-place one returns its first argument, as Python's does.
            result = apply_binary(tx, _DUNDER_OPERATORS[self.name], args[0], args[1])
            return args[0] if self.name.startswith("__i") and isinstance(args[0], UserObjectVariable) else result
        if isinstance(args[0], _MODELLED) and issubclass(args[0].python_type(), self.cls):
            # dict.clear(an OrderedDict): the modelled container carries the base type's method.
            return args[0].call_method(tx, self.name, list(args[1:]), kwargs)
        if isinstance(args[0], UserObjectVariable) and issubclass(args[0].python_type(), self.cls):
            view = args[0].container_view(tx)
            if view is not None:  # set.add(an object of a set subclass): the base's method on its contents
                return args[0]._contents_call(tx, view, self.name, list(args[1:]), kwargs)
        if args[0].python_type() is not self.cls:
            # A subclass may override the method this call means to bypass: the class's own reading.
            return ClassVariable(self.cls).getattr(tx, self.name).call(tx, args, kwargs)
        return args[0].call_method(tx, self.name, list(args[1:]), kwargs)


def constant_fold(fn: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
    if not all(is_plain_data(a) for a in (*args, *kwargs.values())):
        name = getattr(fn, "__qualname__", None) or repr(fn)
        raise unsupported("unsupported_call", f"{name}() called with {', '.join(a.describe() for a in args)} while capturing")
    try:
        result = fn(*[plain_data(a) for a in args], **{k: plain_data(v) for k, v in kwargs.items()})
    except Exception as error:  # noqa: BLE001 - the user's call raises in eager too
        raise raise_real(error) from None
    return wrap_constant_result(result)


# --- sizes and types ---------------------------------------------------------------------------


@handles(len)
def _len(tx: Any, obj: Variable) -> Variable:
    return const(obj.length(tx))


def _class_of(v: Variable) -> type:
    return v.python_type()


@handles(isinstance)
def _isinstance(tx: Any, obj: Variable, classes: Variable) -> Variable:
    spec = _class_spec(tx, classes)
    cls = _class_of(obj)
    try:
        return const(issubclass(cls, spec) or _instance_check(obj, spec))
    except TypeError as error:
        raise raise_real(error) from None


def _instance_check(obj: Variable, spec: Any) -> bool:
    # Classes with their own __instancecheck__ (typing, ABCs) decide on the real object when known.
    real = getattr(obj, "value", None)
    if real is not None and not isinstance(real, (list, dict, set)):
        try:
            return isinstance(real, spec)
        except TypeError:
            return False
    return False


def _class_spec(tx: Any, classes: Variable) -> Any:
    if isinstance(classes, TupleVariable):
        return tuple(_class_spec(tx, c) for c in classes.items)
    return classes.as_constant()


@handles(issubclass)
def _issubclass(tx: Any, cls: Variable, classes: Variable) -> Variable:
    try:
        return const(issubclass(cls.as_constant(), _class_spec(tx, classes)))
    except TypeError as error:
        raise raise_real(error) from None


@handles(type)
def _type(tx: Any, obj: Variable, *rest: Variable) -> Variable:
    if rest:
        raise unsupported("unsupported_call", "type() with three arguments (making a class) while capturing")
    return wrap_constant_result(_class_of(obj))


@handles(callable)
def _callable(tx: Any, obj: Variable) -> Variable:
    if isinstance(obj, (FunctionVariableBase, BoundMethodVariable, PartialVariable, ClassVariable, BuiltinVariable)):
        return const(True)
    if isinstance(obj, UserObjectVariable):
        return const(class_lookup(obj.cls, "__call__")[0] is not class_lookup(object, "__nonexistent__")[0])
    if obj.is_constant():
        return const(callable(obj.as_constant()))
    # Instances are callable when their class (not its metaclass) defines __call__.
    return const(any("__call__" in vars(k) for k in obj.python_type().__mro__))


# Objects that are one object in every process: their id() is a constant.
_SINGLETONS = (None, True, False, Ellipsis, NotImplemented)


@handles(id)
def _id(tx: Any, obj: Variable) -> Variable:
    if obj.is_constant() and any(obj.as_constant() is s for s in _SINGLETONS):
        return const(id(obj.as_constant()))
    real = getattr(obj, "value", None)
    if real is None and isinstance(obj.source, ConstSource):  # (an object pinned by identity: a partial of a closure)
        real = obj.source.value
    if real is None and obj.source is not None:
        real = _real_object(tx, obj)
    if real is None or obj.source is None:
        raise unsupported("unsupported_call", f"id() of {obj.describe()} while capturing")
    if not isinstance(obj.source, ConstSource):  # (the answer is a constant of the graph: pinned to this object)
        tx.output.guards.add(Guard("ID_MATCH", obj.source, real))
    return const(id(real))


def _real_object(tx: Any, obj: Variable) -> Any:
    """The user's own object behind a variable read from the frame: a list, dict or set, an input
    tensor or a module's tensor attribute (None where there is none to name)."""
    for value, var in tx.output.wrapped_containers.values():
        if var is obj:
            return value
    if isinstance(obj, TensorVariable):
        return obj.user_tensor(tx)
    return None


# --- attributes ----------------------------------------------------------------------------------


@handles(getattr)
def _getattr(tx: Any, obj: Variable, name: Variable, *default: Variable) -> Variable:
    try:
        return obj.getattr(tx, name.as_constant())
    except UserRaise as error:
        if default and error.is_instance(AttributeError):
            return default[0]
        raise


@handles(hasattr)
def _hasattr(tx: Any, obj: Variable, name: Variable) -> Variable:
    return const(obj.hasattr(tx, name.as_constant()))


@handles(setattr)
def _setattr(tx: Any, obj: Variable, name: Variable, value: Variable) -> Variable:
    obj.setattr(tx, name.as_constant(), value)
    return const(None)


@handles(delattr)
def _delattr(tx: Any, obj: Variable, name: Variable) -> Variable:
    if isinstance(obj, UserObjectVariable):
        obj.setattr_plain(tx, name.as_constant(), None)
        return const(None)
    raise unsupported("unsupported_setattr", f"delattr on {obj.describe()}")


# --- iteration -----------------------------------------------------------------------------------


@handles(iter)
def _iter(tx: Any, obj: Variable) -> Variable:
    return obj.get_iter(tx)


@handles(next)
def _next(tx: Any, it: Variable, *default: Variable) -> Variable:
    if not isinstance(it, IteratorVariable):
        it = it.get_iter(tx) if not hasattr(it, "next") else it
    running = getattr(it, "frame", None) is not None
    item = it.next(tx)
    if item is None:
        if default:
            return default[0]
        raise stop_iteration(it, running)
    return item


@handles(enumerate)
def _enumerate(tx: Any, seq: Variable, start: Variable | None = None) -> Variable:
    first = start.as_constant() if start is not None else 0
    return IteratorVariable([TupleVariable([const(first + i), item]) for i, item in enumerate(seq.iterate(tx))])


@handles(zip)
def _zip(tx: Any, *seqs: Variable, strict: Variable | None = None) -> Variable:
    if strict is not None and strict.as_constant():
        lists = [s.iterate(tx) for s in seqs]
        if len({len(x) for x in lists}) > 1:
            raise raise_real(ValueError("zip() arguments have different lengths"))
        return IteratorVariable([TupleVariable(list(items)) for items in zip(*lists)])
    return LazyIteratorVariable(zip, None, seqs)


class LazyIteratorVariable(IteratorVariable):
    """`map(fn, *seqs)`, `zip(*seqs)`, `filter(fn, seq)`: each item made when it is asked for, from
    the next items of the underlying iterators, as in Python — a side effect of `fn` (a `nonlocal`,
    the list being extended) happens when the consumer reaches it, zip stops at its first exhausted
    argument before asking the others, and one alive at a graph break or returned is rebuilt as
    the same kind of object over what its iterators have left."""

    def __init__(self, kind: type, fn: Variable | None, seqs: Sequence[Variable]) -> None:
        super().__init__([])
        self.kind, self.fn, self.seqs = kind, fn, list(seqs)
        self.iterators: list[Variable] | None = None  # made on the first item asked: until then,
        # a generator argument is unstarted, and a returned zip of it is rebuilt over it as it is
        self.exhausted = not seqs

    def python_type(self) -> type:
        return self.kind

    def next(self, tx: Any) -> Variable | None:
        if self.iterators is None:
            self.iterators = _iterators(tx, self.seqs)
        while not self.exhausted:
            row = []
            for it in self.iterators:
                item = it.next(tx)
                if item is None:
                    self.exhausted = True
                    _finish_suspended_in_a_block(tx, self.iterators)
                    return None
                row.append(item)
            if self.kind is zip:
                return TupleVariable(row)
            if self.kind is map:
                return self.fn.call(tx, row, {})
            keep = row[0].truth(tx) if self.fn.is_constant() and self.fn.as_constant() is None else \
                self.fn.call(tx, row, {}).truth(tx)
            if keep:
                return row[0]
        return None

    def iterate(self, tx: Any) -> list[Variable]:
        items: list[Variable] = []
        while (item := self.next(tx)) is not None:
            items.append(item)
            if len(items) > GENERATOR_ITEM_LIMIT:
                raise unsupported("unsupported_iteration", f"{self.kind.__name__}() of iterators that yielded more than "
                                  f"{GENERATOR_ITEM_LIMIT} items", "pass a finite iterator first")
        return items


def _iterators(tx: Any, seqs: Sequence[Variable]) -> list[Variable]:
    """An iterator of each argument, read item by item (a user's iterator object: its items now)."""
    iterators = [s.get_iter(tx) for s in seqs]
    return [it if isinstance(it, IteratorVariable) else IteratorVariable(seq.iterate(tx)) for it, seq in zip(iterators, seqs)]


def _finish_suspended_in_a_block(tx: Any, iterators: list[Variable]) -> None:
    """A generator zip stopped asking that waits inside a try or with block is run to its end
    now (its cleanup with it), as kiln took every generator whole before zip went item by item:
    left suspended there, its frame could not be captured (capture/frame.py)."""
    from kiln.capture.resume_at_break import enclosing_blocks  # resume_at_break.py imports this module's users

    for it in iterators:
        where = it.suspended_at() if isinstance(it, GeneratorIterator) else None
        if where is not None and enclosing_blocks(*where):
            it.iterate(tx)


@handles(map)
def _map(tx: Any, fn: Variable, *seqs: Variable, **kwargs: Variable) -> Variable:
    if kwargs:  # (`strict=` is Python 3.14's; kiln's map does not check lengths)
        raise raise_real(TypeError("map() takes no keyword arguments")) if sys.version_info < (3, 14) else \
            unsupported("unsupported_call", "map(..., strict=True) while capturing")
    if not seqs:
        raise raise_real(TypeError("map() must have at least two arguments."))
    return LazyIteratorVariable(map, fn, seqs)


@handles(filter)
def _filter(tx: Any, fn: Variable, seq: Variable) -> Variable:
    return LazyIteratorVariable(filter, fn, [seq])


@handles(reversed)
def _reversed(tx: Any, seq: Variable) -> Variable:
    return IteratorVariable(list(reversed(seq.iterate(tx))))


@handles(sorted)
def _sorted(tx: Any, seq: Variable, key: Variable | None = None, reverse: Variable | None = None) -> Variable:
    items = seq.iterate(tx)
    flip = bool(reverse.as_constant()) if reverse is not None else False
    if key is not None and key.is_constant() and key.as_constant() is None:
        key = None
    if key is None:
        if not all(i.is_constant() for i in items):
            raise unsupported("unsupported_call", "sorted() of values that are not constants")
        return ListVariable(sorted(items, key=lambda v: v.as_constant(), reverse=flip))
    keyed = [(key.call(tx, [i], {}).as_constant(), n, i) for n, i in enumerate(items)]
    keyed.sort(key=lambda t: (t[0], t[1]), reverse=flip)
    return ListVariable([i for _, _, i in keyed])


@handles(range)
def _range(tx: Any, *args: Variable) -> Variable:
    return const(range(*[a.as_constant() for a in args]))


@handles(slice)
def _slice(tx: Any, *args: Variable) -> Variable:
    return const(slice(*[a.as_constant() for a in args]))


# --- reductions ------------------------------------------------------------------------------------


@handles(any)
def _any(tx: Any, seq: Variable) -> Variable:
    return const(any(item.truth(tx) for item in seq.iterate(tx)))


@handles(all)
def _all(tx: Any, seq: Variable) -> Variable:
    return const(all(item.truth(tx) for item in seq.iterate(tx)))


@handles(sum)
def _sum(tx: Any, seq: Variable, start: Variable | None = None) -> Variable:
    total = start if start is not None else const(0)
    for item in seq.iterate(tx):
        total = apply_binary(tx, operator.add, total, item)
    return total


def _extreme(pick: Callable, tx: Any, *args: Variable, key: Variable | None = None, default: Variable | None = None) -> Variable:
    items = args[0].iterate(tx) if len(args) == 1 else list(args)
    if not items:
        if default is not None:
            return default
        raise raise_real(ValueError(f"{pick.__name__}() arg is an empty sequence"))
    if any(isinstance(i, TensorVariable) for i in items):
        if key is None and _one_element_tensors_and_numbers(items):
            return _elementwise_extreme(tx, pick, items)
        raise unsupported("data_dependent_branch", f"{pick.__name__}() over tensors compares their values")
    keys = [key.call(tx, [i], {}).as_constant() if key is not None else i.as_constant() for i in items]
    best = pick(range(len(items)), key=lambda n: keys[n])
    return items[best]


def _one_element_tensors_and_numbers(items: list[Variable]) -> bool:
    """One-element tensors of one shape and dtype, and numbers known while capturing."""
    tensors = [i.example for i in items if isinstance(i, TensorVariable)]
    numbers = [i for i in items if not isinstance(i, TensorVariable)]
    return (all(isinstance(t.numel(), int) and t.numel() == 1 for t in tensors)
            and len({(tuple(t.shape), t.dtype) for t in tensors}) == 1
            and all(n.is_constant() and type(n.as_constant()) in (int, float) for n in numbers))


def _elementwise_extreme(tx: Any, pick: Callable, items: list[Variable]) -> Variable:
    """`max(a, b)` of one-element tensors (and numbers) as the graph computes it, as Dynamo does:
    torch.maximum/minimum, or a clamp by a number, so the choice stays on the tensors' values.
    Unlike Python's max the result is always a tensor (a number that wins comes back as one)."""
    both = torch.maximum if pick is max else torch.minimum
    bound = "min" if pick is max else "max"
    items = sorted(items, key=lambda i: not isinstance(i, TensorVariable))  # (a tensor first)
    result = items[0]
    for item in items[1:]:
        if isinstance(item, TensorVariable):
            result = tx.output.call("call_function", both, [result, item], {})
        else:
            result = tx.output.call("call_function", torch.clamp, [result], {bound: item})
    return result


HANDLERS[min] = functools.partial(_extreme, min)
HANDLERS[max] = functools.partial(_extreme, max)


@handles(abs)
def _abs(tx: Any, x: Variable) -> Variable:
    return apply_unary(tx, operator.abs, x)


# --- constructors ------------------------------------------------------------------------------------


@handles(tuple)
def _tuple(tx: Any, seq: Variable | None = None) -> Variable:
    return TupleVariable(seq.iterate(tx) if seq is not None else [])


@handles(list)
def _list(tx: Any, seq: Variable | None = None) -> Variable:
    return ListVariable(seq.iterate(tx) if seq is not None else [])


def _dict_like(cls: type) -> Handler:
    def build(tx: Any, *args: Variable, **kwargs: Variable) -> Variable:
        d = DictVariable(cls=cls)
        d._update(tx, *args, **kwargs)
        return d

    return build


HANDLERS[dict] = _dict_like(dict)
HANDLERS[collections.OrderedDict] = _dict_like(collections.OrderedDict)


@handles(types.MappingProxyType)
def _mapping_proxy(tx: Any, mapping: Variable) -> Variable:
    contents = mapping if isinstance(mapping, DictVariable) else getattr(mapping, "container_view", lambda tx: None)(tx)
    if not isinstance(contents, DictVariable):
        raise unsupported("unsupported_call", f"types.MappingProxyType of {mapping.describe()}")
    return MappingProxyVariable(contents)


@handles(locals)
def _locals(tx: Any) -> Variable:
    """`locals()`: a new dict of the function's bound variables, its cells' too (a snapshot, as
    Python gives in a function). Run for real after a break, it would read the resume function's
    own frame (its stack slots, not the user's names): a wrong result."""
    code = tx.code
    pairs = []
    for name in dict.fromkeys((*code.co_varnames, *code.co_cellvars, *code.co_freevars)):
        if name.startswith(stack_name(0)[:-1]):
            continue  # (a resume function's stack slot)
        if name in tx.cells:
            try:
                value = tx.load_cell(name)
            except UserRaise:
                continue  # (an unbound cell is not in locals())
        elif name in tx.locals:
            value = tx.locals[name]
        else:
            continue
        pairs.append((const(name), value))
    return DictVariable.from_pairs(pairs)


@handles(vars)
def _vars(tx: Any, *obj: Variable) -> Variable:
    if not obj:
        return _locals(tx)
    return obj[0].getattr(tx, "__dict__")


@handles(collections.defaultdict)
def _defaultdict(tx: Any, factory: Variable | None = None, *args: Variable, **kwargs: Variable) -> Variable:
    d = DictVariable(cls=collections.defaultdict, default_factory=factory if factory is not None and not (factory.is_constant() and factory.as_constant() is None) else None)
    if args or kwargs:
        d._update(tx, *args, **kwargs)
    return d


@handles(set)
def _set(tx: Any, seq: Variable | None = None) -> Variable:
    return SetVariable(seq.iterate(tx) if seq is not None else [])


@handles(frozenset)
def _frozenset(tx: Any, seq: Variable | None = None) -> Variable:
    return SetVariable(seq.iterate(tx) if seq is not None else [], frozen=True)


def _scalar(cls: type) -> Handler:
    def convert(tx: Any, *args: Variable, **kwargs: Variable) -> Variable:
        if args and isinstance(args[0], TensorVariable):
            known = tx.output.known.of(args[0])  # a small tensor made from constants (known_values.py)
            if known is not None and len(args) == 1 and not kwargs:
                try:
                    return wrap_constant_result(cls(known))
                except Exception as error:  # noqa: BLE001 - eager raises the same (int() of two elements)
                    raise raise_real(error) from None
            if tx.output.scalar_outputs and cls in (int, float, bool) and len(args) == 1 and not kwargs:
                return unbacked.read(tx, args[0], f"__{cls.__name__}__")
            raise unsupported("data_dependent", f"{cls.__name__}() of a tensor reads its data while capturing",
                              "the graph breaks here; keep the value a tensor to stay in one graph")
        if cls in (int, float, bool) and len(args) == 1 and not kwargs and unbacked.is_data_dependent(args[0]):
            return unbacked.as_python_type(tx, args[0], cls)  # (int(x.item()): in the graph)
        if cls is bool and len(args) == 1 and not kwargs:
            # The variable's truth: an object's __bool__/__len__ traced, with its guards (a real
            # object folded as a constant ran its __bool__ unguarded: a wrong result next call).
            return const(args[0].truth(tx))
        if cls is str and len(args) == 1 and not kwargs:
            return text_of(tx, args[0], str)
        return constant_fold(cls, args, kwargs)

    return convert


for _cls in (int, float, bool, str, complex, bytes):
    HANDLERS[_cls] = _scalar(_cls)


@handles(object)
def _object(tx: Any) -> Variable:
    return UserObjectVariable(None, None, object)


@handles(warnings.catch_warnings)
def _catch_warnings(tx: Any, **kwargs: Variable) -> Variable:
    if not all(v.is_constant() for v in kwargs.values()):
        raise unsupported("unsupported_call", "warnings.catch_warnings of values that are not constants")
    settings = {k: v.as_constant() for k, v in kwargs.items()}
    try:
        warnings.catch_warnings(**settings)  # (Python's own TypeError for a bad argument)
    except TypeError as error:
        raise raise_real(error) from None
    return CatchWarningsVariable(settings)


class CatchWarningsVariable(Variable):
    """`with warnings.catch_warnings(record=True) as log:` around traced code: nothing the graph does
    warns while capturing (`warnings.warn` is a graph break), so entering it changes nothing a
    graph sees; `record=True` gives the new, empty list Python gives. (As under Dynamo, a warning
    an op of the compiled graph raises when it runs is not caught by it.)"""

    def __init__(self, settings: dict[str, Any]) -> None:
        super().__init__(None)
        self.settings = settings

    def python_type(self) -> type:
        return warnings.catch_warnings

    def getattr(self, tx: Any, name: str) -> Variable:
        if name in ("__enter__", "__exit__"):
            return BoundBuiltinMethod(self, name)
        return super().getattr(tx, name)

    def call_method(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if name == "__enter__":
            return ListVariable([]) if self.settings.get("record") else const(None)
        if name == "__exit__":
            return const(None)
        return super().call_method(tx, name, args, kwargs)


@handles(torch._C._fx_map_aggregate)
def _fx_map_aggregate(tx: Any, value: Variable, fn: Variable) -> Variable:
    """torch.fx's map_aggregate (C code), as it walks: tuples (named ones rebuilt as their class),
    lists into fx's immutable_list, dicts into immutable_dict, slices; `fn` on anything else."""
    from torch.fx.immutable_collections import immutable_dict, immutable_list

    kind = value.python_type()
    if issubclass(kind, (tuple, list)):
        items = [_fx_map_aggregate(tx, item, fn) for item in value.iterate(tx)]
        if issubclass(kind, list):
            return ClassVariable(immutable_list).call(tx, [ListVariable(items)], {})
        return ClassVariable(kind).call(tx, items, {}) if hasattr(kind, "_fields") else TupleVariable(items)
    if isinstance(value, DictVariable):
        mapped = DictVariable.from_pairs([(k, _fx_map_aggregate(tx, v, fn)) for k, v in value.entries.values()])
        return ClassVariable(immutable_dict).call(tx, [mapped], {})
    if issubclass(kind, dict):
        raise unsupported("unsupported_call", f"torch.fx's map_aggregate over a {kind.__name__}")
    if value.is_constant() and isinstance(value.as_constant(), slice):
        part = value.as_constant()
        return wrap_constant_result(slice(*(fn.call(tx, [const(p)], {}).as_constant() for p in (part.start, part.stop, part.step))))
    return fn.call(tx, [value], {})


# --- functional tools ---------------------------------------------------------------------------------


@handles(functools.partial)
def _partial(tx: Any, fn: Variable, *args: Variable, **kwargs: Variable) -> Variable:
    return PartialVariable(fn, list(args), dict(kwargs))


@handles(functools.reduce)
def _reduce(tx: Any, fn: Variable, seq: Variable, *initial: Variable) -> Variable:
    items = seq.iterate(tx)
    acc = initial[0] if initial else items.pop(0)
    for item in items:
        acc = fn.call(tx, [acc, item], {})
    return acc


@handles(itertools.chain)
def _chain(tx: Any, *seqs: Variable) -> Variable:
    return IteratorVariable([item for s in seqs for item in s.iterate(tx)])


@handles(sys.getrecursionlimit)
def _getrecursionlimit(tx: Any) -> Variable:
    # The user's limit, read as a constant as Dynamo reads it (a program does not change it between
    # calls); not the one kiln raises while it captures.
    return const(tx.output.user_recursion_limit)


@handles(itertools.chain.from_iterable)
def _chain_from_iterable(tx: Any, seqs: Variable) -> Variable:
    return _chain(tx, *seqs.iterate(tx))


@handles(itertools.product)
def _product(tx: Any, *seqs: Variable, repeat: Variable | None = None) -> Variable:
    lists = [s.iterate(tx) for s in seqs] * (repeat.as_constant() if repeat is not None else 1)
    return IteratorVariable([TupleVariable(list(p)) for p in itertools.product(*lists)])


@handles(itertools.repeat)
def _repeat(tx: Any, item: Variable, times: Variable | None = None) -> Variable:
    if times is None:
        return EndlessIteratorVariable(itertools.repeat, item)
    return IteratorVariable([item] * max(0, times.as_constant()))


@handles(itertools.count)
def _count(tx: Any, start: Variable | None = None, step: Variable | None = None) -> Variable:
    first, by = (v.as_constant() if v is not None else d for v, d in ((start, 0), (step, 1)))
    if not all(isinstance(n, (int, float)) for n in (first, by)):
        raise unsupported("unsupported_call", "itertools.count of values that are not numbers known while capturing")
    return EndlessIteratorVariable(itertools.count, const(first), by)


class EndlessIteratorVariable(IteratorVariable):
    """`itertools.count(start, step)` and `itertools.repeat(x)`: an item each time one is asked
    for, without end (consumed whole, `list(count())`, it stops at kiln's item limit as a break);
    alive at a graph break or returned, rebuilt where it has got to. A count the caller made
    (`source`) is read from where it has got to, guarded, and advanced after the graph runs by as
    many items as the trace took (`taken`, side_effects.py)."""

    def __init__(self, kind: Any, item: Variable, step: Any = None, source: Any = None) -> None:
        super().__init__([], source)
        self.kind, self.item, self.step = kind, item, step
        self.cls = kind

    def next(self, tx: Any) -> Variable | None:
        item = self.item
        if self.kind is itertools.count and item.is_constant():
            self.item = const(item.as_constant() + self.step)
        elif self.kind is itertools.count:  # (the caller's count, its value a symbolic int: the sum in the graph)
            from kiln.capture.python_operators import apply_binary  # python_operators.py imports this module

            self.item = apply_binary(tx, operator.add, item, const(self.step))
        self.took(tx)
        return item

    def iterate(self, tx: Any) -> list[Variable]:
        raise unsupported("unsupported_iteration", f"consuming all of an endless {self.kind.__name__}()",
                          "take a finite part of it (zip, islice)")


def count_state(counter: itertools.count) -> tuple[Any, Any]:
    """(next value, step) of a real `itertools.count`, from its repr (`count(2)`, `count(2, 3)`):
    Python shows its state no other way that lasts (pickling itertools went in 3.14)."""
    numbers = ast.literal_eval(repr(counter)[len("count"):].replace(")", ",)"))
    return numbers[0], numbers[1] if len(numbers) > 1 else 1


def count_next(counter: itertools.count) -> Any:
    """The value `next(counter)` would give, without taking it."""
    return count_state(counter)[0]


def count_step(counter: itertools.count) -> Any:
    return count_state(counter)[1]


@handles(itertools.cycle)
def _cycle(tx: Any, seq: Variable) -> Variable:
    iterator = seq.get_iter(tx)
    if isinstance(iterator, EndlessIteratorVariable):
        return iterator  # (an endless iterator never comes back round: the cycle yields what it yields)
    if isinstance(iterator, GeneratorIterator) or not isinstance(iterator, IteratorVariable):
        raise unsupported("unsupported_call", f"itertools.cycle of {seq.describe()}: a generator would run ahead of "
                          "the loop consuming it", "the graph breaks at this call")
    return CycleIteratorVariable(iterator.iterate(tx))


class CycleIteratorVariable(IteratorVariable):
    """`itertools.cycle(items)`: the items over and over (none: it is empty); alive at a graph
    break or returned, rebuilt as a cycle starting where it has got to."""

    def __init__(self, items: list[Variable]) -> None:
        super().__init__(items)
        self.cls = itertools.cycle

    def next(self, tx: Any) -> Variable | None:
        if not self.items:
            return None
        item = self.items[self.position % len(self.items)]
        self.position += 1
        return item

    def iterate(self, tx: Any) -> list[Variable]:
        if not self.items:
            return []
        raise unsupported("unsupported_iteration", "consuming all of an endless itertools.cycle()",
                          "take a finite part of it (zip, islice)")

    def rest(self) -> list[Variable]:
        """The items in the order it yields them from here."""
        start = self.position % len(self.items) if self.items else 0
        return self.items[start:] + self.items[:start]


@handles(itertools.tee)
def _tee(tx: Any, seq: Variable, n: Variable | None = None) -> Variable:
    copies = n.as_constant() if n is not None else 2
    if not isinstance(copies, int) or copies < 0:
        raise raise_real(ValueError("n must be >= 0") if isinstance(copies, int) else TypeError("tee() argument 2 must be int"))
    iterator = seq.get_iter(tx)
    if isinstance(iterator, (GeneratorIterator, EndlessIteratorVariable)) or not isinstance(iterator, IteratorVariable):
        raise unsupported("unsupported_call", f"itertools.tee of {seq.describe()}: its items would be taken before "
                          "the copies ask for them", "the graph breaks at this call")
    items = iterator.iterate(tx)  # (the copies share what the iterator had left; it is consumed, as tee consumes it)
    return TupleVariable([IteratorVariable(list(items)) for _ in range(copies)])


def _by_positions(items: list[Variable], positions: Any, cls: type) -> Variable:
    """An iterator of tuples of `items` chosen by `positions` (tuples of indices), made by the
    real itertools over indices: what it yields is the arrangement, whatever the items are."""
    iterator = IteratorVariable([TupleVariable([items[i] for i in chosen]) for chosen in positions])
    iterator.cls = cls
    return iterator


def _arranging(kind: Any) -> Callable:
    def handler(tx: Any, seq: Variable, *args: Variable, **kwargs: Variable) -> Variable:
        items = seq.iterate(tx)
        try:
            positions = kind(range(len(items)), *[a.as_constant() for a in args], **{k: v.as_constant() for k, v in kwargs.items()})
        except TypeError as error:  # (Python's error for wrong arguments, in the user's code)
            raise raise_real(error) from None
        return _by_positions(items, positions, kind)

    return handler


def _integer_part(fn: Any) -> Handler:
    """`math.floor`/`ceil`/`trunc`: of a symbolic int, itself; of a symbolic float, in the graph."""

    def handler(tx: Any, *args: Variable, **kwargs: Variable) -> Variable:
        if len(args) == 1 and not kwargs and isinstance(args[0], SymNodeVariable):
            if args[0].python_type() is int:
                return args[0]
            return tx.output.call("call_function", fn, list(args), {})
        return constant_fold(fn, args, kwargs)

    return handler


for _fn in (math.floor, math.ceil, math.trunc):
    HANDLERS[_fn] = _integer_part(_fn)


for _kind in (itertools.combinations, itertools.permutations, itertools.combinations_with_replacement, itertools.pairwise):
    HANDLERS[_kind] = _arranging(_kind)


@handles(itertools.compress)
def _compress(tx: Any, data: Variable, selectors: Variable) -> Variable:
    iterator = IteratorVariable([item for item, keep in zip(data.iterate(tx), selectors.iterate(tx)) if keep.truth(tx)])
    iterator.cls = itertools.compress
    return iterator


@handles(itertools.filterfalse)
def _filterfalse(tx: Any, fn: Variable, seq: Variable) -> Variable:
    drop = (lambda v: v.truth(tx)) if fn.is_constant() and fn.as_constant() is None else (lambda v: fn.call(tx, [v], {}).truth(tx))
    iterator = IteratorVariable([item for item in seq.iterate(tx) if not drop(item)])
    iterator.cls = itertools.filterfalse
    return iterator


@handles(itertools.zip_longest)
def _zip_longest(tx: Any, *seqs: Variable, fillvalue: Variable | None = None) -> Variable:
    fill = fillvalue or const(None)
    return IteratorVariable([TupleVariable(list(p)) for p in itertools.zip_longest(*[s.iterate(tx) for s in seqs], fillvalue=fill)])


@handles(weakref.ref)
def _weakref(tx: Any, obj: Variable, callback: Variable | None = None) -> Variable:
    return make_weakref(tx, obj, callback)


@handles(itertools.accumulate)
def _accumulate(tx: Any, seq: Variable, func: Variable | None = None, *, initial: Variable | None = None) -> Variable:
    """Running totals (`func`, default `+`, traced on each pair), from `initial` where given."""
    combine = None if func is None or func.is_constant() and func.as_constant() is None else func
    total = None if initial is None or initial.is_constant() and initial.as_constant() is None else initial
    out = [] if total is None else [total]
    for item in seq.iterate(tx):
        if total is None:
            total = item
        else:
            total = apply_binary(tx, operator.add, total, item) if combine is None else combine.call(tx, [total, item], {})
        out.append(total)
    iterator = IteratorVariable(out)
    iterator.cls = itertools.accumulate
    return iterator


@handles(itertools.groupby)
def _groupby(tx: Any, seq: Variable, key: Variable | None = None) -> Variable:
    """Runs of items with equal keys, each a (key, iterator of its items); the keys must be known
    while capturing (numbers, strings: as Dynamo). Each run is taken whole at once, so a group
    iterator read after the outer one has moved past it still has its items (Python's is empty)."""
    by = None if key is None or key.is_constant() and key.as_constant() is None else key
    items = seq.iterate(tx)
    keys = []
    for item in items:
        k = item if by is None else by.call(tx, [item], {})
        if not k.is_constant():
            raise unsupported("unsupported_call", f"itertools.groupby with a key that is {k.describe()}",
                              "group by keys that are known while capturing (numbers, strings)")
        keys.append(k.as_constant())
    runs = itertools.groupby(range(len(items)), key=keys.__getitem__)
    iterator = IteratorVariable([TupleVariable([const(k), IteratorVariable([items[i] for i in run])]) for k, run in runs])
    iterator.cls = itertools.groupby
    return iterator


@handles(itertools.islice)
def _islice(tx: Any, seq: Variable, *bounds: Variable) -> Variable:
    return IteratorVariable(list(itertools.islice(seq.iterate(tx), *[b.as_constant() for b in bounds])))


@handles(operator.getitem)
def _getitem(tx: Any, obj: Variable, key: Variable) -> Variable:
    return subscript(tx, obj, key)


@handles(operator.not_)
def _not(tx: Any, x: Variable) -> Variable:
    return apply_unary(tx, operator.not_, x)


@handles(operator.truth)
def _truth(tx: Any, x: Variable) -> Variable:
    return const(x.truth(tx))


for _fn in (operator.neg, operator.pos, operator.invert):
    HANDLERS[_fn] = functools.partial(lambda fn, tx, x: apply_unary(tx, fn, x), _fn)


@handles(operator.is_)
def _is(tx: Any, a: Variable, b: Variable) -> Variable:
    return const(identical(a, b))


@handles(operator.is_not)
def _is_not(tx: Any, a: Variable, b: Variable) -> Variable:
    return const(not identical(a, b))


@handles(operator.contains)
def _contains(tx: Any, container: Variable, item: Variable) -> Variable:
    return const(contains(tx, container, item))


def _make_getter(cls: type, tx: Any, *parts: Variable, **kwargs: Variable) -> Variable:
    # Built from constants now; applied to variables when called (`_call_getter`).
    if cls is operator.methodcaller and parts and parts[0].is_constant() and isinstance(parts[0].as_constant(), str):
        if not all(p.is_constant() for p in (*parts, *kwargs.values())):
            return MethodCallerVariable(parts[0].as_constant(), list(parts[1:]), dict(kwargs))
    if not all(p.is_constant() for p in (*parts, *kwargs.values())):
        raise unsupported("unsupported_call", f"operator.{cls.__name__} of values that are not constants")
    try:
        getter = cls(*[p.as_constant() for p in parts], **{k: v.as_constant() for k, v in kwargs.items()})
    except Exception as error:  # noqa: BLE001
        raise raise_real(error) from None
    return BuiltinVariable(getter)


for _cls in _GETTER_TYPES:
    HANDLERS[_cls] = functools.partial(_make_getter, _cls)


class MethodCallerVariable(Variable):
    """`operator.methodcaller(name, *args)` whose arguments are variables (a tensor): calling it on
    an object calls the object's method with them."""

    def __init__(self, name: str, args: list[Variable], kwargs: dict[str, Variable]) -> None:
        super().__init__(None)
        self.name, self.args, self.kwargs = name, args, kwargs

    def python_type(self) -> type:
        return operator.methodcaller

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if len(args) != 1 or kwargs:
            raise raise_real(TypeError(f"methodcaller expected 1 argument, got {len(args)}"))
        return args[0].call_method(tx, self.name, list(self.args), dict(self.kwargs))


def _call_getter(tx: Any, getter: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
    """Apply an itemgetter/attrgetter/methodcaller (made of constants) to variables."""
    if len(args) != 1 or kwargs:
        raise raise_real(TypeError(f"{type(getter).__name__} expected 1 argument, got {len(args)}"))
    obj = args[0]
    maker, parts = getter.__reduce__()
    if isinstance(getter, operator.methodcaller):
        name, *call_args = parts if not isinstance(maker, functools.partial) else (*maker.args, *parts)
        call_kwargs = maker.keywords if isinstance(maker, functools.partial) else {}
        return obj.call_method(tx, name, [const(a) for a in call_args], {k: const(v) for k, v in call_kwargs.items()})
    if isinstance(getter, operator.itemgetter):
        results = [subscript(tx, obj, const(key)) for key in parts]
    else:
        results = [_dotted_getattr(tx, obj, name) for name in parts]
    return results[0] if len(results) == 1 else TupleVariable(results)


def _dotted_getattr(tx: Any, obj: Variable, dotted: str) -> Variable:
    for name in dotted.split("."):
        obj = obj.getattr(tx, name)
    return obj


@handles(operator.setitem)
def _setitem(tx: Any, obj: Variable, key: Variable, value: Variable) -> Variable:
    store_subscript(tx, obj, key, value)
    return const(None)


@handles(operator.delitem)
def _delitem(tx: Any, obj: Variable, key: Variable) -> Variable:
    obj.call_method(tx, "__delitem__", [key], {})
    return const(None)


@handles(operator.iconcat)
def _iconcat(tx: Any, a: Variable, b: Variable) -> Variable:
    return apply_binary(tx, operator.iadd, a, b)


@handles(copy.copy)
def _copy(tx: Any, x: Variable) -> Variable:
    if isinstance(x, ListVariable):
        return ListVariable(x.items)
    if isinstance(x, DictVariable):
        return DictVariable(x.entries, cls=x.cls)
    if x.is_constant() or isinstance(x, TupleVariable):
        return x
    raise unsupported("unsupported_call", f"copy.copy of {x.describe()}")


@handles(dataclasses.fields)
def _fields(tx: Any, x: Variable) -> Variable:
    return wrap_constant_result(dataclasses.fields(x.python_type() if not isinstance(x.as_constant() if x.is_constant() else None, type) else x.as_constant()))


@handles(dataclasses.is_dataclass)
def _is_dataclass(tx: Any, x: Variable) -> Variable:
    target = x.as_constant() if x.is_constant() and isinstance(x.as_constant(), type) else x.python_type()
    return const(dataclasses.is_dataclass(target))


@handles(typing.cast)
def _cast(tx: Any, typ: Variable, value: Variable) -> Variable:
    return value


for _fn in (inspect.isclass, inspect.isfunction, inspect.ismethod):
    HANDLERS[_fn] = functools.partial(lambda fn, tx, x: const(fn(x.as_constant()) if x.is_constant() else fn is inspect.ismethod and x.python_type() is types.MethodType), _fn)


@handles(builtins.divmod)
def _divmod(tx: Any, a: Variable, b: Variable) -> Variable:
    if isinstance(a, TensorVariable) or isinstance(b, TensorVariable):  # Tensor has no __divmod__
        raise raise_real(TypeError(f"unsupported operand type(s) for divmod(): '{a.python_type().__name__}' and '{b.python_type().__name__}'"))
    return TupleVariable([apply_binary(tx, operator.floordiv, a, b), apply_binary(tx, operator.mod, a, b)])


for _fn in (repr, ascii):
    HANDLERS[_fn] = functools.partial(lambda fn, tx, x: text_of(tx, x, fn), _fn)


@handles(hash)
def _hash(tx: Any, x: Variable) -> Variable:
    key = hash_key(x)
    if key[0] != "const":
        raise unsupported("unsupported_call", f"hash() of {x.describe()}")
    return const(hash(key[1]))


@handles(super)
def _super(tx: Any, *args: Variable) -> Variable:
    if not args:
        return tx.zero_arg_super()
    return SuperVariable(args[0].as_constant(), args[1])
