"""Jumps, loops, returns, `with` blocks and generators."""

from __future__ import annotations

import torch

from kiln.capture.break_records import unsupported
from kiln.capture.opcodes.registry import SINCE_312, opcode
from kiln.capture.variables.base import BoundBuiltinMethod, Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.bytecode import PY
from kiln.capture.variables.containers import GeneratorIterator, IteratorVariable, ListVariable
from kiln.capture.variables.tensor import TensorVariable
from kiln.capture.variables.wrapping import wrap_constant_result


@opcode("JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP", "JUMP_NO_INTERRUPT")
def JUMP_FORWARD(tx, inst) -> None:
    tx.jump_to(inst.argval)


def _is_none(v: Variable) -> bool:
    return v.is_constant() and v.as_constant() is None


_CONDITIONS = {
    "TRUE": lambda tx, v: v.truth(tx),
    "FALSE": lambda tx, v: not v.truth(tx),
    "NONE": lambda tx, v: _is_none(v),
    "NOT_NONE": lambda tx, v: not _is_none(v),
}


def _pop_jump(tx, inst) -> None:
    condition = inst.opname.split("_IF_")[1]
    value = tx.pop()
    if condition in ("TRUE", "FALSE") and isinstance(value, TensorVariable) and _tensor_assert(tx, inst, value):
        return
    if _CONDITIONS[condition](tx, value):
        tx.jump_to(inst.argval)


def _tensor_assert(tx, inst, value: TensorVariable) -> bool:
    """`assert x[0] == 3, "message"` on a one-element tensor: the check goes into the graph as
    torch._assert_async (a RuntimeError with the message where it fails, not an AssertionError;
    Dynamo's rewrite too) instead of reading the value while capturing (a graph break)."""
    numel = value.example.numel()
    if not isinstance(numel, int) or numel != 1:  # (symbolic, or a tensor whose truth eager refuses)
        return False
    following = [i for i in tx.instructions[tx.ip : tx.ip + 8] if i.opname not in ("CACHE", "PRECALL", "EXTENDED_ARG")]
    names = [i.opname for i in following]
    if names[:2] == ["LOAD_ASSERTION_ERROR", "RAISE_VARARGS"]:
        message = ""
    elif names[:4] == ["LOAD_ASSERTION_ERROR", "LOAD_CONST", "CALL", "RAISE_VARARGS"] and isinstance(following[1].argval, str) \
            and following[2].arg == 0:
        message = following[1].argval
    else:
        return False
    holds = value if inst.opname.endswith("TRUE") else tx.output.call("call_function", torch.logical_not, [value], {})
    tx.output.call("call_function", torch._assert_async, [holds, ConstantVariable(message)], {})
    tx.jump_to(inst.argval)
    return True


for _direction in ("POP_JUMP_FORWARD", "POP_JUMP_BACKWARD"):
    opcode(*[f"{_direction}_IF_{c}" for c in _CONDITIONS], versions=((3, 11),))(_pop_jump)
opcode(*[f"POP_JUMP_IF_{c}" for c in _CONDITIONS], versions=SINCE_312)(_pop_jump)


@opcode("TO_BOOL", versions=((3, 13),))
def TO_BOOL(tx, inst) -> None:
    """3.13 converts a condition with TO_BOOL before POP_JUMP_IF_* and UNARY_NOT; both of kiln's
    handlers take the truth of what they pop, so the value stays as it is: a condition on a
    tensor then breaks the graph at the jump, where kiln resumes (as on 3.11 and 3.12)."""


@opcode("JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP", versions=((3, 11),))
def JUMP_IF_TRUE_OR_POP(tx, inst) -> None:
    want = inst.opname == "JUMP_IF_TRUE_OR_POP"
    if tx.stack[-1].truth(tx) == want:
        tx.jump_to(inst.argval)
    else:
        tx.pop()


@opcode("GET_ITER")
def GET_ITER(tx, inst) -> None:
    value = tx.pop()
    if isinstance(value, ListVariable):
        tx.push(_live_list_iterator(value))
    else:
        tx.push(value.get_iter(tx))


def _live_list_iterator(lst: ListVariable) -> IteratorVariable:
    # A list iterator reads the list as it is now: items appended inside the loop are visited,
    # as in Python. The list variable changes its `items` in place, so sharing it is enough.
    iterator = IteratorVariable([])
    iterator.items = lst.items
    return iterator


@opcode("FOR_ITER")
def FOR_ITER(tx, inst) -> None:
    iterator = tx.stack[-1]
    if not isinstance(iterator, IteratorVariable):
        iterator = tx.stack[-1] = IteratorVariable(iterator.iterate(tx))
    item = iterator.next(tx)
    if item is not None:
        tx.push(item)
        return
    tx.pop()
    tx.jump_to(inst.argval)
    if tx.instructions[tx.ip].opname == "END_FOR":  # exhaustion skips END_FOR (3.12), END_FOR and POP_TOP (3.13)
        tx.ip += 2 if PY >= (3, 13) else 1


@opcode("RETURN_VALUE")
def RETURN_VALUE(tx, inst) -> None:
    tx.return_value = tx.pop()
    tx.done = True


@opcode("RETURN_CONST", versions=SINCE_312)
def RETURN_CONST(tx, inst) -> None:
    tx.return_value = wrap_constant_result(inst.argval)
    tx.done = True


@opcode("BEFORE_WITH")
def BEFORE_WITH(tx, inst) -> None:
    manager = tx.pop()
    tx.push(BoundBuiltinMethod(manager, "__exit__") if not hasattr(manager, "_dunder") else manager.getattr(tx, "__exit__"))
    tx.push(manager.call_method(tx, "__enter__", [], {}))


@opcode("RETURN_GENERATOR")
def RETURN_GENERATOR(tx, inst) -> None:
    if tx.yields is None:
        raise unsupported("unsupported_opcode", "a generator run outside of iteration")
    tx.push(ConstantVariable(None))


@opcode("YIELD_VALUE")
def YIELD_VALUE(tx, inst) -> None:
    if tx.yields is None:
        raise unsupported("unsupported_opcode", "yield outside a generator being consumed")
    tx.yields.append(tx.pop())
    tx.push(ConstantVariable(None))
    tx.suspended = True


@opcode("GET_YIELD_FROM_ITER")
def GET_YIELD_FROM_ITER(tx, inst) -> None:
    # `yield from x`: a generator is delegated to as it is (send and its return value reach it),
    # anything else iterated.
    tx.push(tx.pop().get_iter(tx))


@opcode("SEND")
def SEND(tx, inst) -> None:
    """One step of `yield from`: the sent value to the iterator below it; its next item goes on to
    YIELD_VALUE, or, when it is done, its return value is the expression's (3.11: in place of the
    iterator; 3.12: above it, END_SEND drops the iterator) and the loop jumps past."""
    value, source = tx.pop(), tx.stack[-1]
    if isinstance(source, GeneratorIterator):
        item = source.send(tx, value)
    elif value.is_constant() and value.as_constant() is None and isinstance(source, IteratorVariable):
        item = source.next(tx)
    else:
        raise unsupported("unsupported_opcode", f"`yield from` sending a value into {source.describe()}")
    if item is not None:
        tx.push(item)
        return
    result = source.result if isinstance(source, GeneratorIterator) else ConstantVariable(None)
    if PY < (3, 12):
        tx.pop()
    tx.push(result)
    tx.jump_to(inst.argval)


@opcode("END_SEND", versions=SINCE_312)
def END_SEND(tx, inst) -> None:
    value = tx.pop()
    tx.pop()  # the iterator
    tx.push(value)


