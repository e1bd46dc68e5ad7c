"""Python's operators on variables: binary, unary and comparison operators, identity,
membership, subscripting (`obj[key]`, `obj[key] = value`) and turning values into text.

Tensors make graph nodes; constants are computed now; sequences follow Python's rules; user
objects go through their dunder methods (inlined). The opcode handlers (opcodes/arithmetic.py)
and the builtins that stand for operators (`operator.add`, `operator.getitem`, `str`, ...) both call here.
"""

from __future__ import annotations

import collections
import numbers
import operator
import types
from typing import Any, Callable

from kiln.capture.break_records import unsupported
from kiln.capture.user_exceptions import ExceptionVariable, UserRaise, raise_real
from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable, is_plain_data, plain_data
from kiln.capture.variables.containers import (GENERATOR_ITEM_LIMIT, BaseSequenceVariable, DictVariable, ListVariable, ListViewVariable,
                                               MappingProxyVariable, NamedTupleVariable, SetVariable, TupleVariable,
                                               equal, hash_key)
from kiln.capture.variables.objects import (ClassVariable, InstanceDictVariable, ModelOutputVariable, UserObjectVariable, class_lookup,
                                            wrap_class_attr)
from kiln.capture.variables.symbolic import SymNodeVariable
from kiln.capture.variables.numpy_arrays import (NumpyArrayVariable, numpy_binary, numpy_store_subscript, numpy_subscript,
                                                 numpy_unary)
from kiln.capture.variables.tensor import IDENTITY_READ, TensorVariable
from kiln.capture.variables.wrapping import wrap_constant_result

# BINARY_OP's argrepr -> (operator function, dunder, reflected dunder)
BINARY_OPS: dict[str, tuple[Callable, str, str]] = {
    "+": (operator.add, "__add__", "__radd__"), "-": (operator.sub, "__sub__", "__rsub__"),
    "*": (operator.mul, "__mul__", "__rmul__"), "/": (operator.truediv, "__truediv__", "__rtruediv__"),
    "//": (operator.floordiv, "__floordiv__", "__rfloordiv__"), "%": (operator.mod, "__mod__", "__rmod__"),
    "**": (operator.pow, "__pow__", "__rpow__"), "@": (operator.matmul, "__matmul__", "__rmatmul__"),
    "&": (operator.and_, "__and__", "__rand__"), "|": (operator.or_, "__or__", "__ror__"),
    "^": (operator.xor, "__xor__", "__rxor__"), "<<": (operator.lshift, "__lshift__", "__rlshift__"),
    ">>": (operator.rshift, "__rshift__", "__rrshift__"),
}
INPLACE_OPS: dict[str, Callable] = {
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow, "@=": operator.imatmul,
    "&=": operator.iand, "|=": operator.ior, "^=": operator.ixor, "<<=": operator.ilshift, ">>=": operator.irshift,
}
COMPARE_OPS: dict[str, tuple[Callable, str, str]] = {
    "<": (operator.lt, "__lt__", "__gt__"), "<=": (operator.le, "__le__", "__ge__"),
    "==": (operator.eq, "__eq__", "__eq__"), "!=": (operator.ne, "__ne__", "__ne__"),
    ">": (operator.gt, "__gt__", "__lt__"), ">=": (operator.ge, "__ge__", "__le__"),
}
_BY_FUNCTION = {fn: (fn, d, r) for fn, d, r in [*BINARY_OPS.values(), *COMPARE_OPS.values()]}
# Each operator's dunder method -> the operator (`__or__` -> operator.or_, `__ior__` -> operator.ior).
BY_DUNDER = {d: fn for fn, d, _ in [*BINARY_OPS.values(), *COMPARE_OPS.values()]}
_INPLACE_TO_BINARY = {INPLACE_OPS[k + "="]: BINARY_OPS[k] for k in BINARY_OPS}
_INPLACE_DUNDERS = {INPLACE_OPS[k + "="]: "__i" + dunder[2:] for k, (_, dunder, _) in BINARY_OPS.items()}
BY_DUNDER.update({dunder: fn for fn, dunder in _INPLACE_DUNDERS.items()})


