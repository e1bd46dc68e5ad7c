"""Calls and function creation."""

from __future__ import annotations

from kiln.capture.break_records import unsupported
from kiln.capture.opcodes.registry import opcode
from kiln.capture.variables.base import NullVariable
from kiln.capture.variables.containers import DictVariable, TupleVariable
from kiln.capture.variables.functions import NestedFunctionVariable


@opcode("KW_NAMES")
def KW_NAMES(tx, inst) -> None:
    tx.kw_names = tuple(tx.code.co_consts[inst.arg])


@opcode("CALL")
def CALL(tx, inst) -> None:
    args = tx.popn(inst.arg)
    first, second = tx.popn(2)
    if isinstance(first, NullVariable):
        fn = second
    else:
        fn, args = first, [second, *args]
    names, tx.kw_names = tx.kw_names, ()
    kwargs = {}
    if names:
        kwargs = dict(zip(names, args[-len(names):]))
        args = args[: -len(names)]
    tx.push(tx.call(fn, args, kwargs))


@opcode("CALL_FUNCTION_EX")
def CALL_FUNCTION_EX(tx, inst) -> None:
    kwargs_var = tx.pop() if inst.arg & 1 else None
    args_var = tx.pop()
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


@opcode("MAKE_FUNCTION")
def MAKE_FUNCTION(tx, inst) -> None:
    code_var = tx.pop()
    code = code_var.as_constant()
    flags = inst.arg
    closure = tx.pop().items if flags & 0x08 else []
    annotations = tx.pop() if flags & 0x04 else None
    kwdefaults = {k.as_constant(): v for k, v in tx.pop().entries.values()} if flags & 0x02 else {}
    defaults = tx.pop().items if flags & 0x01 else []
    tx.push(NestedFunctionVariable(code, tx.f_globals, code.co_qualname, list(defaults), kwdefaults, list(closure),
                                     _annotations(annotations)))




def _annotations(value):
    # 3.11-3.12 pass annotations as a flat tuple (name, value, name, value, ...).
    if value is None or isinstance(value, DictVariable):
        return value
    items = value.iterate(None) if not isinstance(value, TupleVariable) else value.items
    return DictVariable.from_pairs(list(zip(items[::2], items[1::2])))
