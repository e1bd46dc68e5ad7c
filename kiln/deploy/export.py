"""`kiln.export`: a model compiled ahead of time into a directory that runs without kiln.

    kiln.export(model, (x,), path="out/mlp")
    run = kiln.load("out/mlp")
    (y,) = run(x)

The model is captured whole (fullgraph: a construct that would break the graph is an error naming
the user's file and line), frozen and compiled by kiln's backend with the C++ wrapper, on the
example inputs' sizes. The directory holds:

- `model.so`: the graph's kernels, its C++ wrapper (`kiln_graph_call`) and kiln's runtime
  (kiln/native/src/kiln_runtime.cpp, with kiln's GEMM), one library that needs only libtorch;
- `weights.safetensors`: the frozen constants (and any other tensor the graph reads that is not
  an input), by the names the metadata gives;
- `metadata.json`: the inputs (names, dtypes, shapes), the outputs (`output_0`, ... in the order of
  the model's result, flattened), how the graph's inputs are made from inputs and weights, the
  versions of kiln and torch, the CPU and its ISA, and the digests of the library and the weights.

With `dynamic_shapes` ({input name: {dim: torch.export.Dim("batch", min=2, max=64) or "batch"}}),
those dimensions stay symbolic: the metadata gives each input's shape with symbol names and each
symbol's range (kiln/deploy/symbolic_shapes.py), and the artifact serves every size in it.

Not yet: training, models that mutate their inputs or return views of them, GPUs (docs/limits.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
from pathlib import Path
from typing import Any, Callable

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

import kiln
from kiln import aot, config
from kiln.backend import Backend
from kiln.capture.api import capture
from kiln.capture.dynamic import marks_restored
from kiln.deploy import isa, safetensors, symbolic_shapes
from kiln.native import kernels_unit, libkiln
from kiln.native.build import build_library, machine
from kiln.runtime.compiled_graph import CompiledGraph
from kiln.runtime.frozen import FrozenProgram

FORMAT = 1


class ExportError(RuntimeError):
    """What `kiln.export` cannot put in an artifact, said with the reason."""


def export(model: nn.Module | Callable, args: tuple, kwargs: dict | None = None, *, path: str | Path,
           dynamic_shapes: Any = None) -> Path:
    """Compile `model` for `args` and `kwargs` (example inputs: their sizes are the artifact's,
    except the dimensions `dynamic_shapes` makes symbolic) and write the artifact directory
    `path`; returns it.

    Example::

        kiln.export(model, (), {"input_ids": ids, "attention_mask": mask}, path="bert.kiln")
    """
    if not callable(model):
        raise TypeError(f"kiln.export: model must be an nn.Module or a function, got {type(model).__name__}")
    if not isinstance(args, tuple):
        raise TypeError(f"kiln.export: args must be a tuple of example inputs, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"kiln.export: kwargs must be a dict or None, got {type(kwargs).__name__}")
    kwargs = kwargs or {}
    names, inputs = _named_inputs(args, kwargs)
    declared = _declared_dims(dynamic_shapes, names, inputs)
    recorded: dict[str, Any] = {}
    with marks_restored(inputs):  # the caller's tensors keep their own marks only
        for (k, d) in declared:
            kiln.mark_dynamic(inputs[k], d)
        with config.patch({"backend.freezing": True, "backend.cpp_wrapper": True}), torch.no_grad():
            compiled = capture(model, _recording_backend(recorded), fullgraph=True)
            result = compiled(*args, **kwargs)
    if "aot" not in recorded:
        raise ExportError("kiln.export: the model ran no graph (no tensor operation was captured)")
    plan, weights = _input_plan(recorded, inputs)
    shapes, symbols = symbolic_shapes.shapes_and_ranges(recorded, names, inputs, declared)
    graph = recorded["graph"]
    outputs = _output_indices(result, recorded["outputs"])
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    library = _build(graph)
    _replace(out / "model.so", lambda tmp: shutil.copyfile(library, tmp))
    _replace(out / "weights.safetensors", lambda tmp: safetensors.save(weights, tmp))
    metadata = {
        "format": FORMAT,
        "kiln_version": kiln.__version__, "torch_version": torch.__version__,
        "isa": machine(), "isa_flags": isa.flags(), "cpu": isa.cpu_name(), "arch": platform.machine(),
        "inputs": [{"name": n, "dtype": str(t.dtype).removeprefix("torch."), "shape": shape}
                   for n, t, shape in zip(names, inputs, shapes)],
        "symbols": symbols,
        "outputs": [{"name": f"output_{k}", "graph_output": i} for k, i in enumerate(outputs)],
        "graph_inputs": plan,
        "graph_outputs": graph.artifact.num_outputs,
        "weights": {n: {"stride": list(t.stride()), "storage_offset": 0} for n, t in weights.items()},
        "entry": "kiln_graph_call",
        "digests": {"model.so": digest(out / "model.so"), "weights.safetensors": digest(out / "weights.safetensors")},
    }
    _replace(out / "metadata.json", lambda tmp: tmp.write_text(json.dumps(metadata, indent=1)))
    return out


def _replace(path: Path, write: Callable[[Path], Any]) -> None:
    """Write a file of the artifact beside it, then put it in its place: a process that has the
    previous export loaded (its library opened, its weights mapped) keeps the old file's pages
    rather than reading a file truncated under it (a crash, SIGBUS)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _declared_dims(dynamic_shapes: Any, names: list[str], inputs: list[torch.Tensor]) -> dict[tuple[int, int], Any]:
    """(input index, dim) -> the Dim (or name) `dynamic_shapes` gives it; checked."""
    if dynamic_shapes is None:
        return {}
    if not isinstance(dynamic_shapes, dict):
        raise TypeError("kiln.export: dynamic_shapes must be None or a dict {input name: {dim: torch.export.Dim "
                        f"or name}}, got {type(dynamic_shapes).__name__}; the inputs are {', '.join(names)}")
    declared = {}
    for name, dims in dynamic_shapes.items():
        if name not in names:
            raise ValueError(f"kiln.export: dynamic_shapes names {name!r}, which is no input; the inputs are "
                             f"{', '.join(names)}")
        k = names.index(name)
        if dims is None:
            continue
        if not isinstance(dims, dict):
            raise TypeError(f"kiln.export: dynamic_shapes[{name!r}] must be a dict {{dim: Dim or name}}, "
                            f"got {type(dims).__name__}")
        for d, dim in dims.items():
            if not isinstance(d, int) or not 0 <= d < inputs[k].dim():
                raise ValueError(f"kiln.export: dynamic_shapes[{name!r}] names dimension {d!r}; {name} has "
                                 f"{inputs[k].dim()} dimensions")
            if dim is None:
                continue
            if not (isinstance(dim, str) or hasattr(dim, "__name__") and hasattr(dim, "min")):
                raise TypeError(f"kiln.export: dynamic_shapes[{name!r}][{d}] must be a torch.export.Dim or a name, "
                                f"got {type(dim).__name__}")
            declared[(k, d)] = dim
    return declared