def _is_tensor(v: Variable) -> bool:
    return isinstance(v, TensorVariable)


def _is_symbolic(v: Variable) -> bool:
    return isinstance(v, SymNodeVariable)


def _is_number(v: Variable) -> bool:
    # (a NumPy scalar too: np.int64 is no int, and Python's operators take it as one)
    return _is_symbolic(v) or v.is_constant() and isinstance(v.as_constant(), numbers.Real)


def apply_binary(tx: Any, fn: Callable, a: Variable, b: Variable) -> Variable:
    """`fn(a, b)` for an operator function (operator.add, operator.lt, operator.iadd, ...)."""
    if isinstance(a, NumpyArrayVariable) or isinstance(b, NumpyArrayVariable):
        return numpy_binary(tx, fn, a, b)
    if _is_tensor(a) or _is_tensor(b) or (_is_symbolic(a) or _is_symbolic(b)) and _is_number(a) and _is_number(b):
        if fn in _INPLACE_TO_BINARY and not _is_tensor(a):
            fn = _INPLACE_TO_BINARY[fn][0]
        return tx.output.call("call_function", fn, [a, b], {})
    if a.is_constant() and b.is_constant() or _is_printf(fn, a, b):
        try:
            return _constant_result(fn(a.as_constant(), plain_data(b)))
        except Exception as error:  # noqa: BLE001 - e.g. ZeroDivisionError, raised in the user's code
            raise raise_real(error) from None
    inplace = fn in _INPLACE_TO_BINARY
    base_fn = _INPLACE_TO_BINARY[fn][0] if inplace else fn
    view_a, view_b = _builtin_contents(tx, a, fn, base_fn), _builtin_contents(tx, b, fn, base_fn)
    if view_a is not None or view_b is not None:
        # A dict or set subclass whose operator is the base type's: the operator on its contents
        # (`s | t` of a set subclass is a plain set, as in Python; `s |= t` is `s` itself).
        result = apply_binary(tx, fn, view_a or a, view_b or b)
        return a if inplace and view_a is not None and result is view_a else result
    tuple_dunder = _tuple_subclass_dunder(tx, fn, a, b)
    if tuple_dunder is not None:
        return tuple_dunder
    if (isinstance(a, ListViewVariable) or isinstance(b, ListViewVariable)) and is_plain_data(a) and is_plain_data(b):
        # A dict view against a set or view (`d.keys() <= s`, `d.items() & t`): set-like, on
        # real views of the constant items.
        real = [v.as_constant() if isinstance(v, ListViewVariable) else plain_data(v) for v in (a, b)]
        try:
            return _constant_result(fn(*real))
        except Exception as error:  # noqa: BLE001 - what Python raises for these operands
            raise raise_real(error) from None
    if fn in (operator.eq, operator.ne) and not isinstance(a, UserObjectVariable) and not isinstance(b, UserObjectVariable):
        same = equal(tx, a, b)
        return ConstantVariable(same if fn is operator.eq else not same)
    if isinstance(a, BaseSequenceVariable):
        if base_fn is operator.add and isinstance(b, BaseSequenceVariable):
            if inplace and isinstance(a, ListVariable):
                a.call_method(tx, "extend", [b], {})
                return a
            if a.python_type() is not b.python_type() and not (isinstance(a, TupleVariable) and isinstance(b, TupleVariable)):
                raise raise_real(TypeError(f"can only concatenate {a.python_type().__name__} (not {b.python_type().__name__})"))
            return (ListVariable if isinstance(a, ListVariable) else TupleVariable)(a.items + b.items)
        if base_fn is operator.mul and b.is_constant():
            if inplace and isinstance(a, ListVariable):
                return _repeat_list_in_place(tx, a, b)
            return (ListVariable if isinstance(a, ListVariable) else TupleVariable)(a.items * b.as_constant())
        if base_fn in (operator.lt, operator.le, operator.gt, operator.ge) and isinstance(b, BaseSequenceVariable):
            return _constant_result(base_fn(a.as_constant(), b.as_constant()))
    collection = _collection_operator(tx, base_fn, a, b, inplace)
    if collection is not None:
        return collection
    if isinstance(b, BaseSequenceVariable) and base_fn is operator.mul and a.is_constant():
        return (ListVariable if isinstance(b, ListVariable) else TupleVariable)(b.items * a.as_constant())
    _, dunder, reflected = _BY_FUNCTION.get(base_fn, (None, None, None))
    if inplace and isinstance(a, UserObjectVariable):
        # `a -= b` calls `a.__isub__(b)` where a's class has one (MutableSet's, a user's), and
        # only otherwise `a = a - b`: an `__isub__` missing would turn `out -= other` inside a
        # `__sub__` into unbounded recursion.
        result = a._dunder(tx, _INPLACE_DUNDERS[fn], [b])
        if result is not None and not (result.is_constant() and result.as_constant() is NotImplemented):
            return result
    if dunder is not None:
        for obj, name, other in ((a, dunder, b), (b, reflected, a)):
            if isinstance(obj, UserObjectVariable):
                result = _user_dunder(tx, obj, name, other)
                if result is not None and not (result.is_constant() and result.as_constant() is NotImplemented):
                    return result
    if fn in (operator.eq, operator.ne):  # (both declined: identity, as object.__eq__)
        try:
            same = a is b or hash_key(a) == hash_key(b)
        except UserRaise:  # (hash_key's TypeError for an unhashable operand, a dict or list: only identity is left)
            same = identical(a, b)
        return ConstantVariable(same if fn is operator.eq else not same)
    if _declined_by_both(base_fn, a, b):
        raise raise_real(_operand_type_error(fn, a, b))
    raise unsupported("unsupported_operator", f"{getattr(fn, '__name__', fn)} of {a.describe()} and {b.describe()}")


