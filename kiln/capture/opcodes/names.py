"""Loads and stores: locals, globals, cells, attributes, constants, imports."""

from __future__ import annotations

import sys

from kiln.capture.break_records import unsupported
from kiln.capture.bytecode import PY
from kiln.capture.opcodes.calls import push_call_target
from kiln.capture.opcodes.registry import SINCE_312, opcode
from kiln.capture.user_exceptions import raise_real
from kiln.capture.variables.base import NULL, NullVariable
from kiln.capture.variables.functions import CellVariable, RealCellVariable
from kiln.capture.variables.objects import SuperVariable, UserObjectVariable
from kiln.capture.variables.wrapping import wrap_constant_result


@opcode("LOAD_CONST")
def LOAD_CONST(tx, inst) -> None:
    tx.push(wrap_constant_result(inst.argval))


@opcode("LOAD_FAST", "LOAD_FAST_CHECK")
def LOAD_FAST(tx, inst) -> None:
    if PY >= (3, 13) and inst.argval not in tx.locals and (inst.argval in tx.code.co_cellvars
                                                          or inst.argval in tx.code.co_freevars):
        # 3.13 loads a cell itself with LOAD_FAST (the closure tuple of a nested function), where
        # 3.11 and 3.12 use LOAD_CLOSURE. (The slot may hold a plain value instead: an inlined
        # comprehension's variable of the same name, kept in `tx.locals` meanwhile.)
        LOAD_CLOSURE(tx, inst)
        return
    value = tx.locals.get(inst.argval)
    if value is None:
        raise raise_real(UnboundLocalError(f"cannot access local variable '{inst.argval}' where it is not associated with a value"))
    tx.push(value)


@opcode("LOAD_FAST_LOAD_FAST", versions=((3, 13),))
def LOAD_FAST_LOAD_FAST(tx, inst) -> None:
    # 3.13's superinstructions name two locals (argval is the pair, in the order they act).
    for name in inst.argval:
        LOAD_FAST(tx, _Named(name))


@opcode("STORE_FAST_STORE_FAST", versions=((3, 13),))
def STORE_FAST_STORE_FAST(tx, inst) -> None:
    for name in inst.argval:
        STORE_FAST(tx, _Named(name))


@opcode("STORE_FAST_LOAD_FAST", versions=((3, 13),))
def STORE_FAST_LOAD_FAST(tx, inst) -> None:
    stored, loaded = inst.argval
    STORE_FAST(tx, _Named(stored))
    LOAD_FAST(tx, _Named(loaded))


class _Named:
    """One half of a superinstruction, as the single-local handlers read it."""

    def __init__(self, name: str) -> None:
        self.argval = name


@opcode("LOAD_FAST_AND_CLEAR", versions=SINCE_312)
def LOAD_FAST_AND_CLEAR(tx, inst) -> None:
    tx.push(tx.locals.pop(inst.argval, NULL))


@opcode("STORE_FAST")
def STORE_FAST(tx, inst) -> None:
    value = tx.pop()
    if isinstance(value, NullVariable):  # 3.12 comprehensions restore an unbound name
        tx.locals.pop(inst.argval, None)
    else:
        tx.locals[inst.argval] = value


@opcode("DELETE_FAST")
def DELETE_FAST(tx, inst) -> None:
    tx.locals.pop(inst.argval, None)


@opcode("LOAD_GLOBAL")
def LOAD_GLOBAL(tx, inst) -> None:
    value = tx.load_global(inst.argval)
    push_call_target(tx, value) if inst.arg & 1 else tx.push(value)


@opcode("STORE_GLOBAL")
def STORE_GLOBAL(tx, inst) -> None:
    tx.output.side_effects.record_global(tx.f_globals, inst.argval, tx.pop())


@opcode("MAKE_CELL")
def MAKE_CELL(tx, inst) -> None:
    tx.cells[inst.argval] = CellVariable(tx.locals.pop(inst.argval, None))


