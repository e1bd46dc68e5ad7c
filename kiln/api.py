"""`kiln.compile`: the door where everything, capture included, is kiln's.

The door checks the user's arguments, turns a backend name into the backend (kiln/backend/), and
hands the function or module to kiln's capture (kiln/capture/api.py), which calls the backend
with each graph it captures.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any, Callable

import torch
from torch import fx

from kiln import config
from kiln.backend import kiln as kiln_backend, kiln_aot_eager
from kiln.backend.backends import settings_for
from kiln.capture import bytecode
from kiln.capture.api import capture, reset  # noqa: F401  (reset: kiln.reset)
from kiln.externs.prepacked import FP32_GEMM_MODES
from kiln.runtime import data_watch

BACKEND_NAMES = ("kiln", "aot_eager", "eager")
MODES = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
OPTIONS = ("recompile_limit", "trace", "fp32_gemm")


def _eager_backend(gm: fx.GraphModule, example_inputs: list) -> Callable:
    return gm.forward


def resolve_backend(backend: Any) -> Callable:
    """The backend callable for `backend`: a name from BACKEND_NAMES, or a callable as it is."""
    if callable(backend):
        return backend
    named = {"eager": _eager_backend, "aot_eager": kiln_aot_eager, "kiln": kiln_backend}
    if backend in named:
        return named[backend]
    raise ValueError(f"kiln.compile: backend must be one of {', '.join(map(repr, BACKEND_NAMES))} or a callable "
                     f"(gm, example_inputs) -> callable; got {backend!r}")


def _check_arguments(fullgraph: Any, dynamic: Any, mode: Any, options: Any) -> dict:
    if not isinstance(fullgraph, bool):
        raise TypeError(f"kiln.compile: fullgraph must be True or False, got {fullgraph!r}")
    if dynamic not in (None, False, True):
        raise ValueError(f"kiln.compile: dynamic must be None, False or True, got {dynamic!r}")
    if mode not in MODES:
        raise ValueError(f"kiln.compile: mode must be one of None, 'default', 'reduce-overhead', 'max-autotune', "
                         f"'max-autotune-no-cudagraphs'; got {mode!r}")
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise TypeError(f"kiln.compile: options must be a dict or None, got {type(options).__name__}")
    unknown = [k for k in options if k not in OPTIONS]
    if unknown:
        raise ValueError(f"kiln.compile: unknown option {unknown[0]!r}; accepted options: {', '.join(OPTIONS)}")
    limit = options.get("recompile_limit")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ValueError(f"kiln.compile: options['recompile_limit'] must be a positive int, got {limit!r}")
    trace = options.get("trace")
    if trace is not None and not isinstance(trace, (str, os.PathLike)):
        raise TypeError(f"kiln.compile: options['trace'] must be a folder (str or path) for the HTML compile report, got {trace!r}")
    fp32_gemm = options.get("fp32_gemm")
    if fp32_gemm is not None and fp32_gemm not in FP32_GEMM_MODES:
        raise ValueError(f"kiln.compile: options['fp32_gemm'] must be one of {', '.join(map(repr, FP32_GEMM_MODES))} "
                         f"(bf16: float32 products with frozen weights in bfloat16 fast math, docs/gemm.md); "
                         f"got {fp32_gemm!r}")
    return options


def _with_mode(backend: Callable, mode: str) -> Callable:
    """`backend` compiling under the settings of `mode` (kiln/backend/backends.py MODE_SETTINGS:
    CUDA graphs for reduce-overhead and max-autotune, the wider GEMM and convolution search for
    the max-autotune modes)."""
    settings = settings_for(mode, None)

    @functools.wraps(backend)
    def compile_graph(gm: fx.GraphModule, example_inputs: list) -> Callable:
        with config.patch(settings):
            return backend(gm, example_inputs)

    return compile_graph


def compile(fn_or_module: Any = None, *, backend: Any = "kiln", fullgraph: bool = False, dynamic: bool | None = None,
            mode: str | None = None, options: dict | None = None) -> Any:
    """Compile a function or nn.Module with kiln's own bytecode capture and the chosen backend.

    Example::

        model = kiln.compile(model)                      # kiln backend
        f = kiln.compile(f, backend="eager")             # capture only (debugging)
        model = kiln.compile(model, options={"fp32_gemm": "bf16"})  # float32 GEMMs on bfloat16 units

        @kiln.compile(fullgraph=True)
        def g(x): return x.sin() + 1
    """
    opts = _check_arguments(fullgraph, dynamic, mode, options)
    compiled_backend = resolve_backend(backend)
    if mode not in (None, "default"):
        compiled_backend = _with_mode(compiled_backend, mode)
    if fn_or_module is None:
        return functools.partial(compile, backend=backend, fullgraph=fullgraph, dynamic=dynamic, mode=mode, options=options)
    if bytecode.PY not in bytecode.SUPPORTED_PYTHONS:
        return _unsupported_python(fn_or_module, fullgraph)
    return capture(fn_or_module, compiled_backend, fullgraph, dynamic, opts)


compile.kiln_compile_door = True  # (called inside a capture: the function itself, inlined; capture/variables/torch_fns.py)


def _unsupported_python(fn_or_module: Any, fullgraph: bool) -> Any:
    """On a Python whose bytecode kiln's capture does not model: an error under fullgraph, else
    the function or module itself (it runs eagerly), with a warning that says so and what works."""
    version = ".".join(map(str, bytecode.PY))
    names = [".".join(map(str, v)) for v in bytecode.SUPPORTED_PYTHONS]
    supported = ", ".join(names[:-1]) + " and " + names[-1]
    message = (f"kiln.compile: kiln's bytecode capture supports Python {supported}, not {version}; "
               f"torch.compile(model, backend=\"kiln\") uses Dynamo's capture with kiln's backend")
    if fullgraph:
        raise RuntimeError(message)
    warnings.warn(message + "; this model runs eagerly", RuntimeWarning, stacklevel=3)
    return fn_or_module


def refreeze(model: Any) -> None:
    """Make every compiled graph that froze these weights compute its constants again on its next call.

    kiln sees every change to a frozen weight made through PyTorch — in place (`w.add_`, an optimizer
    step, `load_state_dict`), through `.data` of a parameter, or by rebinding (`w.data = t`,
    `module.weight = nn.Parameter(t)`, `module.to(...)`). Call this after a write it cannot see:
    through NumPy, DLPack or a raw pointer, through `.data` of a buffer, or through a `.data`
    tensor taken before the first compiled call (docs/freezing.md).

    Example::

        np.copyto(model.fc.weight.detach().numpy(), new_weights)
        kiln.refreeze(model)
    """
    if isinstance(model, torch.nn.Module):
        tensors = [*model.parameters(), *model.buffers()]
    elif isinstance(model, torch.Tensor):
        tensors = [model]
    elif isinstance(model, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in model):
        tensors = list(model)
    else:
        raise TypeError(f"kiln.refreeze: model must be an nn.Module, a tensor or a list of tensors, "
                        f"got {type(model).__name__}")
    data_watch.mark_written(tensors)
