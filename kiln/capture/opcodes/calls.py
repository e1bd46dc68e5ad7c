"""Calls and function creation."""

from __future__ import annotations

from kiln.capture.break_records import unsupported
from kiln.capture.bytecode import NULL_ABOVE_CALLABLE
from kiln.capture.opcodes.registry import UNTIL_312, opcode
from kiln.capture.variables.base import NULL, NullVariable
from kiln.capture.variables.containers import DictVariable, TupleVariable
from kiln.capture.variables.functions import NestedFunctionVariable


def push_call_target(tx, fn) -> None:
    """`fn` with the NULL slot a following CALL expects beside it (LOAD_GLOBAL, LOAD_ATTR with
    their low bit set)."""
    tx.stack.extend((fn, NULL) if NULL_ABOVE_CALLABLE else (NULL, fn))


def pop_call_target(tx) -> tuple:
    """The callable under a call's arguments and the arguments its other slot adds (a `self`
    where CPython split a method from its object; none where the slot holds NULL)."""
    first, second = tx.popn(2)
    fn, other = (first, second) if NULL_ABOVE_CALLABLE else (second, first)
    if isinstance(other, NullVariable):
        return fn, []
    # 3.11/3.12's (method, self) order puts the method first: it is the callable.
    return (fn, [other]) if NULL_ABOVE_CALLABLE else (first, [second])


def _call(tx, count: int, names: tuple) -> None:
    args = tx.popn(count)
    fn, bound = pop_call_target(tx)
    args = [*bound, *args]
    kwargs = {}
    if names:
        kwargs = dict(zip(names, args[-len(names):]))
        args = args[: -len(names)]
    tx.push(tx.call(fn, args, kwargs))


@opcode("KW_NAMES", versions=UNTIL_312)
def KW_NAMES(tx, inst) -> None:
    tx.kw_names = tuple(tx.code.co_consts[inst.arg])


@opcode("CALL")
def CALL(tx, inst) -> None:
    names, tx.kw_names = tx.kw_names, ()
    _call(tx, inst.arg, names)


@opcode("CALL_KW", versions=((3, 13),))
def CALL_KW(tx, inst) -> None:
    _call(tx, inst.arg, tuple(tx.pop().as_constant()))


@opcode("CALL_FUNCTION_EX")
def CALL_FUNCTION_EX(tx, inst) -> None:
    kwargs_var = tx.pop() if inst.arg & 1 else None
    args_var = tx.pop()
    if NULL_ABOVE_CALLABLE:
        tx.pop()  # the NULL
        fn = tx.pop()
    else:
        fn = tx.pop()
        if tx.stack and isinstance(tx.stack[-1], NullVariable):
            tx.pop()
    args = args_var.iterate(tx) if not isinstance(args_var, TupleVariable) else list(args_var.items)
    kwargs = {}
    if kwargs_var is not None:
        if not isinstance(kwargs_var, DictVariable):
            raise unsupported("unsupported_call", f"** of {kwargs_var.describe()}")
        for key, value in kwargs_var.entries.values():
            kwargs[key.as_constant()] = value
    tx.push(tx.call(fn, args, kwargs))


def _new_function(tx, code_var, defaults=(), kwdefaults=None, closure=(), annotations=None):
    code = code_var.as_constant()
    return NestedFunctionVariable(code, tx.f_globals, code.co_qualname, list(defaults), kwdefaults or {}, list(closure),
                                  _annotations(annotations))


@opcode("MAKE_FUNCTION", versions=UNTIL_312)
def MAKE_FUNCTION(tx, inst) -> None:
    code_var = tx.pop()
    flags = inst.arg
    closure = tx.pop().items if flags & 0x08 else []
    annotations = tx.pop() if flags & 0x04 else None
    kwdefaults = {k.as_constant(): v for k, v in tx.pop().entries.values()} if flags & 0x02 else {}
    defaults = tx.pop().items if flags & 0x01 else []
    tx.push(_new_function(tx, code_var, defaults, kwdefaults, closure, annotations))


@opcode("MAKE_FUNCTION", versions=((3, 13),))
def MAKE_FUNCTION_313(tx, inst) -> None:
    # 3.13: the code object alone; SET_FUNCTION_ATTRIBUTE adds defaults, closure, annotations.
    tx.push(_new_function(tx, tx.pop()))


@opcode("SET_FUNCTION_ATTRIBUTE", versions=((3, 13),))
def SET_FUNCTION_ATTRIBUTE(tx, inst) -> None:
    fn, value = tx.pop(), tx.pop()
    if inst.arg == 0x01:
        fn._defaults = list(value.items)
    elif inst.arg == 0x02:
        fn._kwdefaults = {k.as_constant(): v for k, v in value.entries.values()}
    elif inst.arg == 0x04:
        fn.annotations = _annotations(value)
    elif inst.arg == 0x08:
        fn._closure = list(value.items)
    else:
        raise unsupported("unsupported_opcode", f"SET_FUNCTION_ATTRIBUTE {inst.arg:#x}")
    tx.push(fn)


def _annotations(value):
    # 3.11-3.13 pass annotations as a flat tuple (name, value, name, value, ...).
    if value is None or isinstance(value, DictVariable):
        return value
    items = value.iterate(None) if not isinstance(value, TupleVariable) else value.items
    return DictVariable.from_pairs(list(zip(items[::2], items[1::2])))
