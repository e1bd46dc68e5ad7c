"""Graphs with symbolic sizes, compiled once per set of concrete sizes they are called with.

kiln's kernels are generated for static sizes. When Dynamo hands over a graph with symbolic sizes
(after a recompile, or `dynamic=True`), the graph is re-traced at each new set of input sizes into
a static ATen graph and compiled for it; later calls with those sizes reuse it. Each
specialization is logged (`KILN_LOGS=recompiles`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

from kiln import logs


def has_symbolic_sizes(gm: fx.GraphModule, inputs_only: bool = False) -> bool:
    """Whether any size (or stride) in the graph is symbolic; with `inputs_only`, any of its inputs'.

    Inputs' symbolic sizes go away when the graph is traced again at concrete inputs. Sizes that
    an op computes from tensor values (nonzero, unique, boolean masks) stay symbolic however the
    inputs are given."""
    for node in gm.graph.nodes:
        if inputs_only and node.op != "placeholder":
            continue
        val = node.meta.get("val")
        values = val if isinstance(val, (tuple, list)) else [val]
        for v in values:
            if isinstance(v, torch.SymInt):
                return True
            if isinstance(v, torch.Tensor) and any(not isinstance(s, int) for s in (*v.shape, *v.stride())):
                return True
    return False


def _signature(args: Sequence[Any]) -> tuple:
    return tuple((tuple(a.shape), tuple(a.stride()), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)


class Specialized:
    """Calls `compile_static` on `gm` traced at each new set of argument sizes."""

    def __init__(self, gm: fx.GraphModule, compile_static: Callable[[fx.GraphModule, list], Callable]) -> None:
        self.gm, self.compile_static = gm, compile_static
        self.compiled: dict[tuple, Callable] = {}

    def __call__(self, *args: Any) -> Any:
        key = _signature(args)
        compiled = self.compiled.get(key)
        if compiled is None:
            sizes = [tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args]
            logs.log("recompiles", "kiln backend: graph with symbolic sizes specialized to %s", sizes)
            with torch.no_grad():
                static = make_fx(self.gm, tracing_mode="fake")(*args)
            compiled = self.compiled[key] = self.compile_static(static, list(args))
        return compiled(*args)
