"""The symbolic interpreter: runs a code object's bytecode over variables instead of values.

One `Translator` per frame (the compiled function, and each inlined call). It keeps CPython's
value stack, locals and cells as variables, and dispatches each instruction to the handler named
after its opcode (kiln/capture/opcodes/). Exceptions raised by the traced code follow the code
object's exception table, as in CPython.
"""

from __future__ import annotations

import builtins
import functools
import types
from typing import Any, Sequence

import torch

from kiln import config
from kiln.capture.binder import argument_names, make_binder
from kiln.capture.break_records import Unsupported, unsupported
from kiln.capture.bytecode import decode
from kiln.capture.guards import Guard
from kiln.capture.opcodes import HANDLERS
from kiln.capture.sources import ConstSource, ItemSource
from kiln.capture.user_exceptions import UserRaise, raise_real
from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable
from kiln.capture.variables.containers import DictVariable, TupleVariable
from kiln.capture.variables.functions import CellVariable, RealCellVariable
from kiln.capture.variables.objects import SuperVariable
from kiln.capture.variables.wrapping import wrap

_BUILTINS = builtins.__dict__


class Translator:
    def __init__(self, code: types.CodeType, f_globals: dict, output: Any, locals_: dict[str, Variable],
                 freevars: dict[str, Variable] | None = None, parent: "Translator | None" = None) -> None:
        self.code, self.f_globals, self.output, self.parent = code, f_globals, output, parent
        self.bytecode = decode(code)
        self.instructions = self.bytecode.instructions
        self.locals: dict[str, Variable] = dict(locals_)
        self.cells: dict[str, Variable] = dict(freevars or {})
        self.stack: list[Variable] = []
        self.ip = 0
        self.kw_names: tuple[str, ...] = ()
        self.exc_info: list[Variable] = []
        self.depth = 0 if parent is None else parent.depth + 1
        self.done = False
        self.return_value: Variable | None = None
        self.yields: list[Variable] | None = None  # collecting a generator's items
        self.suspended = False  # a generator frame stopped at a yield; `run` resumes it
        self.globals_source = ConstSource(f_globals, f"globals of {f_globals.get('__name__', '?')}")
        # Graph breaks (top frame only): how often each instruction was reached, and where to stop.
        self.arrivals: dict[int, int] = {}
        self.stop_at: tuple[int, int] | None = None  # (instruction index, arrival)
        self.stopped = False

    # --- the loop ---------------------------------------------------------------------------

    def run(self) -> Variable:
        while not self.done:
            if self.suspended:  # run generators lazily: their consumer's code runs between yields
                self.suspended = False
                return None
            if self.ip >= len(self.instructions):
                raise unsupported("unsupported_opcode", "ran past the end of the bytecode")
            index = self.ip
            inst = self.instructions[index]
            if self.parent is None:
                arrival = self.arrivals[index] = self.arrivals.get(index, 0) + 1
                if self.stop_at == (index, arrival):
                    self.stopped = True  # the state before this instruction is what a break resumes from
                    return None
            self.ip += 1
            handler = HANDLERS.get(inst.opname)
            try:
                if handler is None:
                    raise unsupported("unsupported_opcode", f"the {inst.opname} instruction is not supported yet",
                                      "kiln runs this instruction outside the graph (a graph break); rewrite the construct to keep one graph")
                handler(self, inst)
            except UserRaise as error:
                if not self._to_handler(error, inst):
                    raise
            except Unsupported as error:
                if error.where is None:
                    error.where = (self.code.co_filename, self.bytecode.line_of(index), self.code.co_name)
                if self.parent is not None:
                    error.inlined = True
                elif error.at is None:
                    error.at = (index, self.arrivals[index])
                raise
            except Exception as error:  # noqa: BLE001 - a fault of kiln's, not the user's: the frame runs eagerly
                raise _internal_error(error, (self.code.co_filename, self.bytecode.line_of(index), self.code.co_name)) from error
        assert self.return_value is not None
        return self.return_value

    def _to_handler(self, error: UserRaise, inst: Any) -> bool:
        entry = self.bytecode.handler_for(inst.offset)
        if entry is None:
            return False
        del self.stack[entry.depth:]
        if entry.lasti:
            self.stack.append(ConstantVariable(inst.offset))
        self.stack.append(error.exc)
        self.jump_to(entry.target)
        return True

    def jump_to(self, offset: int) -> None:
        self.ip = self.bytecode.index_of[offset]

    def push(self, value: Variable) -> None:
        self.stack.append(value)

    def pop(self) -> Variable:
        return self.stack.pop()

    def popn(self, n: int) -> list[Variable]:
        if n == 0:
            return []
        items = self.stack[-n:]
        del self.stack[-n:]
        return items

    # --- names --------------------------------------------------------------------------------

    def load_global(self, name: str) -> Variable:
        pending = self.output.side_effects.pending_global(self.f_globals, name)
        if pending is not None:
            return pending
        if name in self.f_globals:
            return wrap(self, self.f_globals[name], ItemSource(self.globals_source, name))
        builtins_dict = self.f_globals.get("__builtins__", _BUILTINS)
        if isinstance(builtins_dict, types.ModuleType):
            builtins_dict = builtins_dict.__dict__
        if name in builtins_dict:
            # A module global of the same name defined later would shadow the builtin.
            self.output.guards.add(Guard("DICT_CONTAINS", self.globals_source, False, name))
            return wrap(self, builtins_dict[name], None)
        raise raise_real(NameError(f"name '{name}' is not defined"))

    def load_cell(self, name: str) -> Variable:
        cell = self.cells.get(name)
        if isinstance(cell, CellVariable):
            if cell.contents is None:
                raise self._unbound_cell(name)
            return cell.contents
        if isinstance(cell, RealCellVariable):
            if cell.written is not None:
                return cell.written
            try:
                contents = cell.cell.cell_contents
            except ValueError:
                raise self._unbound_cell(name) from None
            var = wrap(self, contents, cell.source)
            if cell.source is None and isinstance(contents, (list, dict, set)):
                var.unreplayable = True  # changing it would change only kiln's copy (containers.record_change)
            return var
        raise unsupported("unsupported_opcode", f"cell {name!r} is not known")

    def _unbound_cell(self, name: str) -> UserRaise:
        if name in self.code.co_freevars:
            message = f"cannot access free variable '{name}' where it is not associated with a value in enclosing scope"
            return raise_real(NameError(message))
        return raise_real(UnboundLocalError(f"cannot access local variable '{name}' where it is not associated with a value"))

    # --- grad mode ----------------------------------------------------------------------------

    def set_grad_mode(self, enabled: bool) -> None:
        if torch.is_grad_enabled() != enabled:
            torch._C._set_grad_enabled(enabled)
        self.output.graph.call_function(torch._C._set_grad_enabled, (enabled,))
        self.output.graph_grad = enabled

    # --- calls --------------------------------------------------------------------------------

    def call(self, fn: Variable, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        return fn.call(self, list(args), dict(kwargs))

    def inline_call(self, fn: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        return self._child(fn, args, kwargs).run()

    def generator_frame(self, fn: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> "Translator":
        """A frame for a generator function's body; each `run()` goes on to its next yield."""
        child = self._child(fn, args, kwargs)
        child.yields = []
        return child

    def _child(self, fn: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> "Translator":
        if self.depth >= config.capture.inline_depth:
            raise unsupported("inline_depth", f"calls nest deeper than {config.capture.inline_depth} while inlining {fn.describe()}",
                              "raise kiln.config.capture.inline_depth, or check for unbounded recursion")
        if runs_eagerly(fn.f_globals.get("__name__", "")):
            raise unsupported("unsupported_call", f"{fn.describe()}: torch.func's transforms (vmap, grad, jacrev) are run, not traced",
                              "the graph breaks at this call; the transform runs eagerly")
        code = fn.code
        bound = bind_arguments(code, fn.qualified_name(), fn.defaults(self), fn.kwdefaults(self), args, kwargs)
        freevars = dict(zip(code.co_freevars, fn.closure(self)))
        return Translator(code, fn.f_globals, self.output, bound, freevars, parent=self)

    def zero_arg_super(self) -> Variable:
        cls = self.load_cell("__class__").as_constant()
        first = self.code.co_varnames[0] if self.code.co_argcount else None
        obj = self.locals.get(first) if first is not None else None
        if obj is None and first in self.cells:
            obj = self.load_cell(first)
        if obj is None:
            raise raise_real(RuntimeError("super(): no arguments"))
        return SuperVariable(cls, obj)


# Modules whose functions run eagerly, never traced nor compiled as frames of their own:
# torch.func's transforms work on wrapped tensors at levels they enter and leave, which a graph
# captured inside them (replayed outside those levels) cannot reproduce.
_EAGER_MODULES = frozenset({"torch._functorch.apis", "torch._functorch.vmap", "torch._functorch.eager_transforms"})


def runs_eagerly(module: str) -> bool:
    return module in _EAGER_MODULES


def _internal_error(error: Exception, where: tuple[str, int, str]) -> Unsupported:
    if isinstance(error, RecursionError):
        failure = unsupported("inline_depth", "Python's recursion limit was reached while inlining calls",
                              "check for unbounded recursion, or lower kiln.config.capture.inline_depth")
    else:
        failure = unsupported("internal_error", f"kiln's interpreter failed here: {type(error).__name__}: {str(error)[:200]}",
                              "a bug in kiln's capture: the frame runs eagerly; please report it with this record")
    failure.where = where
    return failure


def bind_arguments(code: types.CodeType, name: str, defaults: list[Variable], kwdefaults: dict[str, Variable],
                   args: Sequence[Variable], kwargs: dict[str, Variable]) -> dict[str, Variable]:
    """Python's argument binding: parameters of `code` -> variables, or the TypeError eager raises.

    Python binds for us: a function with the same signature (kiln/capture/binder.py) is called
    on one placeholder per variable, so defaults, keywords, *args, **kwargs and the exact
    TypeError message are CPython's own.
    """
    values: list[Variable] = []

    def slot(variable: Variable) -> _Slot:
        values.append(variable)
        return _Slot(len(values) - 1)

    binder = _binder(code, name)
    binder.__defaults__ = tuple(slot(v) for v in defaults) or None
    binder.__kwdefaults__ = {k: slot(v) for k, v in kwdefaults.items()} or None
    try:
        bound = binder(*[slot(a) for a in args], **{k: slot(v) for k, v in kwargs.items()})
    except TypeError as error:
        raise raise_real(error) from None
    result = {}
    for param, value in zip(argument_names(code), bound):
        if isinstance(value, tuple):  # *args
            result[param] = TupleVariable([values[s.index] for s in value])
        elif isinstance(value, dict):  # **kwargs
            result[param] = DictVariable.from_pairs([(ConstantVariable(k), values[s.index]) for k, s in value.items()])
        else:
            result[param] = values[value.index]
    return result


class _Slot:
    """Stands for the variable values[index] while Python binds the arguments."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


@functools.lru_cache(maxsize=1024)
def _binder(code: types.CodeType, qualname: str) -> Any:
    # Comprehensions take `.0`, which is no identifier; it is only ever passed by position.
    names = tuple(n if n.isidentifier() else f"_kiln_arg{i}" for i, n in enumerate(code.co_varnames))
    signature = types.SimpleNamespace(__code__=code.replace(co_varnames=names), __qualname__=qualname, __defaults__=None, __kwdefaults__=None)
    return make_binder(signature)
