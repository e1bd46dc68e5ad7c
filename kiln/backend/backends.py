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

import torch
from torch import fx

from kiln import aot, compile_time, config
from kiln.backend.driver import Backend, prepare_codegen
from kiln.externs.prepacked import fp32_gemm
from kiln.passes import pipeline
from kiln.runtime.cuda_graphs import cuda_graphed, cuda_graphed_training
from kiln.runtime.fallback import record_fallback

_graph_ids = itertools.count()


def run_as_is(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """The trivial graph compiler: run the ATen graph with PyTorch's kernels."""
    return gm


def with_aot(name: str, gm: fx.GraphModule, example_inputs: Sequence[Any], compile_graph: Callable, cache: bool = False,
             wrap_inference: Callable | None = None, wrap_training: Callable | None = None) -> Callable:
    """`gm` through the AOT layer and `compile_graph`; on any error, `gm` itself, recorded."""
    label = f"graph_{next(_graph_ids)}"
    with compile_time.stage(label, self_name="backend entry"):
        try:
            options = aot.AotOptions(label=label, cache=cache, wrap_inference=wrap_inference, wrap_training=wrap_training)
            return aot.compile(gm, example_inputs, compile_graph, options=options)
        except Exception as error:  # noqa: BLE001 - never break the user's program; the fallback is recorded
            record_fallback(name, label, error)
            return gm.forward


def kiln_aot_eager(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """kiln's AOT layer over the ATen graph run as is."""
    return with_aot("kiln_aot_eager", gm, example_inputs, run_as_is)


# torch.compile(backend="kiln", mode=...) passes its mode here: what each one sets.
MODE_SETTINGS = {
    "default": {},
    "reduce-overhead": {"backend.cuda_graphs": True},
    "max-autotune": {"backend.autotune": "max-autotune", "backend.cuda_graphs": True},
    "max-autotune-no-cudagraphs": {"backend.autotune": "max-autotune"},
}
# ... and its options={...}: kiln's backend settings by their short names.
OPTIONS = {"cuda_graphs": "backend.cuda_graphs", "autotune": "backend.autotune", "freezing": "backend.freezing",
           "codegen": "backend.codegen", "triton_gemm": "backend.triton_gemm", "fp32_gemm": "backend.fp32_gemm"}


def settings_for(mode: str | None, options: dict | None) -> dict[str, Any]:
    """The config patch for a torch.compile `mode` and `options`, checked."""
    if mode is not None and mode not in MODE_SETTINGS:
        raise ValueError(f"kiln backend: mode must be one of {', '.join(map(repr, MODE_SETTINGS))}; got {mode!r}")
    patch = dict(MODE_SETTINGS.get(mode or "default"))
    for key, value in (options or {}).items():
        if key not in OPTIONS:
            raise ValueError(f"kiln backend: unknown option {key!r}; accepted options: {', '.join(OPTIONS)}")
        patch[OPTIONS[key]] = value
    return patch


def kiln(gm: fx.GraphModule, example_inputs: Sequence[Any], mode: str | None = None, options: dict | None = None) -> Callable:
    """kiln's AOT layer and kiln's backend driver; `mode` and `options` as torch.compile passes them
    (`mode="reduce-overhead"`: CUDA graphs; `options={"cuda_graphs": True, "autotune": ...}`)."""
    with config.patch(settings_for(mode, options)):
        # A name in backend.disabled_passes that is no pass, or a backend.fp32_gemm that is neither
        # fp32 nor bf16: an error here, before anything is compiled.
        pipeline.rewrites()
        fp32_gemm()
        on_gpu = any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs)
        if on_gpu:
            prepare_codegen("cuda")  # (Triton's compile workers start importing beside the AOT layer)
        graphed = config.backend.cuda_graphs and on_gpu
        return with_aot("kiln", gm, example_inputs, Backend(), cache=True, wrap_inference=cuda_graphed if graphed else None,
                        wrap_training=cuda_graphed_training if graphed else None)


BACKENDS = {"kiln": kiln, "kiln_aot_eager": kiln_aot_eager}
