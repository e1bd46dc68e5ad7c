"""Code objects for graph breaks: the rest of a frame from one instruction on, and one instruction alone.

A *resume function* continues a frame at an instruction: its parameters are the frame's slots
in their own order — every local (`co_varnames`), then the cells that are not locals — followed
by the value stack at that point. Its bytecode is a short prologue — unbind the locals that were
unbound or are never read again, push the stack, jump — followed by the original bytecode
unchanged: every slot keeps its index, so no instruction that names a local or a cell (3.13's
superinstructions pack two in four bits each) needs an edit, and CPython 3.11-3.13 jumps are
relative. Only the exception table (absolute offsets) is shifted, and the line table gets a
no-location entry for the prologue. kiln captures the resume function like any other frame.

A *step function* runs one instruction natively on a given stack and returns the stack after it:
how the code around a graph break executes the construct kiln could not capture.
"""

from __future__ import annotations

import dis
import functools
import types
import weakref

import torch

from typing import Any

from kiln.capture.bytecode import PY, ExceptionEntry, decode

NULL_SLOT = object()  # passed for a stack slot that holds CPython's NULL; the prologue pushes NULL

# resume code -> (the user's code it continues, prologue length in bytes), so a break inside a
# resume function resumes from the user's code again instead of stacking prologues.
_ORIGINS: "weakref.WeakKeyDictionary[types.CodeType, tuple[types.CodeType, int]]" = weakref.WeakKeyDictionary()


def origin(code: types.CodeType) -> tuple[types.CodeType, int]:
    """The user's code object `code` continues, and the byte offset of its first instruction in `code`."""
    return _ORIGINS.get(code, (code, 0))


def _op(name: str) -> int:
    return dis.opmap[name]


def _emit(name: str, arg: int = 0) -> bytes:
    """One instruction with its EXTENDED_ARG prefixes and zeroed inline caches."""
    out = bytearray()
    for shift in (24, 16, 8):
        if arg >> shift:
            out += bytes([_op("EXTENDED_ARG"), (arg >> shift) & 0xFF])
    out += bytes([_op(name), arg & 0xFF])
    out += bytes(2 * _cache_entries(_op(name)))
    return bytes(out)


def _cache_entries(opcode: int) -> int:
    entries = dis._inline_cache_entries
    return entries[opcode] if isinstance(entries, list) else entries.get(dis.opname[opcode], 0)


def _no_location(units: int) -> bytes:
    # Line table entries of "no location" (code 15), at most 8 code units each.
    out = bytearray()
    while units > 0:
        n = min(units, 8)
        out.append(0x80 | (15 << 3) | (n - 1))
        units -= n
    return bytes(out)


def _varint(value: int, first: bool) -> bytes:
    chunks = [value & 63]
    value >>= 6
    while value:
        chunks.append(value & 63)
        value >>= 6
    chunks.reverse()
    out = [c | 64 for c in chunks[:-1]] + [chunks[-1]]
    if first:
        out[0] |= 128
    return bytes(out)