def _builtin_contents(tx: Any, obj: Variable, fn: Callable, base_fn: Callable) -> Variable | None:
    """The modelled contents of a dict/set subclass object whose method for this operator is
    the builtin base's (None for anything else)."""
    if not isinstance(obj, UserObjectVariable):
        return None
    view = obj.container_view(tx)
    if view is None:
        return None
    names = [entry[1] for entry in (_BY_FUNCTION.get(fn), _BY_FUNCTION.get(base_fn)) if entry is not None and entry[1]]
    for name in names:
        raw, owner = class_lookup(obj.cls, name)
        if raw is not None and isinstance(owner, type) and owner in (dict, collections.OrderedDict, set, frozenset, list):
            return view
    return None


def _tuple_subclass_dunder(tx: Any, fn: Callable, a: Variable, b: Variable) -> Variable | None:
    """`a + b` where a (or, reflected, b) is a tuple subclass object whose class defines the
    operator in Python (a named tuple's `__add__`): that method, not tuple's concatenation."""
    _, dunder, reflected = _BY_FUNCTION.get(_INPLACE_TO_BINARY[fn][0] if fn in _INPLACE_TO_BINARY else fn, (None, None, None))
    if dunder is None:
        return None
    for obj, name, other in ((a, dunder, b), (b, reflected, a)):
        if isinstance(obj, NamedTupleVariable):
            raw, owner = class_lookup(obj.cls, name)
            if isinstance(raw, types.FunctionType):
                result = wrap_class_attr(tx, raw, owner, name, obj).call(tx, [other], {})
                if not (result.is_constant() and result.as_constant() is NotImplemented):
                    return result
    return None


