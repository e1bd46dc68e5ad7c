"""Capturing one call: interpret the function's bytecode, build the graph, compile it, and
return the cache entry (guards + runner) for calls like it.
"""

from __future__ import annotations

import contextlib
import sys
import time
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch._guards

from kiln import compile_time, config
from kiln.capture import dump, module_watch, reentry, resume_at_break, resume_code
from kiln.capture.binder import argument_names
from kiln.capture.break_records import BreakRecord, Unsupported, unsupported
from kiln.capture.dynamic import DynamicPolicy
from kiln.capture.guards import ALWAYS_GUARDED, GLOBAL_STATE_READERS, CompiledGuards, Guard
from kiln.capture.interpreter import Translator
from kiln.capture.output_graph import OutputGraph
from kiln.capture.reconstruct import Reconstructor, build_runner
from kiln.capture.sources import AttrSource, ClosureSource, ConstSource, LocalSource, read_once
from kiln.capture.variables.base import NullVariable
from kiln.capture.variables.builder import wrap  # importing the builder installs it behind `wrap` (variables/wrapping.py)
from kiln.capture.variables.functions import real_cell


@dataclass
class Entry:
    """One compiled variant of a frame: valid while `guards.check(L)` holds."""

    guards: CompiledGuards
    run: Callable[[tuple], Any]
    graph: torch.fx.GraphModule | None
    runner_source: str
    capture_seconds: float
    stats: dict[str, int] = field(default_factory=dict)
    graph_break: BreakRecord | None = None  # where the graph ended, when a resume function goes on
    # Whether its guards, once they held after one run of it, hold on later calls of a settled run
    # that change only its arguments (kiln/settled.py): one graph to the frame's end, and its
    # changes to objects all stores of constants, none beside them.
    settles: bool = False
    # Whether its frozen program may stamp its weights once a settled run: one graph to the frame's
    # end, none of its changes able to rebind a module's tensor (a dynamic cache's step: it stores
    # its grown layers, so it does not settle, but it leaves the model's weights alone).
    stamps_once: bool = False
    argument_guards: Any = None  # its guards by the arguments they read (settled_entry.py), made when first needed


def capture(fn: types.FunctionType, L: tuple, backend: Callable, label: str, allow_breaks: bool = True,
            dynamic: DynamicPolicy | None = None) -> Entry:
    """Interpret `fn` on the bound arguments `L`; raises Unsupported or UserRaise when it cannot.

    Where the interpreter fails at an instruction of `fn` and `allow_breaks`, the frame is
    interpreted again up to that instruction and the entry's graph ends there: a graph break
    (kiln/capture/resume_at_break.py). The time spent, outside the backend's, is the compile-time
    log's "capture" (kiln/compile_time.py)."""
    with compile_time.stage(f"frame {label}", self_name="capture"):
        return _capture_or_break(fn, L, backend, label, allow_breaks, dynamic or DynamicPolicy())


def _capture_or_break(fn: types.FunctionType, L: tuple, backend: Callable, label: str, allow_breaks: bool,
                      dynamic: DynamicPolicy) -> Entry:
    try:
        return _capture(fn, L, backend, label, None, dynamic, one_graph=not allow_breaks)
    except Unsupported as error:
        if not allow_breaks:
            raise
        why = resume_at_break.why_not_resumable(fn.__code__, error)
        if why is not None:
            error.explanation += f"; kiln could not resume after it ({why})"
            raise
        return _capture(fn, L, backend, label, error, dynamic)


def _no_generator_left_in_a_block(output: Any) -> None:
    """A generator the frame leaves suspended inside a try or with block has cleanup (finally,
    __exit__) that Python runs when it frees the generator (at the frame's end, if nothing kept it:
    a GeneratorExit at the yield); the trace would skip it, so such a frame runs in Python."""
    for generator in output.generators:
        where = generator.suspended_at()
        if where is not None and resume_at_break.enclosing_blocks(*where):
            raise unsupported("unsupported_generator", "a generator left suspended inside a try or with block: Python runs "
                              "its cleanup (finally, __exit__) when it frees the generator",
                              "exhaust the generator, or close() it, inside the compiled function")


