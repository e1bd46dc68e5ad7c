"""Running a function through kiln's AOT layer and lowering, by the reference executor and by the
C++ kernels, and checking both against eager."""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import fx

import kiln
from kiln import aot
from kiln.backend import Backend
from kiln.ir.verify import verify_program
from kiln.ir.program import ComputeStep, Program
from kiln.lowering.reference import compile_reference

BACKENDS = {"reference": compile_reference, "cpp": Backend()}


def through_all(backend: str, fn: Callable, *inputs) -> tuple[object, list[Program]]:
    """(fn's result, the Programs of its graphs: forward and, in training, backward) with `backend`
    compiling the graphs."""
    programs = []

    def compile_graph(gm, example_inputs):
        compiled = BACKENDS[backend](gm, example_inputs)
        programs.append(compiled.program)
        return compiled

    # Freezing would cut constants out into a graph of their own: these tests look at one Program.
    with kiln.config.patch({"backend.freezing": False}):
        out = aot.compile(fx.symbolic_trace(fn), list(inputs), compile_graph)(*inputs)
    return out, programs


def through(backend: str, fn: Callable, *inputs) -> tuple[object, Program]:
    """(fn's result, the Program of its one graph) with `backend` compiling the graph."""
    out, (program,) = through_all(backend, fn, *inputs)
    return out, program


def extern_ops(program: Program) -> set:
    return {step.op for step in program.externs}


def check(fn: Callable, *inputs, lowered: Iterable = (), backends: Iterable[str] = BACKENDS, exact: bool = False,
          **tolerance) -> dict[str, Program]:
    """fn through each backend matches eager (NaN where eager has NaN), produced kernels, and left
    none of the `lowered` ATen ops as an extern call. Returns the programs by backend."""
    expected = fn(*inputs)
    if exact:
        tolerance = dict(rtol=0, atol=0)
    programs = {}
    for backend in backends:
        out, program = through(backend, fn, *inputs)
        torch.testing.assert_close(out, expected, equal_nan=True, **tolerance, msg=lambda m: f"{backend}: {m}")
        assert program.kernels, f"{backend}: no kernels"
        verify_program(program)
        left = extern_ops(program) & set(lowered)
        assert not left, f"{backend}: still extern: {left}"
        programs[backend] = program
    return programs