def _named_inputs(args: tuple, kwargs: dict) -> tuple[list[str], list[torch.Tensor]]:
    """The tensor inputs, flattened, each with a name: a keyword's own, `arg<i>` for positions
    (`arg<i>_<j>` inside a nested structure)."""
    names, tensors = [], []
    for i, value in enumerate(args):
        _collect(value, f"arg{i}", names, tensors)
    for key, value in kwargs.items():
        _collect(value, str(key), names, tensors)
    return names, tensors


def _collect(value: Any, name: str, names: list[str], tensors: list[torch.Tensor]) -> None:
    leaves = pytree.tree_leaves(value)
    for j, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            names.append(name if len(leaves) == 1 else f"{name}_{j}")
            tensors.append(leaf)


def _recording_backend(recorded: dict[str, Any]) -> Callable:
    def backend(gm: fx.GraphModule, example_inputs: list) -> Callable:
        if "aot" in recorded:
            raise ExportError("kiln.export: the model was captured as more than one graph")
        compiled = aot.compile(gm, example_inputs, Backend(), options=aot.AotOptions(label="export"))
        built = compiled.built(training=False)
        programs = [b for b in built if isinstance(b, (FrozenProgram, CompiledGraph))]
        if len(programs) != 1 or len(built) != 1:
            raise ExportError(f"kiln.export: kiln's backend did not compile the graph into one program ({built})")
        recorded.update(aot=compiled, gm=gm, example_inputs=list(example_inputs), program=programs[0],
                        graph=programs[0].runtime if isinstance(programs[0], FrozenProgram) else programs[0])
        if recorded["graph"].artifact.cpp_wrapper is None:
            raise ExportError("kiln.export: kiln could not write a C++ wrapper for this graph "
                              "(KILN_LOGS=code says why)")
        if recorded["graph"].artifact.number_inputs:
            raise ExportError("kiln.export: the graph takes integer inputs (sizes passed as numbers); "
                              "an exported model takes tensors only")
        if recorded["graph"].artifact.unused_inputs:
            raise ExportError("kiln.export: the graph has inputs it never reads; an exported model "
                              "takes the inputs its graph reads")

        def call(*args: Any) -> Any:
            outputs = compiled(*args)
            recorded["outputs"] = pytree.tree_leaves(outputs)
            return outputs

        return call

    return backend


