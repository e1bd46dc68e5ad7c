"""kiln's backends for `torch.compile(model, backend=...)`: Dynamo captures, kiln does the rest.

Registered on `import kiln` and through the `torch_dynamo_backends` entry point (pyproject.toml),
so `torch.compile(model, backend="kiln_aot_eager")` works without importing kiln first.

- `kiln`: kiln's AOT layer, then kiln's backend: loop-IR lowering and C++/OpenMP kernels, ATen
  externs for what is not lowered yet.
- `kiln_aot_eager`: kiln's AOT layer, then the ATen graphs run as they are (a debug backend that
  separates AOT problems from backend problems).

A graph either fails to compile as a whole and runs eagerly (recorded in
`kiln.runtime.fallback.FALLBACKS`), or runs entirely as compiled.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence

from torch import fx

from kiln.runtime.fallback import record_fallback

_graph_ids = itertools.count()


def run_as_is(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """The trivial graph compiler: run the ATen graph with PyTorch's kernels."""
    return gm


def _with_aot(name: str, gm: fx.GraphModule, example_inputs: Sequence[Any], compile_graph: Callable, cache: bool = False) -> Callable:
    from kiln import aot

    label = f"dynamo_{next(_graph_ids)}"
    try:
        return aot.compile(gm, example_inputs, compile_graph, options=aot.AotOptions(label=label, cache=cache))
    except Exception as error:  # noqa: BLE001 - never break the user's program; the fallback is recorded
        record_fallback(name, label, error)
        return gm.forward


def kiln_aot_eager(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """Dynamo backend: kiln's AOT layer over the ATen graph run as is."""
    return _with_aot("kiln_aot_eager", gm, example_inputs, run_as_is)


def kiln(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """Dynamo backend: kiln's AOT layer and kiln's C++ backend."""
    from kiln.codegen.wrapper import compile_cpp

    return _with_aot("kiln", gm, example_inputs, compile_cpp, cache=True)


BACKENDS = {"kiln": kiln, "kiln_aot_eager": kiln_aot_eager}


def register() -> None:
    """Make kiln's backends known to torch.compile by name (idempotent)."""
    from torch._dynamo import list_backends, register_backend

    known = set(list_backends(exclude_tags=()))
    for name, backend in BACKENDS.items():
        if name not in known:
            register_backend(name=name)(backend)
