"""Graph breaks that resume: end the graph before an instruction kiln cannot capture, run that
instruction natively, and go on in a resume function that kiln captures on its first call.

A capture that fails at instruction i of the compiled frame (or inside a call that instruction
was inlining) is interpreted again up to i, and the state there — the value stack and the
locals — is what the frame's runner rebuilds after calling the graph. The runner then hands it
to a `Continuation`, which executes instruction i for real and calls the resume function of
the instruction that comes next (kiln/capture/resume_code.py):

- a conditional jump on a value kiln could not decide (`if tensor.sum() > 0:`) evaluates it
  and resumes at the branch taken (one resume function per branch);
- a call that failed inside the callee calls the callee compiled as its own frame, so its
  graph work up to its own break is compiled too;
- any other instruction (a call into C code, `print`, `.item()`, an opcode kiln lacks) runs in
  a step function holding that one instruction.

A frame with closure cells hands its cell objects to the resume function, which takes them as
its own (resume_code.py), so closures made before the break and the rest of the frame share
them. Where a break cannot resume — inside a `try` or `with` block, in a generator, or with a
value on the stack or in a local that cannot be rebuilt (an iterator of a running loop) — the
frame runs eagerly, as before, with the reason recorded.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import weakref
from typing import Any, Callable

import torch
from torch import nn
from torch.nn.modules import module as module_mod

from kiln.capture import resume_code as rcode
from kiln.capture.interpreter import runs_eagerly
from kiln.capture.binder import make_binder
from kiln.capture.break_records import BreakRecord, Unsupported, record_break
from kiln.capture.bytecode import NULL_ABOVE_CALLABLE, PY, decode
from kiln.capture.reentry import autocast_state
from kiln.capture.variables.base import BoundBuiltinMethod
from kiln.capture.variables.torch_fns import GradModeVariable

# Kinds of failure that are kiln's own faults or limits of the whole frame: never resumed.
# (an unreplayable change: resumed, the change would go to a copy rebuilt at the break)
_NOT_RESUMABLE = {"internal_error", "frame_dependent", "unreplayable_change"}
_JUMPS = {"TRUE": lambda v: bool(v), "FALSE": lambda v: not v, "NONE": lambda v: v is None, "NOT_NONE": lambda v: v is not None}


def _operands(inst: Any) -> int | None:
    """How many stack values `inst` consumes, for the instructions a step function may run alone
    (none reads the frame's locals or pushes a NULL); None for any other."""
    fixed = {"BINARY_OP": 2, "COMPARE_OP": 2, "IS_OP": 2, "CONTAINS_OP": 2, "BINARY_SUBSCR": 2, "STORE_SUBSCR": 3,
             "DELETE_SUBSCR": 2, "STORE_ATTR": 2, "DELETE_ATTR": 1, "GET_ITER": 1, "UNPACK_SEQUENCE": 1, "UNPACK_EX": 1,
             "UNARY_NEGATIVE": 1, "UNARY_POSITIVE": 1, "UNARY_INVERT": 1, "UNARY_NOT": 1, "BINARY_SLICE": 3,
             "STORE_SLICE": 4, "POP_TOP": 1, "LOAD_ASSERTION_ERROR": 0, "BEFORE_WITH": 1, "TO_BOOL": 1,
             "FORMAT_SIMPLE": 1, "FORMAT_WITH_SPEC": 2, "CONVERT_VALUE": 1}
    name, arg = inst.opname, inst.arg or 0
    if name in fixed:
        return fixed[name]
    if name == "CALL":
        return arg + 2
    if name == "CALL_KW":
        return arg + 3  # 3.13: the keyword names' tuple on top
    if name == "CALL_FUNCTION_EX":
        return 3 + (arg & 1)  # callable and its NULL, args tuple, kwargs dict
    if name == "FORMAT_VALUE":
        return 1 + bool(arg & 0x04)
    if name in ("BUILD_STRING", "BUILD_TUPLE", "BUILD_LIST", "BUILD_SET"):
        return arg
    if name == "BUILD_MAP":
        return 2 * arg
    if name == "LOAD_ATTR" and not (PY >= (3, 12) and arg & 1):
        return 1
    return None


def why_not_resumable(code: types.CodeType, error: Unsupported) -> str | None:
    """None when a capture of `code` that failed with `error` can break there and resume."""
    if error.at is None or error.kind in _NOT_RESUMABLE:
        return "the failure is not at an instruction of the compiled frame"
    why = rcode.check_resumable(code)
    if why is not None:
        return why
    inst = decode(code).instructions[error.at[0]]
    if "try" in enclosing_blocks(code, inst.offset):
        return "the break is inside a try block"
    if _jump_condition(inst) is None and _operands(inst) is None:
        return f"the {inst.opname} instruction cannot run on its own"
    return None


def enclosing_blocks(code: types.CodeType, offset: int) -> list[str]:
    """The blocks around the instruction at `offset`, innermost first: "with" or "try", read
    from the exception table (a with block's handler starts PUSH_EXC_INFO, WITH_EXCEPT_START;
    a handler's own cleanup, COPY ... RERAISE, is no block)."""
    bc, kinds = decode(code), []
    entry = bc.handler_for(offset)
    while entry is not None:
        index = bc.index_of[entry.target]
        if bc.instructions[index].opname == "PUSH_EXC_INFO":
            if bc.instructions[index + 1].opname != "WITH_EXCEPT_START":
                return [*kinds, "try"]
            kinds.append("with")
        entry = bc.handler_for(entry.target)
    return kinds


def _jump_condition(inst: Any) -> str | None:
    if "_IF_" in inst.opname and inst.opname.startswith("POP_JUMP"):
        return inst.opname.split("_IF_")[1]
    if inst.opname in _KEEP_IF_JUMPING:
        return _KEEP_IF_JUMPING[inst.opname]
    return None


# Python 3.11's `a and b` / `a or b`: jump with the value kept on the stack, or pop it and go on.
_KEEP_IF_JUMPING = {"JUMP_IF_FALSE_OR_POP": "FALSE", "JUMP_IF_TRUE_OR_POP": "TRUE"}


def _next_offset(code: types.CodeType, index: int) -> int:
    return decode(code).instructions[index + 1].offset


def _kw_names_const(code: types.CodeType, index: int) -> int | None:
    # 3.11: KW_NAMES, PRECALL, CALL; 3.12: KW_NAMES, CALL.
    for back in (1, 2):
        if index - back >= 0 and decode(code).instructions[index - back].opname == "KW_NAMES":
            return decode(code).instructions[index - back].arg
    return None


class Continuation:
    """What the runner of a broken frame calls with the live stack and locals: the instruction
    at the break, run natively, then the resume function of the frame from the next one."""

    def __init__(self, fn: types.FunctionType, index: int, inlined: bool, unbound: tuple[str, ...],
                 backend: Callable, label: str, dynamic: bool | None = None, entry_grad: bool = True,
                 record: BreakRecord | None = None) -> None:
        # A break inside a resume function continues the user's code, not the resume function's.
        self.code, shift = rcode.origin(fn.__code__)
        self.f_globals = fn.__globals__
        self.index = decode(self.code).index_of[decode(fn.__code__).instructions[index].offset - shift]
        self.inst = decode(self.code).instructions[self.index]
        self.inlined, self.unbound, self.backend, self.dynamic = inlined, unbound, backend, dynamic
        self.entry_grad = entry_grad  # the broken frame's grad mode on entry
        self.record = record  # an inlined break, recorded here if its callee cannot be compiled
        self.label = label.split(" (resumed at line")[0]  # a resume function's own breaks resume the user's frame
        self._step: Callable | None = None

    def __call__(self, stack: list, locals_: list, cells: list) -> Any:
        """`locals_`: the frame's locals in `co_varnames` order (None where unbound); `cells`:
        its cell objects, in `resume_code.cell_names` order."""
        stack, offset = self._run_instruction(stack)
        nulls = tuple(v is rcode.NULL_SLOT for v in stack)
        live = self._live(offset)
        values = dict(zip(self.code.co_varnames, locals_))
        # Inside a grad-mode block, the resume function is called in the mode outside it and
        # enters the block's mode itself: its graph then switches modes inside, as eager's
        # does (the AOT layer decides on training from the mode it is called in).
        inner = torch.is_grad_enabled()
        enter_grad = None
        if inner != self.entry_grad:
            torch._C._set_grad_enabled(self.entry_grad)
            enter_grad = inner
        resume = self._resume(offset, nulls, live, enter_grad)
        return resume(*rcode.resume_arguments(self.code, live, values, cells, stack))

    def _live(self, offset: int) -> tuple[str, ...]:
        live = rcode.live_locals(self.code, offset)
        cells = rcode.cell_names(self.code)  # (passed as cells, never as values)
        return tuple(n for n in self.code.co_varnames if n in live and n not in self.unbound and n not in cells)

    # --- the instruction at the break ---------------------------------------------------------

    def _run_instruction(self, stack: list) -> tuple[list, int]:
        inst, nxt = self.inst, _next_offset(self.code, self.index)
        condition = _jump_condition(inst)
        if condition is not None:
            value = stack.pop()
            jumps = _JUMPS[condition](value)
            if jumps and inst.opname in _KEEP_IF_JUMPING:
                stack.append(value)
            return stack, inst.argval if jumps else nxt
        if self.inlined and inst.opname in ("CALL", "CALL_KW", "CALL_FUNCTION_EX"):
            return self._call_compiled(stack), nxt
        count = _operands(inst)
        operands = stack[len(stack) - count:]
        del stack[len(stack) - count:]
        return stack + list(self._step_function(operands)(*operands)), nxt

    def _step_function(self, operands: list) -> Callable:
        if self._step is None:
            nulls = tuple(v is rcode.NULL_SLOT for v in operands)
            code = rcode.step_code(self.code, self.inst.offset, nulls, _kw_names_const(self.code, self.index))
            self._step = rcode.function_of(code, self.f_globals)
        return self._step

    def _call_compiled(self, stack: list) -> list:
        """The call at the break with its callee compiled as a frame of its own."""
        inst = self.inst
        if inst.opname in ("CALL", "CALL_KW"):
            if inst.opname == "CALL_KW":
                names = stack.pop()
            else:
                const = _kw_names_const(self.code, self.index)
                names = self.code.co_consts[const] if const is not None else ()
            args = stack[len(stack) - inst.arg:]
            del stack[len(stack) - inst.arg:]
            first, second = stack[-2], stack[-1]
            del stack[-2:]
            if NULL_ABOVE_CALLABLE:  # 3.13: callable, then NULL or self
                fn, args = (first, args) if second is rcode.NULL_SLOT else (first, [second, *args])
            else:  # 3.11/3.12: NULL then callable, or method then self
                fn, args = (second, args) if first is rcode.NULL_SLOT else (first, [second, *args])
            kwargs = dict(zip(names, args[len(args) - len(names):])) if names else {}
            args = args[: len(args) - len(names)]
        else:
            kwargs = stack.pop() if inst.arg & 1 else {}
            args = stack.pop()
            if NULL_ABOVE_CALLABLE:
                stack.pop()  # the NULL
            fn = stack.pop()
            if not NULL_ABOVE_CALLABLE and stack and stack[-1] is rcode.NULL_SLOT:
                stack.pop()
        callee = compiled_callee(fn, self.backend, self.dynamic)
        hooks_eager = getattr(callee, "func", None) is _call_with_forward
        if (callee is fn or hooks_eager) and self.record is not None:
            # The callee (or the module's hooks, where the break may be) runs eagerly: the break
            # inside it has no frame of its own to record it.
            how = ("the module's hooks run eagerly, its forward compiled as a frame of its own" if hooks_eager else
                   "the call runs eagerly (its callee is not a Python function, or sets its own forward)")
            record_break(dataclasses.replace(self.record, resumed=hooks_eager, explanation=f"{self.record.explanation}; {how}"))
            self.record = None
        stack.append(callee(*args, **kwargs))
        return stack

    # --- the rest of the frame ------------------------------------------------------------------

    def _resume(self, offset: int, nulls: tuple[bool, ...], live: tuple[str, ...], enter_grad: bool | None) -> Any:
        from kiln.capture.cache import FrameCache  # cache.py imports frame.py, which imports this module

        # One resume function per place, shared by every break that resumes there: a loop's
        # iterations enter the same function (and recompile when what they pass differs).
        resumes = _RESUMES.setdefault(self.code, {})
        key = (offset, nulls, live, enter_grad, id(self.f_globals), self.backend, self.dynamic)
        cache = resumes.get(key)
        if cache is None:
            code = rcode.resume_code(self.code, offset, nulls, live, enter_grad)
            fn = rcode.function_of(code, self.f_globals)
            line = decode(self.code).line_of(decode(self.code).index_of[offset])
            cache = resumes[key] = FrameCache(fn, _positional, fn, self.backend, False, f"{self.label} (resumed at line {line})", None,
                                              self.dynamic)
        return cache


_RESUMES: "weakref.WeakKeyDictionary[types.CodeType, dict[tuple, Any]]" = weakref.WeakKeyDictionary()


def _positional(*args: Any) -> tuple:
    return args


_CALLEES: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def compiled_callee(fn: Any, backend: Callable, dynamic: bool | None = None) -> Callable:
    """`fn` (a Python function, bound method or nn.Module) compiled by kiln as a frame of its own
    (a module's forward; its hooks, if any, run by nn.Module's call around it); anything else as it is."""
    from kiln.capture.cache import FrameCache  # cache.py imports frame.py, which imports this module

    target, bound = fn, None
    hooked = None
    if isinstance(fn, nn.Module):
        if "forward" in fn.__dict__:  # (a forward set on the instance: not the class's to compile)
            return fn
        if has_hooks(fn):
            hooked = fn
        target, bound = type(fn).forward, fn
    elif isinstance(fn, types.MethodType):
        target, bound = fn.__func__, fn.__self__
    if not isinstance(target, types.FunctionType) or runs_eagerly(target.__module__ or ""):
        return fn
    key = bound if bound is not None else target
    try:
        per_key = _CALLEES.setdefault(key, {})
    except TypeError:  # not weak-referenceable: compile without caching the compiled form
        per_key = {}
    cache = per_key.get((target, id(backend), dynamic))
    if cache is None:
        binder = make_binder(target)
        eager: Callable = target
        if bound is not None:
            binder, eager = functools.partial(binder, bound), functools.partial(target, bound)
        cache = per_key[(target, id(backend), dynamic)] = FrameCache(target, binder, eager, backend, False, target.__qualname__, None, dynamic)
    return cache if hooked is None else functools.partial(_call_with_forward, hooked, cache)


def _call_with_forward(module: nn.Module, forward: Callable, *args: Any, **kwargs: Any) -> Any:
    """`module(*args, **kwargs)` with its hooks run by nn.Module's own call as always, and `forward`
    (the module's forward compiled as a frame of its own) in place of the class's for this call."""
    module.__dict__["forward"] = forward  # (past nn.Module.__setattr__: no attribute of the module's changes)
    try:
        return module(*args, **kwargs)
    finally:
        module.__dict__.pop("forward", None)


def has_hooks(module: nn.Module) -> bool:
    """Whether calling `module` runs hooks (nn.Module.__call__ runs them outside a compiled forward)."""
    own = (module._forward_hooks, module._forward_pre_hooks, module._backward_hooks, module._backward_pre_hooks)
    shared = (module_mod._global_forward_hooks, module_mod._global_forward_pre_hooks, module_mod._global_backward_hooks,
              module_mod._global_backward_pre_hooks)
    return any(own) or any(shared)


def settle_state(tx: Any, breaking: Unsupported, entry_grad: bool, entry_autocast: tuple) -> None:
    """At the break: end the graph in the grad mode and autocast state it started in, where the
    grad-mode and CPU autocast blocks the runner enters again explain the difference; raise
    `breaking` where nothing does."""
    exits = [v.obj for v in tx.stack if isinstance(v, BoundBuiltinMethod) and v.name == "__exit__"]
    grad_exits = [e for e in exits if isinstance(e, GradModeVariable)]
    autocast_exits = [e for e in exits if getattr(e, "block_state", lambda: None)() is not None]
    withs = enclosing_blocks(tx.code, tx.instructions[tx.ip].offset).count("with")
    expected = grad_exits[-1].enabled if grad_exits else entry_grad
    why = None
    if withs != len(grad_exits) + len(autocast_exits):
        why = "the break is inside a with block other than grad mode or CPU autocast"
    else:
        for block in reversed(autocast_exits):  # innermost first: the graph leaves them
            block.call_method(tx, "__exit__", [], {})
        if autocast_state() != entry_autocast or torch.is_grad_enabled() != expected and grad_exits:
            why = "grad mode or autocast was switched there outside a with block"
    if why is not None:
        breaking.explanation += f"; kiln could not resume after it ({why})"
        raise breaking
    if torch.is_grad_enabled() != entry_grad and grad_exits:
        tx.set_grad_mode(entry_grad)
    # (else grad mode was switched by a call, `torch.set_grad_enabled(False)`, outside any block:
    # the graph ends in its entry mode all the same, and the runner switches to the traced mode
    # after it, as for a frame that returns in another mode: frame.py)
