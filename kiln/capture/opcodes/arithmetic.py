"""Operator opcodes: arithmetic, comparisons, identity, membership and subscripts. The operators
themselves, on variables, are in kiln/capture/python_operators.py."""

from __future__ import annotations

import operator

from kiln.capture.break_records import unsupported
from kiln.capture.opcodes.registry import SINCE_312, opcode
from kiln.capture.python_operators import (BINARY_OPS, COMPARE_OPS, INPLACE_OPS, apply_binary, apply_unary, contains, identical,
                                           store_subscript, subscript)
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.symbolic import make_slice


@opcode("BINARY_OP")
def BINARY_OP(tx, inst) -> None:
    b, a = tx.pop(), tx.pop()
    symbol = inst.argrepr
    fn = INPLACE_OPS[symbol] if symbol in INPLACE_OPS else BINARY_OPS[symbol][0]
    tx.push(apply_binary(tx, fn, a, b))


@opcode("COMPARE_OP")
def COMPARE_OP(tx, inst) -> None:
    b, a = tx.pop(), tx.pop()
    symbol = inst.argval if isinstance(inst.argval, str) else inst.argrepr
    tx.push(apply_binary(tx, COMPARE_OPS[symbol.replace("bool(", "").rstrip(")")][0], a, b))


@opcode("IS_OP")
def IS_OP(tx, inst) -> None:
    b, a = tx.pop(), tx.pop()
    tx.push(ConstantVariable(identical(a, b) != bool(inst.arg)))


@opcode("CONTAINS_OP")
def CONTAINS_OP(tx, inst) -> None:
    container, item = tx.pop(), tx.pop()
    tx.push(ConstantVariable(contains(tx, container, item) != bool(inst.arg)))


@opcode("UNARY_NEGATIVE")
def UNARY_NEGATIVE(tx, inst) -> None:
    tx.push(apply_unary(tx, operator.neg, tx.pop()))


@opcode("UNARY_POSITIVE", versions=((3, 11),))
def UNARY_POSITIVE(tx, inst) -> None:
    tx.push(apply_unary(tx, operator.pos, tx.pop()))


@opcode("UNARY_INVERT")
def UNARY_INVERT(tx, inst) -> None:
    tx.push(apply_unary(tx, operator.invert, tx.pop()))


@opcode("UNARY_NOT")
def UNARY_NOT(tx, inst) -> None:
    tx.push(ConstantVariable(not tx.pop().truth(tx)))


@opcode("BINARY_SUBSCR")
def BINARY_SUBSCR(tx, inst) -> None:
    key, obj = tx.pop(), tx.pop()
    tx.push(subscript(tx, obj, key))


@opcode("STORE_SUBSCR")
def STORE_SUBSCR(tx, inst) -> None:
    key, obj, value = tx.pop(), tx.pop(), tx.pop()
    store_subscript(tx, obj, key, value)


@opcode("DELETE_SUBSCR")
def DELETE_SUBSCR(tx, inst) -> None:
    key, obj = tx.pop(), tx.pop()
    obj.call_method(tx, "__delitem__", [key], {})


def _slice(tx, start, stop):
    value = make_slice([tx.output.known.as_index(start), tx.output.known.as_index(stop)])
    if value is None:
        raise unsupported("unsupported_index", "a slice with bounds that are not constants")
    return value


@opcode("BINARY_SLICE", versions=SINCE_312)
def BINARY_SLICE(tx, inst) -> None:
    stop, start, obj = tx.pop(), tx.pop(), tx.pop()
    tx.push(subscript(tx, obj, _slice(tx, start, stop)))


@opcode("STORE_SLICE", versions=SINCE_312)
def STORE_SLICE(tx, inst) -> None:
    stop, start, obj, value = tx.pop(), tx.pop(), tx.pop(), tx.pop()
    store_subscript(tx, obj, _slice(tx, start, stop), value)