@opcode("LOAD_DEREF", "LOAD_CLASSDEREF")
def LOAD_DEREF(tx, inst) -> None:
    tx.push(tx.load_cell(inst.argval))


@opcode("STORE_DEREF")
def STORE_DEREF(tx, inst) -> None:
    cell = tx.cells.get(inst.argval)
    value = tx.pop()
    if isinstance(cell, CellVariable):
        cell.contents = value
    elif isinstance(cell, RealCellVariable):
        # A cell that outlives the call (an outer function's, or a broken frame's handed to its
        # resume function): written after the graph runs, read as written meanwhile.
        cell.written = value
        tx.output.side_effects.record_cell(cell, value)
    else:
        tx.cells[inst.argval] = CellVariable(value)


@opcode("DELETE_DEREF")
def DELETE_DEREF(tx, inst) -> None:
    cell = tx.cells.get(inst.argval)
    if isinstance(cell, CellVariable):
        cell.contents = None


@opcode("LOAD_CLOSURE")
def LOAD_CLOSURE(tx, inst) -> None:
    cell = tx.cells.get(inst.argval)
    if cell is None:
        cell = tx.cells[inst.argval] = CellVariable(tx.locals.pop(inst.argval, None))
    tx.push(cell)


@opcode("LOAD_ATTR")
def LOAD_ATTR(tx, inst) -> None:
    obj = tx.pop()
    name = inst.argval
    value = obj.getattr(tx, name)
    push_call_target(tx, value) if PY >= (3, 12) and inst.arg & 1 else tx.push(value)


@opcode("LOAD_METHOD", versions=((3, 11),))
def LOAD_METHOD(tx, inst) -> None:
    push_call_target(tx, tx.pop().getattr(tx, inst.argval))


@opcode("LOAD_SUPER_ATTR", versions=SINCE_312)
def LOAD_SUPER_ATTR(tx, inst) -> None:
    obj, cls = tx.pop(), tx.pop()
    tx.pop()  # the global `super`
    if inst.arg & 2:
        sup = SuperVariable(cls.as_constant(), obj)
    else:
        sup = tx.zero_arg_super()
    value = sup.getattr(tx, inst.argval)
    push_call_target(tx, value) if inst.arg & 1 else tx.push(value)


@opcode("STORE_ATTR")
def STORE_ATTR(tx, inst) -> None:
    obj, value = tx.pop(), tx.pop()
    obj.setattr(tx, inst.argval, value)


@opcode("DELETE_ATTR")
def DELETE_ATTR(tx, inst) -> None:
    obj = tx.pop()
    if not isinstance(obj, UserObjectVariable):
        raise unsupported("unsupported_setattr", f"del of attribute {inst.argval!r} of {obj.describe()}")
    obj.delattr(tx, inst.argval)


@opcode("IMPORT_NAME")
def IMPORT_NAME(tx, inst) -> None:
    fromlist, level = tx.pop().as_constant(), tx.pop().as_constant()
    name = inst.argval
    package = tx.f_globals.get("__package__") or ""
    absolute = name if level == 0 else _resolve(name, package, level)
    if absolute not in sys.modules:
        raise unsupported("unsupported_import", f"importing {absolute!r} (not imported yet) while capturing",
                          "import it at the top of the module")
    module = __import__(name, tx.f_globals, None, fromlist, level)
    tx.push(wrap_constant_result(module))


def _resolve(name: str, package: str, level: int) -> str:
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - level + 1])
    return f"{base}.{name}" if name else base


@opcode("IMPORT_FROM")
def IMPORT_FROM(tx, inst) -> None:
    tx.push(tx.stack[-1].getattr(tx, inst.argval))


@opcode("LOAD_ASSERTION_ERROR")
def LOAD_ASSERTION_ERROR(tx, inst) -> None:
    tx.push(wrap_constant_result(AssertionError))