def _user_dunder(tx: Any, obj: Variable, name: str, other: Variable) -> Variable | None:
    """`obj.name(other)`; a class without its own `__ne__` inverts its `__eq__`, as object's does."""
    result = obj._dunder(tx, name, [other])
    if result is None and name == "__ne__":
        equal = obj._dunder(tx, "__eq__", [other])
        if equal is not None and not (equal.is_constant() and equal.as_constant() is NotImplemented):
            return ConstantVariable(not equal.truth(tx))
    return result


def _is_printf(fn: Callable, a: Variable, b: Variable) -> bool:
    """`"%(name)s" % {...}` or `"%s" % [...]`: printf-style formatting reads the container's constants."""
    return fn in (operator.mod, operator.imod) and a.is_constant() and isinstance(a.as_constant(), (str, bytes)) and is_plain_data(b)


def _repeat_list_in_place(tx: Any, a: Variable, times: Variable) -> Variable:
    # `items *= n` changes the list every alias sees.
    a.items[:] = a.items * times.as_constant()
    a._changed(tx)
    return a


_SET_OPERATORS = {operator.or_, operator.and_, operator.sub, operator.xor}
_SET_COMPARISONS = {operator.lt, operator.le, operator.gt, operator.ge}


def _collection_operator(tx: Any, fn: Callable, a: Variable, b: Variable, inplace: bool) -> Variable | None:
    """Set algebra (`|`, `&`, `-`, `^`, subset comparisons) and dict `|`; None when it does not apply."""
    if isinstance(a, SetVariable) and isinstance(b, SetVariable):
        if fn in _SET_OPERATORS:
            return _set_algebra(tx, fn, a, b, inplace)
        if fn in _SET_COMPARISONS:
            return ConstantVariable(fn(set(a.entries), set(b.entries)))
    if isinstance(a, DictVariable) and fn is operator.or_:
        # `d | other` takes only a dict (else Python tries other's `__ror__`); `d |= other` takes
        # whatever `d.update` takes: a mapping or an iterable of pairs.
        if isinstance(b, DictVariable) or inplace:
            target = a if inplace else DictVariable(a.entries, cls=a.cls, default_factory=a.default_factory)
            target._update(tx, b)
            return target
        if not isinstance(b, UserObjectVariable):
            raise raise_real(_operand_type_error(fn, a, b))
    if isinstance(a, SetVariable) and fn in _SET_OPERATORS | _SET_COMPARISONS and b.is_constant() \
            and not isinstance(b.as_constant(), (set, frozenset)):
        raise raise_real(_operand_type_error(fn, a, b))  # (`s - 1`: int has no reflected set operator)
    return None


_SYMBOLS = {fn: symbol for table in (BINARY_OPS, COMPARE_OPS) for symbol, (fn, _, _) in table.items()}
_SYMBOLS.update({fn: symbol for symbol, fn in INPLACE_OPS.items()})
_ORDERINGS = {fn for fn, _, _ in COMPARE_OPS.values()} - {operator.eq, operator.ne}
# Builtin values whose operators return NotImplemented for any user object.
_PLAIN_SCALARS = (int, float, complex, bool, str, bytes, type(None))


def _declined_by_both(fn: Callable, a: Variable, b: Variable) -> bool:
    """A user object's operator declined (returned NotImplemented, or its class has none) and the
    other operand is a user object that declined too or a builtin scalar, which declines any user
    object: Python raises TypeError. (Not `"%s" % obj` or `"ab" * obj`: str takes any object there.)"""
    if not (isinstance(a, UserObjectVariable) or isinstance(b, UserObjectVariable)):
        return False
    for v in (a, b):
        if isinstance(v, UserObjectVariable):
            continue
        if not (v.is_constant() and type(v.as_constant()) in _PLAIN_SCALARS):
            return False
        if fn in (operator.mod, operator.mul) and isinstance(v.as_constant(), (str, bytes)):
            return False
    return True


