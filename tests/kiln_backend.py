"""Shared by the backend's tests: compile a function through kiln's AOT layer and C++ backend and
keep the CompiledGraph, with a private compile cache per test."""

from __future__ import annotations

import pytest
import torch
from torch import fx

import kiln
from kiln import aot
from kiln.backend import Backend


@pytest.fixture(autouse=True)
def private_cache(tmp_path):
    """Import into a test module to give each of its tests an empty compile cache."""
    with kiln.config.patch({"cache.dir": str(tmp_path / "cache")}):
        yield tmp_path / "cache"


def compiled(fn, *inputs, freezing=False, autotune="off"):
    """(outputs, CompiledGraph of the first graph) of `fn` (a function or module) compiled by kiln.

    Freezing is off unless asked for, so a test of one backend feature sees the module's
    parameters as graph inputs; with `freezing=True` the program is a FrozenProgram whose
    `runtime` is the CompiledGraph."""
    programs = []

    def compile_graph(gm, example_inputs):
        programs.append(Backend()(gm, example_inputs))
        return programs[-1]

    with torch.no_grad(), kiln.config.patch({"backend.freezing": freezing, "backend.autotune": autotune}):
        out = aot.compile(fx.symbolic_trace(fn), list(inputs), compile_graph)(*inputs)
    return out, programs[0]