def _capture(fn: types.FunctionType, L: tuple, backend: Callable, label: str, breaking: Unsupported | None,
             dynamic: DynamicPolicy, one_graph: bool = False) -> Entry:
    start = time.perf_counter()
    output = OutputGraph(L)
    # A frame that must be one graph (fullgraph=True) keeps tensor.item() in it, as Dynamo does:
    # the alternative is an error.
    output.scalar_outputs = config.capture.scalar_outputs or one_graph
    output.dynamic_dims = dynamic.dims
    output.dynamic_int = dynamic.int_is_dynamic
    for item in ALWAYS_GUARDED:
        output.guards.add(Guard("GLOBAL_STATE", None, GLOBAL_STATE_READERS[item](), item))
    code = fn.__code__
    fn_source = ConstSource(fn, fn.__qualname__)
    grad_mode = torch.is_grad_enabled()
    entry_autocast = reentry.autocast_state()
    tx = Translator(code, fn.__globals__, output, {}, {})
    for i, (name, cell) in enumerate(zip(code.co_freevars, fn.__closure__ or ())):
        tx.cells[name] = real_cell(tx, cell, ClosureSource(fn_source, i))
    if breaking is not None:
        tx.stop_at = breaking.at
    recursion_limit = output.user_recursion_limit = sys.getrecursionlimit()  # (what sys.getrecursionlimit() reads in the trace)
    # Each inlined call costs the interpreter several Python frames; deep models need more.
    sys.setrecursionlimit(max(recursion_limit, 20000))
    try:
        # A resume function's cell parameters are the broken frame's cells (resume_code.py).
        cells = set(code.co_cellvars) if resume_code.origin(code)[0] is not code else set()
        for index, name in enumerate(argument_names(code)):
            if name in cells:
                source = LocalSource(name, index)
                tx.cells[name] = real_cell(tx, L[index], AttrSource(source, "cell_contents"), source)
            else:
                tx.locals[name] = wrap(tx, L[index], LocalSource(name, index))
        result = tx.run()
        if breaking is None:
            _no_generator_left_in_a_block(output)
        if breaking is not None:
            if not tx.stopped:
                raise breaking
            resume_at_break.settle_state(tx, breaking, grad_mode, entry_autocast)
        final_grad_mode, final_autocast = torch.is_grad_enabled(), reentry.autocast_state()
    finally:
        sys.setrecursionlimit(recursion_limit)
        torch._C._set_grad_enabled(grad_mode)
        for kind, ctx in reversed(output.pending_restores):
            torch.amp.autocast_mode._exit_autocast(ctx)
        if reentry.autocast_state() != entry_autocast:  # a resume function left a re-entered block
            reentry.set_autocast_state(entry_autocast)
    snapshot = module_watch.Snapshot(module_watch.STATE.version)
    if module_watch.STATE.watched:
        output.guards.add(Guard("MODULE_STRUCTURE", None, snapshot))
    rc = Reconstructor(output.size_symbols())
    side_effects = output.side_effects.replay_lines(rc)
    settles = breaking is None and output.side_effects.constant_stores_only()
    stamps_once = breaking is None and output.side_effects.leaves_modules()
    replayed = len(side_effects)
    if output.side_effects.module_writes_keep_reads():
        # Its own writes (HF's Swin sets `self.shift_size` on every call) must not fail its own guard.
        side_effects.append(f"{rc.ns.bind(snapshot, 'S')}.version = {rc.ns.bind(module_watch.STATE, 'W')}.version")
    # A resume function that leaves the block it started in: compiled graphs do not switch
    # global state when they run, so the runner does.
    if final_grad_mode != grad_mode:
        side_effects.append(f"{rc.ns.bind(torch._C._set_grad_enabled, 'F')}({final_grad_mode!r})")
    if final_autocast != entry_autocast:
        side_effects.append(f"{rc.ns.bind(reentry.set_autocast_state, 'F')}({rc.ns.bind(final_autocast, 'K')})")
    finish = None
    if breaking is None:
        result_expr = rc.expr(result)
    else:
        result_expr, finish = _break_state(tx, rc, fn, breaking, backend, label, dynamic.mode, grad_mode)
    input_reads, input_exprs = read_once([source for source, _, _ in output.inputs], rc.ns)
    compiled = None
    gm = output.graph_module(rc.outputs) if rc.outputs or output.op_count else None
    folder = dump.captured(label, gm)
    aliasing = output.aliasing_guard()  # (before the backend: it may refuse the inputs' aliasing)
    if gm is not None:
        # (a symbolic int is given as its SymInt, as Dynamo gives it: a backend tracing the graph
        # again must not specialize it to the value it had at capture)
        example_inputs = [node.meta["example_value"] if isinstance(value, int) else value for _, node, value in output.inputs]
        with _symbols_known_to(output):
            compiled = backend(gm, example_inputs)
    for guard in output.shape_guards() + aliasing:  # after the backend: its tracing may add some
        output.guards.add(guard)
    guards = output.guards.compile()
    dump.guards(folder, label, output.guards.describe(), guards.source_code)
    run, runner_source = build_runner(rc, input_reads, input_exprs, compiled, side_effects, result_expr, finish)
    dump.runner(folder, runner_source)
    seconds = time.perf_counter() - start
    stats = {"ops": output.op_count, "inputs": len(output.inputs), "attrs": len(output.attrs), "guards": len(guards.guards)}
    record = breaking.record(resumed=True) if breaking is not None and not breaking.inlined else None
    only_replayed = len(side_effects) == replayed  # (no grad mode, autocast or module version set beside them)
    return Entry(guards, run, gm, runner_source, seconds, stats, record, settles and only_replayed,
                 stamps_once and only_replayed)