def encode_exception_table(entries: list[ExceptionEntry]) -> bytes:
    """The inverse of `dis._parse_exception_table` (offsets in bytes, stored in code units)."""
    out = bytearray()
    for e in entries:
        out += _varint(e.start // 2, True) + _varint((e.end - e.start) // 2, False) + _varint(e.target // 2, False)
        out += _varint((e.depth << 1) | int(e.lasti), False)
    return bytes(out)


def cell_names(code: types.CodeType) -> tuple[str, ...]:
    """The frame's closure cells, its own then its outer function's: what a resume function of it
    takes, as cell objects, after the live locals."""
    return tuple(code.co_cellvars) + tuple(code.co_freevars)


def check_resumable(code: types.CodeType) -> str | None:
    """Why a frame of `code` cannot continue in a resume function, or None."""
    if code.co_flags & (0x20 | 0x80 | 0x100 | 0x200):
        return "the function is a generator or coroutine"
    if len(code.co_varnames) + len(cell_names(code)) + code.co_stacksize > 255:
        return "the function has too many locals"
    return None


def stack_name(i: int) -> str:
    return f"___stack{i}"


_READS = ("LOAD_FAST", "DELETE_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR")
_READS_SECOND = ("STORE_FAST_LOAD_FAST",)  # 3.13: stores its first local, reads its second
_READS_BOTH = ("LOAD_FAST_LOAD_FAST",)
_NO_FALLTHROUGH = ("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "RETURN_VALUE", "RETURN_CONST",
                   "RAISE_VARARGS", "RERAISE")


@functools.lru_cache(maxsize=4096)
def live_locals(code: types.CodeType, offset: int) -> frozenset[str]:
    """The locals some instruction reachable from `offset` may read (or delete): the ones a
    resume function there takes. Conservative: a write before the read still counts as live."""
    if {"locals", "vars", "eval", "exec"} & set(code.co_names):
        return frozenset(code.co_varnames)
    bc = decode(code)
    seen, todo, names = set(), [bc.index_of[offset]], set()
    while todo:
        index = todo.pop()
        if index in seen or index >= len(bc.instructions):
            continue
        seen.add(index)
        inst = bc.instructions[index]
        if inst.opname in _READS:
            names.add(inst.argval)
        elif inst.opname in _READS_BOTH:
            names.update(inst.argval)
        elif inst.opname in _READS_SECOND:
            names.add(inst.argval[1])
        if inst.opcode in dis.hasjrel or inst.opcode in dis.hasjabs:
            todo.append(bc.index_of[inst.argval])
        if inst.opname not in _NO_FALLTHROUGH:
            todo.append(index + 1)
        handler = bc.handler_for(inst.offset)
        if handler is not None:
            todo.append(bc.index_of[handler.target])
    return frozenset(names)


def resume_arguments(code: types.CodeType, live: tuple[str, ...], values: dict[str, Any], cells: list,
                     stack: list) -> list:
    """What the resume function of `code` is called with: each local's value where it is live
    (None where not: the prologue unbinds it), the cell objects in their slots (`cells` in
    `cell_names` order), then the stack's values that are not NULL."""
    cell_of = dict(zip(cell_names(code), cells))
    slots = [cell_of[n] if n in cell_of else values[n] if n in live else None for n in code.co_varnames]
    slots += [cell_of[n] for n in cell_names(code) if n not in code.co_varnames]
    return slots + [v for v in stack if v is not NULL_SLOT]


def resume_code(code: types.CodeType, offset: int, stack_nulls: tuple[bool, ...], live: tuple[str, ...],
                grad_mode: bool | None = None) -> types.CodeType:
    """The rest of `code` from the instruction at byte `offset`, entered with the locals `live`
    bound (every other local unbound) and a stack of `len(stack_nulls)` values (True where the
    slot holds NULL). Parameters: `resume_arguments`' layout. With `grad_mode`, the prologue
    first switches grad mode to it (a break inside a grad-mode block: the function is called in
    the mode outside the block, and enters the block's)."""
    stack_params = tuple(stack_name(i) for i, null in enumerate(stack_nulls) if not null)
    # The frame's cells (its own and its outer function's) are parameters too, passed as the cell
    # objects themselves and declared as cell parameters: without the MAKE_CELL that would wrap
    # a parameter in a new cell (the original's, skipped by the jump), each slot holds the cell
    # it was given, so the rest of the frame shares its cells with the closures made before the
    # break, as the original frame would. Slots keep the original's order (locals, the cells
    # that are not locals, then the outer function's), so no operand changes.
    cells = cell_names(code)
    params = tuple(code.co_varnames) + tuple(n for n in cells if n not in code.co_varnames) + stack_params
    prologue = bytearray(_emit("RESUME"))
    for index, name in enumerate(code.co_varnames):
        if name not in live and name not in cells:
            prologue += _emit("DELETE_FAST", index)
    consts = code.co_consts
    if grad_mode is not None:
        consts = consts + (torch._C._set_grad_enabled, grad_mode)
        load_fn = _emit("LOAD_CONST", len(consts) - 2)
        prologue += load_fn + _emit("PUSH_NULL") if PY >= (3, 13) else _emit("PUSH_NULL") + load_fn
        prologue += _emit("LOAD_CONST", len(consts) - 1)
        prologue += (_emit("PRECALL", 1) if PY == (3, 11) else b"") + _emit("CALL", 1) + _emit("POP_TOP")
    for i, is_null in enumerate(stack_nulls):
        prologue += _emit("PUSH_NULL") if is_null else _emit("LOAD_FAST", params.index(stack_name(i)))
    # The jump is the prologue's last instruction: its relative target is the original offset.
    prologue += _emit("JUMP_FORWARD", offset // 2)
    shift = len(prologue)
    table = [ExceptionEntry(e.start + shift, e.end + shift, e.target + shift, e.depth, e.lasti)
             for e in decode(code).exception_table]
    flags = code.co_flags & ~(0x04 | 0x08)  # no *args / **kwargs: every parameter is positional
    line = decode(code).line_of(decode(code).index_of[offset])
    resumed = code.replace(
        co_code=bytes(prologue) + code.co_code,
        co_consts=consts,
        co_varnames=params,
        co_cellvars=cells,
        co_freevars=(),
        co_nlocals=len(params),
        co_argcount=len(params),
        co_posonlyargcount=0,
        co_kwonlyargcount=0,
        co_flags=flags,
        co_stacksize=max(code.co_stacksize + 1, 3),
        co_linetable=_no_location(shift // 2) + code.co_linetable,
        co_exceptiontable=encode_exception_table(table),
        co_name=code.co_name,  # tracebacks and break records name the user's function
        co_qualname=f"{code.co_qualname}_kiln_resume_at_line{line}",
    )
    _ORIGINS[resumed] = (code, shift)
    return resumed


_DEREF = ("LOAD_DEREF", "STORE_DEREF", "DELETE_DEREF", "LOAD_CLOSURE", "MAKE_CELL", "LOAD_CLASSDEREF",
          "LOAD_FROM_DICT_OR_DEREF")


def step_code(code: types.CodeType, offset: int, stack_nulls: tuple[bool, ...], kw_names_const: int | None) -> types.CodeType:
    """A function of the stack values the instruction of `code` at `offset` consumes (True in
    `stack_nulls` where one is NULL) that runs that instruction and returns what it pushes, as
    a tuple. For CALL, `kw_names_const` re-issues the pending KW_NAMES (3.11, 3.12; 3.13's
    CALL_KW finds the names on the stack)."""
    depth = len(stack_nulls)
    inst = decode(code).instructions[decode(code).index_of[offset]]
    steps: list[tuple[str, int]] = []
    if kw_names_const is not None:
        steps.append(("KW_NAMES", kw_names_const))
    if inst.opname == "CALL" and PY == (3, 11):
        steps.append(("PRECALL", inst.arg))
    steps.append((inst.opname, inst.arg or 0))
    after = depth + sum(_stack_effect(name, arg) for name, arg in steps)
    body = bytearray(_emit("RESUME"))
    for i, is_null in enumerate(stack_nulls):
        body += _emit("PUSH_NULL") if is_null else _emit("LOAD_FAST", i)
    for name, arg in steps:
        body += _emit(name, arg)
    body += _emit("BUILD_TUPLE", after) + _emit("RETURN_VALUE")
    names = tuple(stack_name(i) for i in range(depth))
    if inst.opname in _DEREF:
        raise ValueError(f"no step function for {inst.opname}: it reads a closure cell")
    # No cells: the one instruction reads only the stack (a frame whose function is a closure,
    # BLOOM's, made a step function FunctionType refused without a closure tuple).
    return code.replace(
        co_code=bytes(body), co_varnames=names, co_nlocals=depth, co_argcount=depth, co_posonlyargcount=0, co_kwonlyargcount=0,
        co_freevars=(), co_cellvars=(),
        co_flags=code.co_flags & ~(0x04 | 0x08), co_stacksize=max(depth, after) + 2,
        co_linetable=_no_location(len(body) // 2), co_exceptiontable=b"",
        co_name=f"{code.co_name}_kiln_step_{inst.opname}", co_qualname=f"{code.co_qualname}_kiln_step_{inst.opname}",
    )


def _stack_effect(name: str, arg: int) -> int:
    opcode = _op(name)
    return dis.stack_effect(opcode, arg if opcode >= dis.HAVE_ARGUMENT else None, jump=False)


def function_of(code: types.CodeType, f_globals: dict) -> types.FunctionType:
    return types.FunctionType(code, f_globals, code.co_name)
