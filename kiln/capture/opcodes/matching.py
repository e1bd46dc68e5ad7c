"""`match` statements: the opcodes CPython compiles mapping and sequence patterns to. Each asks
a question of the subject Python answers from its type (a sequence? a mapping?) or its contents
(its length, its values under some keys), which the trace knows for the containers it models.

    match point:
        case (x, 0): ...          # MATCH_SEQUENCE, GET_LEN, then UNPACK_SEQUENCE
        case {"a": v}: ...        # MATCH_MAPPING, GET_LEN, MATCH_KEYS
"""

from __future__ import annotations

import collections.abc

from kiln.capture.break_records import unsupported
from kiln.capture.opcodes.registry import opcode
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.containers import DictVariable, TupleVariable


@opcode("GET_LEN")
def GET_LEN(tx, inst) -> None:
    tx.push(ConstantVariable(tx.stack[-1].length(tx)))


@opcode("MATCH_MAPPING")
def MATCH_MAPPING(tx, inst) -> None:
    tx.push(ConstantVariable(issubclass(tx.stack[-1].python_type(), collections.abc.Mapping)))


@opcode("MATCH_SEQUENCE")
def MATCH_SEQUENCE(tx, inst) -> None:
    # (str, bytes and bytearray are sequences that a sequence pattern does not match)
    kind = tx.stack[-1].python_type()
    tx.push(ConstantVariable(issubclass(kind, collections.abc.Sequence) and not issubclass(kind, (str, bytes, bytearray))))


@opcode("MATCH_KEYS")
def MATCH_KEYS(tx, inst) -> None:
    """The subject's values under the pattern's keys, a tuple, or None where one is missing."""
    subject, keys = tx.stack[-2], tx.stack[-1]
    if not isinstance(subject, DictVariable):
        raise unsupported("unsupported_opcode", f"a mapping pattern matched against {subject.describe()}")
    values = []
    for key in keys.iterate(tx):
        if not subject.contains(tx, key):
            tx.push(ConstantVariable(None))
            return
        values.append(subject.getitem(tx, key))
    tx.push(TupleVariable(values))