def _input_plan(recorded: dict[str, Any], inputs: list[torch.Tensor]) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """How each input of the compiled graph is made: a model input (by index) or a weight (by
    name); and the weights."""
    compiled, program = recorded["aot"], recorded["program"]
    sig = compiled.sig
    if sig.mutated_inputs or sig.aliases:
        raise ExportError("kiln.export: the model mutates an input or returns a view of one; an artifact returns "
                          "fresh tensors only")
    flat = [*compiled.lifted, *recorded["example_inputs"]]
    if isinstance(program, FrozenProgram):
        values = [flat[i] for i in program.runtime_positions] + list(program.constants)
    else:
        values = flat
    by_identity = {id(t): k for k, t in enumerate(inputs)}
    plan, weights = [], {}
    for value in values:
        if not isinstance(value, torch.Tensor):
            raise ExportError(f"kiln.export: a graph input is not a tensor ({type(value).__name__})")
        if id(value) in by_identity:
            plan.append({"input": by_identity[id(value)]})
        else:
            name = f"weight_{len(weights)}"
            weights[name] = value.detach()
            plan.append({"weight": name})
    return plan, weights


def _output_indices(result: Any, graph_outputs: list[Any]) -> list[int]:
    """For each tensor of the model's result, flattened, the graph output it is."""
    by_identity = {id(t): k for k, t in enumerate(graph_outputs)}
    indices = []
    for leaf in pytree.tree_leaves(result):
        if not isinstance(leaf, torch.Tensor):
            continue
        if id(leaf) not in by_identity:
            raise ExportError("kiln.export: a tensor of the model's result is not an output of its graph "
                              "(a model input or a constant returned as it is)")
        indices.append(by_identity[id(leaf)])
    return indices


def _build(graph: CompiledGraph) -> Path:
    """One library: the graph's kernels and C++ wrapper, and kiln's runtime with kiln's kernels."""
    artifact = graph.artifact
    compile_flags, link_flags = libkiln.torch_flags()
    units = [*artifact.library_units, libkiln.source(), kernels_unit.source(defines_flag=not artifact.units)]
    unit_flags = [[]] * len(artifact.units) + [["-O0"]] + [compile_flags] * 2
    # The runtime and kernels units are the same in every export: their objects are compiled once
    # and kept (an MLP's export on 2 cores of an Intel Xeon: 16 s the first time, 0.6 s after), so
    # another export compiles its own graph's units only.
    runtime_units = range(len(artifact.library_units), len(units))
    # -Bsymbolic: the library's calls of kiln's runtime stay inside it even where a process has
    # kiln's own runtime loaded with global symbols.
    path, _ = build_library(units, link_flags=[*link_flags, "-Wl,-Bsymbolic"], unit_flags=unit_flags,
                            reused_units=runtime_units)
    return path


def digest(path: Path) -> str:
    """The sha256 of a file, as metadata.json records it."""
    return hashlib.sha256(path.read_bytes()).hexdigest()
