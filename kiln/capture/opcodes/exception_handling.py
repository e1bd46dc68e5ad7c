"""Opcodes that raise and handle exceptions (3.11+ zero-cost exception tables). The exceptions
themselves, as variables, are in kiln/capture/user_exceptions.py."""

from __future__ import annotations

from kiln.capture.break_records import unsupported
from kiln.capture.opcodes.registry import opcode
from kiln.capture.user_exceptions import ExceptionVariable, UserRaise
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.objects import ClassVariable


@opcode("PUSH_EXC_INFO")
def PUSH_EXC_INFO(tx, inst) -> None:
    exc = tx.pop()
    tx.push(tx.exc_info[-1] if tx.exc_info else ConstantVariable(None))
    tx.exc_info.append(exc)
    tx.push(exc)


@opcode("POP_EXCEPT")
def POP_EXCEPT(tx, inst) -> None:
    tx.pop()
    if tx.exc_info:
        tx.exc_info.pop()


@opcode("CHECK_EXC_MATCH")
def CHECK_EXC_MATCH(tx, inst) -> None:
    classes, exc = tx.pop(), tx.stack[-1]
    spec = tuple(c.as_constant() for c in classes.items) if hasattr(classes, "items") else classes.as_constant()
    tx.push(ConstantVariable(issubclass(exc.python_type(), spec)))


def _as_exception(tx, value) -> ExceptionVariable:
    if isinstance(value, ExceptionVariable):
        return value
    if isinstance(value, ClassVariable) and issubclass(value.value, BaseException):
        return ExceptionVariable(value.value)
    raise unsupported("unsupported_raise", f"raising {value.describe()}")


@opcode("RAISE_VARARGS")
def RAISE_VARARGS(tx, inst) -> None:
    if inst.arg == 0:
        if not tx.exc_info:
            raise UserRaise(ExceptionVariable(RuntimeError, (ConstantVariable("No active exception to reraise"),)))
        raise UserRaise(tx.exc_info[-1])
    if inst.arg == 2:
        tx.pop()  # the cause
    raise UserRaise(_as_exception(tx, tx.pop()))


@opcode("RERAISE")
def RERAISE(tx, inst) -> None:
    exc = tx.pop()
    if inst.arg:
        tx.pop()  # lasti
    raise UserRaise(_as_exception(tx, exc))


@opcode("WITH_EXCEPT_START")
def WITH_EXCEPT_START(tx, inst) -> None:
    exc = tx.stack[-1]
    exit_fn = tx.stack[-4]
    exc_type = ClassVariable(exc.python_type())
    tx.push(exit_fn.call(tx, [exc_type, exc, ConstantVariable(None)], {}))
