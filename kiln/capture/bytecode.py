"""Decoded bytecode of one code object: instructions, jump targets, exception table, lines.

Built on `dis`, which handles EXTENDED_ARG and inline caches for each Python version; the
exception table (3.11+) comes from `dis._parse_exception_table`, stable across 3.11-3.13.
"""

from __future__ import annotations

import dis
import functools
import sys
import types
from dataclasses import dataclass

PY = sys.version_info[:2]
# The CPython versions whose bytecode kiln's interpreter models (opcodes, inline caches, the
# exception table and line table formats differ from version to version).
SUPPORTED_PYTHONS = ((3, 11), (3, 12), (3, 13))
# Where a call's NULL (or self) slot lies: below the callable in 3.11 and 3.12 (NULL, fn,
# args...), above it in 3.13 (fn, NULL, args...).
NULL_ABOVE_CALLABLE = PY >= (3, 13)


@dataclass(frozen=True)
class ExceptionEntry:
    start: int
    end: int
    target: int
    depth: int
    lasti: bool


class Bytecode:
    def __init__(self, code: types.CodeType) -> None:
        self.code = code
        self.instructions = [i for i in dis.get_instructions(code) if i.opname != "CACHE"]
        self.index_of = {inst.offset: n for n, inst in enumerate(self.instructions)}
        self.exception_table = [
            ExceptionEntry(e.start, e.end, e.target, e.depth, e.lasti) for e in dis._parse_exception_table(code)
        ]

    def handler_for(self, offset: int) -> ExceptionEntry | None:
        for entry in self.exception_table:
            if entry.start <= offset < entry.end:
                return entry
        return None

    def line_of(self, index: int) -> int:
        for inst in reversed(self.instructions[: index + 1]):
            if inst.positions is not None and inst.positions.lineno is not None:
                return inst.positions.lineno
        return self.code.co_firstlineno


@functools.lru_cache(maxsize=4096)
def decode(code: types.CodeType) -> Bytecode:
    return Bytecode(code)
