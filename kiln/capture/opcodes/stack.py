"""Instructions that only move values on the stack."""

from __future__ import annotations

from kiln.capture.opcodes.registry import opcode
from kiln.capture.variables.base import NULL


@opcode("NOP", "RESUME", "PRECALL", "EXTENDED_ARG", "COPY_FREE_VARS")
def NOP(tx, inst) -> None:
    pass


@opcode("POP_TOP")
def POP_TOP(tx, inst) -> None:
    tx.pop()


@opcode("END_FOR", versions=((3, 12),))
def END_FOR(tx, inst) -> None:
    tx.popn(2)


@opcode("END_FOR", versions=((3, 13),))
def END_FOR_313(tx, inst) -> None:
    tx.pop()  # 3.13: a POP_TOP follows for the iterator


@opcode("PUSH_NULL")
def PUSH_NULL(tx, inst) -> None:
    tx.push(NULL)


@opcode("COPY")
def COPY(tx, inst) -> None:
    tx.push(tx.stack[-inst.arg])


@opcode("SWAP")
def SWAP(tx, inst) -> None:
    s = tx.stack
    s[-1], s[-inst.arg] = s[-inst.arg], s[-1]