def _operand_type_error(fn: Callable, a: Variable, b: Variable) -> TypeError:
    """The TypeError Python raises when neither operand's type implements `fn` for the other."""
    left, right, symbol = a.python_type().__name__, b.python_type().__name__, _SYMBOLS[fn]
    if fn in _ORDERINGS:
        return TypeError(f"'{symbol}' not supported between instances of '{left}' and '{right}'")
    return TypeError(f"unsupported operand type(s) for {symbol}: '{left}' and '{right}'")


def _set_algebra(tx: Any, fn: Callable, a: Variable, b: Variable, inplace: bool) -> Variable:
    if inplace and a.frozen:
        inplace = False  # frozenset |= makes a new frozenset, as in Python
    keys = fn(a.entries.keys(), b.entries.keys())
    items = {**b.entries, **a.entries}  # a's item wins for equal keys, as in Python
    ordered = [k for k in (*a.entries, *b.entries) if k in keys]
    result = {k: items[k] for k in dict.fromkeys(ordered)}
    if not inplace:
        return SetVariable(list(result.values()), frozen=a.frozen)
    a.entries = result
    a._changed(tx)
    return a


def _constant_result(value: Any) -> Variable:
    return wrap_constant_result(value)


def apply_unary(tx: Any, fn: Callable, a: Variable) -> Variable:
    if isinstance(a, NumpyArrayVariable) and fn is not operator.not_:
        return numpy_unary(tx, fn, a)
    if _is_tensor(a) or _is_symbolic(a) and fn is not operator.not_:
        return tx.output.call("call_function", fn, [a], {})
    if fn is operator.not_:
        return ConstantVariable(not a.truth(tx))
    if a.is_constant():
        try:
            return _constant_result(fn(a.as_constant()))
        except Exception as error:  # noqa: BLE001
            raise raise_real(error) from None
    dunder = {operator.neg: "__neg__", operator.pos: "__pos__", operator.invert: "__invert__"}.get(fn)
    if dunder and isinstance(a, UserObjectVariable):
        result = a._dunder(tx, dunder, [])
        if result is not None:
            return result
    raise unsupported("unsupported_operator", f"{fn.__name__} of {a.describe()}")


def identical(a: Variable, b: Variable) -> bool:
    """Python `a is b` where the answer is known while capturing."""
    if a is b:
        if _is_tensor(a):
            a.node.meta[IDENTITY_READ] = True
        return True
    if a.is_constant() and b.is_constant():
        x, y = a.as_constant(), b.as_constant()
        if x is None or y is None or isinstance(x, bool) or isinstance(y, bool):
            return x is y
        if type(x) is not type(y):
            return False
        return x is y or x == y and isinstance(x, (type, type(Ellipsis)))
    real_a, real_b = getattr(a, "value", None), getattr(b, "value", None)
    if real_a is not None and real_b is not None:
        return real_a is real_b
    if _is_tensor(a) and _is_tensor(b):  # (one tensor object is one fake tensor, whatever node reads it)
        a.node.meta[IDENTITY_READ] = b.node.meta[IDENTITY_READ] = True
        return a.example is b.example
    return False


def contains(tx: Any, container: Variable, item: Variable) -> bool:
    if _is_tensor(container):
        raise unsupported("data_dependent_branch", "`in` on a tensor")
    if hasattr(container, "contains"):
        return container.contains(tx, item)
    if isinstance(container, UserObjectVariable):
        membership = _user_membership(tx, container, item)
        if membership is not None:
            return membership
    if container.is_constant() and item.is_constant():
        try:
            return item.as_constant() in container.as_constant()
        except Exception as error:  # noqa: BLE001
            raise raise_real(error) from None
    if isinstance(container, (UserObjectVariable, ModelOutputVariable)):
        result = container.call_method(tx, "__contains__", [item], {})
        return result.truth(tx)
    stepper = container.get_iter(tx) if container.python_type() is types.GeneratorType else container
    if callable(getattr(stepper, "next", None)):
        # An iterator or a generator: consumed only up to the item found, as Python does (a
        # generator's body past that yield has not run).
        while (x := stepper.next(tx)) is not None:
            if equal(tx, item, x):
                return True
        return False
    return any(equal(tx, item, x) for x in container.iterate(tx))


