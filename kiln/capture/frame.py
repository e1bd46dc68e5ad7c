"""Capturing one call: interpret the function's bytecode, build the graph, compile it, and
return the cache entry (guards + runner) for calls like it.
"""

from __future__ import annotations

import sys
import time
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from kiln.capture import dump, module_watch
from kiln.capture.guards import GLOBAL_STATE_READERS, CompiledGuards, Guard
from kiln.capture.interpreter import Translator
from kiln.capture.output_graph import OutputGraph
from kiln.capture.reconstruct import Reconstructor, build_runner
from kiln.capture.sources import ClosureSource, ConstSource, LocalSource
from kiln.capture.variables.builder import wrap
from kiln.capture.variables.functions import RealCellVariable


@dataclass
class Entry:
    """One compiled variant of a frame: valid while `guards.check(L)` holds."""

    guards: CompiledGuards
    run: Callable[[tuple], Any]
    graph: torch.fx.GraphModule | None
    runner_source: str
    capture_seconds: float
    stats: dict[str, int] = field(default_factory=dict)


def argument_names(code: types.CodeType) -> list[str]:
    """The frame's parameters in binding order: positional, keyword-only, *args, **kwargs."""
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
    return list(code.co_varnames[:count])


def capture(fn: types.FunctionType, L: tuple, backend: Callable, label: str) -> Entry:
    """Interpret `fn` on the bound arguments `L`; raises Unsupported or UserRaise when it cannot."""
    start = time.perf_counter()
    output = OutputGraph(L)
    for item, reader in GLOBAL_STATE_READERS.items():
        output.guards.add(Guard("GLOBAL_STATE", None, reader(), item))
    code = fn.__code__
    fn_source = ConstSource(fn, fn.__qualname__)
    grad_mode = torch.is_grad_enabled()
    tx = Translator(code, fn.__globals__, output, {},
                    {name: RealCellVariable(cell, ClosureSource(fn_source, i)) for i, (name, cell) in enumerate(zip(code.co_freevars, fn.__closure__ or ()))})
    recursion_limit = sys.getrecursionlimit()
    # Each inlined call costs the interpreter several Python frames; deep models need more.
    sys.setrecursionlimit(max(recursion_limit, 20000))
    try:
        for index, name in enumerate(argument_names(code)):
            tx.locals[name] = wrap(tx, L[index], LocalSource(name, index))
        result = tx.run()
    finally:
        sys.setrecursionlimit(recursion_limit)
        torch._C._set_grad_enabled(grad_mode)
        for kind, ctx in reversed(output.pending_restores):
            torch.amp.autocast_mode._exit_autocast(ctx)
    if module_watch.STATE.watched:
        output.guards.add(Guard("MODULE_STRUCTURE", None, module_watch.STATE.version))
    rc = Reconstructor()
    side_effects = output.side_effects.replay_lines(rc)
    result_expr = rc.expr(result)
    input_exprs = [source.expr(rc.ns) for source, _, _ in output.inputs]
    compiled = None
    gm = output.graph_module(rc.outputs) if rc.outputs or output.op_count else None
    guards = output.guards.compile()
    folder = dump.captured(label, gm, output.guards.describe(), guards.source_code)
    if gm is not None:
        example_inputs = [tensor for _, _, tensor in output.inputs]
        compiled = backend(gm, example_inputs)
    run, runner_source = build_runner(rc, input_exprs, compiled, side_effects, result_expr)
    dump.runner(folder, runner_source)
    seconds = time.perf_counter() - start
    stats = {"ops": output.op_count, "inputs": len(output.inputs), "attrs": len(output.attrs), "guards": len(guards.guards)}
    return Entry(guards, run, gm, runner_source, seconds, stats)