def _symbols_known_to(output: OutputGraph) -> Any:
    """A graph with symbolic inputs goes to the backend with its fake mode as the tracing context's,
    as Dynamo hands it over: a backend tracing it again (Inductor, AOTAutograd) reads the symbols'
    ranges from that mode's shape environment rather than making a mode that has never seen them."""
    if not output.symbolic_inputs:
        return contextlib.nullcontext()
    return torch._guards.tracing(torch._guards.TracingContext(output.fake_mode))


def _break_state(tx: Translator, rc: Reconstructor, fn: types.FunctionType, breaking: Unsupported, backend: Callable,
                 label: str, dynamic_mode: bool | None, entry_grad: bool) -> tuple[str, str]:
    """The runner's expression of the live stack and locals at the break, and the continuation
    that takes them. A value that cannot be rebuilt makes the frame run eagerly."""
    null = rc.ns.bind(resume_code.NULL_SLOT, "NULL")
    try:
        stack = [null if isinstance(v, NullVariable) else rc.expr(v) for v in tx.stack]
        user_code = resume_code.origin(fn.__code__)[0]
        names = user_code.co_varnames
        cells = [rc.cell(tx.cells.get(n)) for n in resume_code.cell_names(user_code)]
        local_values = ["None" if n not in tx.locals else rc.expr(tx.locals[n]) for n in names]
    except Unsupported as error:
        breaking.explanation += f"; kiln could not resume after it ({error.explanation})"
        raise breaking from None
    unbound = tuple(n for n in names if n not in tx.locals)
    continuation = resume_at_break.Continuation(fn, breaking.at[0], breaking.inlined, unbound, backend, label, dynamic_mode, entry_grad,
                                                breaking.record(resumed=True) if breaking.inlined else None)
    state = f"([{', '.join(stack)}], [{', '.join(local_values)}], [{', '.join(cells)}])"
    return state, rc.ns.bind(continuation, "resume")