def _user_membership(tx: Any, container: UserObjectVariable, item: Variable) -> bool | None:
    """`item in obj` by the methods of obj's class that Python would call (its `__contains__`,
    else its `__iter__`, else `__getitem__` at 0, 1, ...), inlined and their reads guarded; None
    where the class has no Python method of those (a builtin container's subclass: read through
    its guarded contents). Never the real object's answer computed once: `"relu" in registry`
    stayed what it was at capture, however the registry changed."""
    own_contains, contains_owner = class_lookup(container.cls, "__contains__")
    if isinstance(own_contains, types.FunctionType):
        return container.call_method(tx, "__contains__", [item], {}).truth(tx)
    own_iter, iter_owner = class_lookup(container.cls, "__iter__")
    if contains_owner is None and isinstance(own_iter, types.FunctionType):
        stepper = container.get_iter(tx)  # (stopped at the item found, as Python stops)
        while (x := stepper.next(tx)) is not None:
            if equal(tx, item, x):
                return True
        return False
    if contains_owner is None and iter_owner is None and isinstance(class_lookup(container.cls, "__getitem__")[0], types.FunctionType):
        # Python's old sequence protocol: obj[0], obj[1], ... until IndexError (or StopIteration).
        for index in range(GENERATOR_ITEM_LIMIT + 1):
            try:
                x = container.call_method(tx, "__getitem__", [ConstantVariable(index)], {})
            except UserRaise as error:
                if error.is_instance((IndexError, StopIteration)):
                    return False
                raise
            if equal(tx, item, x):
                return True
        raise unsupported("unsupported_iteration", f"`in` of {container.describe()} read more than "
                          f"{GENERATOR_ITEM_LIMIT} items through its `__getitem__`")
    return None


def subscript(tx: Any, obj: Variable, key: Variable) -> Variable:
    """`obj[key]`."""
    if isinstance(obj, TensorVariable):
        if isinstance(key, SymNodeVariable) and key.python_type() is int:
            # `x[n]` of a symbolic n (x.item()'s): a tensor's indexing takes no SymInt, select does.
            return tx.output.call("call_method", "select", [obj, ConstantVariable(0), key], {})
        return tx.output.call("call_function", operator.getitem, [obj, key], {})
    if isinstance(obj, NumpyArrayVariable):
        return numpy_subscript(tx, obj, key)
    if isinstance(obj, (BaseSequenceVariable, DictVariable, MappingProxyVariable)):
        return obj.getitem(tx, key)
    if isinstance(obj, (UserObjectVariable, ModelOutputVariable, InstanceDictVariable)):
        return obj.call_method(tx, "__getitem__", [key], {})
    if isinstance(key, TensorVariable):
        raise unsupported("unsupported_index", f"indexing {obj.describe()} with a tensor")
    if obj.is_constant() and key.is_constant():
        try:
            return wrap_constant_result(obj.as_constant()[key.as_constant()])
        except Exception as error:  # noqa: BLE001
            raise raise_real(error) from None
    if isinstance(obj, ClassVariable):
        if hasattr(obj.value, "__class_getitem__"):
            arguments = _type_arguments(key)
            if arguments is not _NOT_TYPE_ARGUMENTS:
                try:  # `list[int]`, `Callable[[T], Any]`: a generic alias, as annotations evaluated in a def make
                    return wrap_constant_result(obj.value[arguments])
                except Exception as error:  # noqa: BLE001
                    raise raise_real(error) from None
        raise unsupported("unsupported_index", f"subscripting {obj.describe()}")
    raise unsupported("unsupported_index", f"subscripting {obj.describe()} with {key.describe()}")


_NOT_TYPE_ARGUMENTS = object()


