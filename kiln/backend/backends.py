"""kiln's backends for torch-level graphs: what both doors call with a captured graph.

`kiln.compile` (kiln's own capture) and `torch.compile(backend="kiln")` (Dynamo's capture,
registered in kiln/integrations/dynamo.py) hand a torch-level `fx.GraphModule` and its example
inputs to one of these:

- `kiln`: the AOT layer, then the backend driver (kiln/backend/driver.py), with the AOT graph
  cache across processes.
- `kiln_aot_eager`: the AOT layer, then the ATen graphs run as they are (a debug backend that
  separates AOT problems from backend problems).

A graph either fails to compile as a whole and runs eagerly (recorded in
`kiln.runtime.fallback.FALLBACKS`, logged under `breaks`), or runs entirely as compiled.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Sequence

from torch import fx

from kiln import aot, compile_time
from kiln.backend.driver import Backend
from kiln.runtime.fallback import record_fallback

_graph_ids = itertools.count()


def run_as_is(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """The trivial graph compiler: run the ATen graph with PyTorch's kernels."""
    return gm


def with_aot(name: str, gm: fx.GraphModule, example_inputs: Sequence[Any], compile_graph: Callable, cache: bool = False) -> Callable:
    """`gm` through the AOT layer and `compile_graph`; on any error, `gm` itself, recorded."""
    label = f"graph_{next(_graph_ids)}"
    with compile_time.stage(label, self_name="backend entry"):
        try:
            return aot.compile(gm, example_inputs, compile_graph, options=aot.AotOptions(label=label, cache=cache))
        except Exception as error:  # noqa: BLE001 - never break the user's program; the fallback is recorded
            record_fallback(name, label, error)
            return gm.forward


def kiln_aot_eager(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """kiln's AOT layer over the ATen graph run as is."""
    return with_aot("kiln_aot_eager", gm, example_inputs, run_as_is)


def kiln(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """kiln's AOT layer and kiln's backend driver."""
    return with_aot("kiln", gm, example_inputs, Backend(), cache=True)


BACKENDS = {"kiln": kiln, "kiln_aot_eager": kiln_aot_eager}
