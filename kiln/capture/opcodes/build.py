"""Building containers, strings and slices; unpacking."""

from __future__ import annotations

import operator

from kiln.capture.break_records import unsupported
from kiln.capture.opcodes.registry import SINCE_312, UNTIL_312, opcode
from kiln.capture.python_operators import apply_unary, format_value
from kiln.capture.user_exceptions import raise_real
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.containers import DictVariable, ListVariable, SetVariable, TupleVariable
from kiln.capture.variables.symbolic import make_slice


@opcode("BUILD_TUPLE")
def BUILD_TUPLE(tx, inst) -> None:
    tx.push(TupleVariable(tx.popn(inst.arg)))


@opcode("BUILD_LIST")
def BUILD_LIST(tx, inst) -> None:
    tx.push(ListVariable(tx.popn(inst.arg)))


@opcode("BUILD_SET")
def BUILD_SET(tx, inst) -> None:
    tx.push(SetVariable(tx.popn(inst.arg)))


@opcode("BUILD_MAP")
def BUILD_MAP(tx, inst) -> None:
    items = tx.popn(2 * inst.arg)
    tx.push(DictVariable.from_pairs(list(zip(items[::2], items[1::2]))))


@opcode("BUILD_CONST_KEY_MAP")
def BUILD_CONST_KEY_MAP(tx, inst) -> None:
    keys = tx.pop().as_constant()
    values = tx.popn(inst.arg)
    tx.push(DictVariable.from_pairs([(ConstantVariable(k), v) for k, v in zip(keys, values)]))


@opcode("BUILD_SLICE")
def BUILD_SLICE(tx, inst) -> None:
    value = make_slice([tx.output.known.as_index(p) for p in tx.popn(inst.arg)])
    if value is None:
        raise unsupported("unsupported_index", "a slice with bounds that are not constants")
    tx.push(value)


@opcode("BUILD_STRING")
def BUILD_STRING(tx, inst) -> None:
    tx.push(ConstantVariable("".join(p.as_constant() for p in tx.popn(inst.arg))))


_CONVERSIONS = {0: None, 1: str, 2: repr, 3: ascii}


@opcode("FORMAT_VALUE", versions=UNTIL_312)
def FORMAT_VALUE(tx, inst) -> None:
    flags = inst.arg
    spec = tx.pop().as_constant() if flags & 0x04 else ""
    value = tx.pop()
    tx.push(format_value(tx, value, _CONVERSIONS[flags & 0x03], spec))


@opcode("CONVERT_VALUE", versions=((3, 13),))
def CONVERT_VALUE(tx, inst) -> None:
    # 3.13 splits FORMAT_VALUE: str()/repr()/ascii() first, then FORMAT_SIMPLE or FORMAT_WITH_SPEC
    # formats the string it made.
    tx.push(format_value(tx, tx.pop(), _CONVERSIONS[inst.arg], ""))


@opcode("FORMAT_SIMPLE", versions=((3, 13),))
def FORMAT_SIMPLE(tx, inst) -> None:
    tx.push(format_value(tx, tx.pop(), None, ""))


@opcode("FORMAT_WITH_SPEC", versions=((3, 13),))
def FORMAT_WITH_SPEC(tx, inst) -> None:
    spec = tx.pop().as_constant()
    tx.push(format_value(tx, tx.pop(), None, spec))


@opcode("LIST_APPEND")
def LIST_APPEND(tx, inst) -> None:
    item = tx.pop()
    tx.stack[-inst.arg].items.append(item)


@opcode("SET_ADD")
def SET_ADD(tx, inst) -> None:
    item = tx.pop()
    tx.stack[-inst.arg].call_method(tx, "add", [item], {})


@opcode("MAP_ADD")
def MAP_ADD(tx, inst) -> None:
    value, key = tx.pop(), tx.pop()
    tx.stack[-inst.arg].setitem(tx, key, value)


@opcode("LIST_EXTEND")
def LIST_EXTEND(tx, inst) -> None:
    seq = tx.pop()
    tx.stack[-inst.arg].items.extend(seq.iterate(tx))


@opcode("SET_UPDATE")
def SET_UPDATE(tx, inst) -> None:
    seq = tx.pop()
    tx.stack[-inst.arg].call_method(tx, "update", [seq], {})


@opcode("DICT_UPDATE")
def DICT_UPDATE(tx, inst) -> None:
    other = tx.pop()
    tx.stack[-inst.arg]._update(tx, other)


@opcode("DICT_MERGE")
def DICT_MERGE(tx, inst) -> None:
    other = tx.pop()
    target = tx.stack[-inst.arg]
    if not isinstance(other, DictVariable):
        keys = other.call_method(tx, "keys", [], {}).iterate(tx)
        other = DictVariable.from_pairs([(k, other.call_method(tx, "__getitem__", [k], {})) for k in keys])
    for key in other.entries:
        if key in target.entries:
            raise raise_real(TypeError(f"got multiple values for keyword argument {key[1]!r}"))
    target._update(tx, other)


@opcode("LIST_TO_TUPLE", versions=((3, 11),))
def LIST_TO_TUPLE(tx, inst) -> None:
    tx.push(TupleVariable(tx.pop().items))


@opcode("CALL_INTRINSIC_1", versions=SINCE_312)
def CALL_INTRINSIC_1(tx, inst) -> None:
    name = inst.argrepr
    if name == "INTRINSIC_LIST_TO_TUPLE":
        tx.push(TupleVariable(tx.pop().items))
    elif name == "INTRINSIC_UNARY_POSITIVE":
        tx.push(apply_unary(tx, operator.pos, tx.pop()))
    elif name == "INTRINSIC_STOPITERATION_ERROR":
        tx.push(tx.pop())
    else:
        raise unsupported("unsupported_opcode", f"CALL_INTRINSIC_1 {name}")


@opcode("UNPACK_SEQUENCE")
def UNPACK_SEQUENCE(tx, inst) -> None:
    items = tx.pop().iterate(tx)
    if len(items) != inst.arg:
        raise raise_real(ValueError(f"expected {inst.arg} values to unpack, got {len(items)}"))
    tx.stack.extend(reversed(items))


@opcode("UNPACK_EX")
def UNPACK_EX(tx, inst) -> None:
    before, after = inst.arg & 0xFF, inst.arg >> 8
    items = tx.pop().iterate(tx)
    if len(items) < before + after:
        raise raise_real(ValueError(f"not enough values to unpack (expected at least {before + after}, got {len(items)})"))
    middle = ListVariable(items[before: len(items) - after])
    tx.stack.extend(reversed([*items[:before], middle, *items[len(items) - after:]]))