def _type_arguments(key: Variable) -> Any:
    """The real arguments of a class subscript (`Callable[[T], Any]`: a tuple holding a list) —
    constants, classes and lists or tuples of them; anything else is not a type's argument."""
    if isinstance(key, BaseSequenceVariable) and key.python_type() in (list, tuple):
        items = [_type_arguments(item) for item in key.items]
        return _NOT_TYPE_ARGUMENTS if any(i is _NOT_TYPE_ARGUMENTS for i in items) else key.python_type()(items)
    if key.is_constant() and not _is_tensor(key):
        return key.as_constant()
    return _NOT_TYPE_ARGUMENTS


def store_subscript(tx: Any, obj: Variable, key: Variable, value: Variable) -> None:
    if isinstance(obj, TensorVariable):
        obj.call_method(tx, "__setitem__", [key, value], {})
    elif isinstance(obj, NumpyArrayVariable):
        numpy_store_subscript(tx, obj, key, value)
    elif isinstance(obj, (ListVariable, DictVariable)):
        obj.setitem(tx, key, value)
    elif isinstance(obj, (UserObjectVariable, ModelOutputVariable, InstanceDictVariable, MappingProxyVariable)):
        obj.call_method(tx, "__setitem__", [key, value], {})
    else:
        raise unsupported("unsupported_index", f"assigning into {obj.describe()}")


# --- turning values into text -------------------------------------------------------------------

_TEXT_DUNDERS = {str: "__str__", repr: "__repr__", ascii: "__repr__"}


def text_of(tx: Any, value: Variable, kind: Callable) -> Variable:
    """`str(value)`, `repr(value)` or `ascii(value)` (kind is that builtin) while capturing."""
    if isinstance(value, ExceptionVariable):
        return ConstantVariable(kind(value.real()))
    if is_plain_data(value):
        return _constant_call(kind, plain_data(value))
    if isinstance(value, UserObjectVariable):
        result = value._dunder(tx, _TEXT_DUNDERS[kind], [])
        if result is None and kind is str:
            result = value._dunder(tx, "__repr__", [])
        if result is not None:
            return ConstantVariable(ascii(result.as_constant())[1:-1]) if kind is ascii else result
    if isinstance(value, BaseSequenceVariable) and value.python_type() in (tuple, list):
        # (a tuple or list of objects: each item's repr, as Python's own tuple/list repr writes it)
        texts = [text_of(tx, item, ascii if kind is ascii else repr).as_constant() for item in value.items]
        inner = ", ".join(texts) + ("," if len(texts) == 1 and value.python_type() is tuple else "")
        return ConstantVariable(f"({inner})" if value.python_type() is tuple else f"[{inner}]")
    raise unsupported("unsupported_format", f"turning {value.describe()} into a string while capturing",
                      "the graph breaks here; format outside the compiled code")


def format_value(tx: Any, value: Variable, conversion: Callable | None, spec: str) -> Variable:
    """What an f-string field `{value!conversion:spec}` becomes (FORMAT_VALUE)."""
    if conversion is not None:
        value = text_of(tx, value, conversion)
    if isinstance(value, UserObjectVariable):
        result = value._dunder(tx, "__format__", [ConstantVariable(spec)])
        if result is not None:
            return result
        if not spec:
            return text_of(tx, value, str)
    if isinstance(value, ExceptionVariable) or not spec and isinstance(value, BaseSequenceVariable) and not is_plain_data(value):
        value = text_of(tx, value, str)
    if not is_plain_data(value):
        raise unsupported("unsupported_format", f"formatting {value.describe()} into a string while capturing",
                          "the graph breaks here; format outside the compiled code")
    return _constant_call(format, plain_data(value), spec)


def _constant_call(fn: Callable, *args: Any) -> Variable:
    try:
        return ConstantVariable(fn(*args))
    except Exception as error:  # noqa: BLE001 - e.g. a bad format spec: raised in the user's code
        raise raise_real(error) from None
