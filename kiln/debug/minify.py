"""`kiln.debug.minify`: shrink a graph that kiln fails on to the fewest ops that fail the same way,
and write a standalone repro.py.

    result = kiln.debug.minify(gm, example_inputs)          # a graph a backend was handed
    result = kiln.debug.minify_model(model, x)              # the first failing graph kiln captures
    print(result)   # the failure, op nodes before -> after, compiles spent, where repro.py is

The graph runs eagerly once to record every intermediate value (kiln/debug/subgraph.py). A
candidate is a subset of its op nodes, cut out as a graph whose inputs are the recorded values it
reads, compiled and run by kiln's real pipeline and judged by kiln/debug/check.py: a compile
failure is the same when its exception type and first line are, an accuracy failure when it is one.
The search (kiln/debug/shrink.py) truncates the tail and cuts the head by bisection, then removes
chunks down to single nodes; every candidate compiles in a private, empty cache, so no answer
comes from an earlier build. The smallest failing candidate is written out (kiln/debug/repro.py)
with random inputs when they still fail the same way, else with the exact values saved beside it,
and the written file is loaded back and checked once more.
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import fx

from kiln import config
from kiln.api import compile as kiln_compile, reset
from kiln.debug.check import KINDS, Failure, how_it_fails
from kiln.debug.repro import load_repro, write_repro
from kiln.debug.shrink import shrink
from kiln.debug.subgraph import NotCuttable, cut_out, intermediate_values, op_nodes, without_modules

# Settings that say where things go or what is reported, not what is built: a repro leaves them.
_NOT_BUILD_SETTINGS = ("cache.", "bench.", "debug.logs", "debug.dump_dir")


@dataclass
class MinifyResult:
    """What `minify` found.

    failure: how the graph fails (None: it does not, the way asked; `note` says how it runs).
    gm, inputs: the smallest failing graph and the inputs it fails on.
    nodes_before, nodes_after: op nodes (call_function, call_method) of the graph given and of `gm`.
    compiles: candidates compiled and run by kiln, the written repro's check included.
    repro: the repro.py written, or None; repro_checked: it was loaded back and fails the same way.
    """

    failure: Failure | None
    gm: fx.GraphModule | None = None
    inputs: list = field(default_factory=list)
    nodes_before: int = 0
    nodes_after: int = 0
    compiles: int = 0
    repro: Path | None = None
    repro_checked: bool = False
    note: str = ""

    def __str__(self) -> str:
        if self.failure is None:
            return f"kiln.debug.minify: nothing to minify: {self.note}"
        lines = [f"kiln.debug.minify: {self.failure.kind} failure: {self.failure.message}",
                 f"  op nodes: {self.nodes_before} -> {self.nodes_after} ({self.compiles} compiles)"]
        if self.repro is not None:
            checked = "checked: fails the same way" if self.repro_checked else "NOT reproducing when loaded back"
            lines.append(f"  repro: {self.repro} ({checked})")
        if self.note:
            lines.append(f"  note: {self.note}")
        return "\n".join(lines)


def _count_ops(gm: fx.GraphModule) -> int:
    return sum(n.op in ("call_function", "call_method") for n in gm.graph.nodes)


def repro_settings() -> dict[str, Any]:
    """The kiln settings not at their defaults that change what is built: a repro sets them again."""
    return {name: value for name, value in config.changed().items() if not name.startswith(_NOT_BUILD_SETTINGS)}


@contextlib.contextmanager
def _private_cache() -> Iterator[None]:
    # Built kernels and graphs in an empty folder, dropped after; kiln's own libraries (runtime,
    # extension: ~25 s to build) still from where they are, and no shared remote tier.
    runtime = str(config.runtime_cache_dir())
    with tempfile.TemporaryDirectory(prefix="kiln-minify-") as folder, \
            config.patch({"cache.dir": folder, "cache.runtime_dir": runtime, "cache.remote": ""}):
        yield


def _check_inputs(example_inputs: Sequence[Any]) -> None:
    for value in example_inputs:
        if isinstance(value, torch._subclasses.FakeTensor) or isinstance(value, torch.SymInt):
            raise TypeError("kiln.debug.minify: example_inputs must be real tensors and numbers, not fake "
                            "tensors or symbolic sizes (the graph runs eagerly on them)")


class _Minifier:
    """One minification: the graph, its op nodes and recorded values, how each candidate failed, the
    compiles spent."""

    def __init__(self, gm: fx.GraphModule, example_inputs: Sequence[Any], rtol: float, atol: float) -> None:
        self.gm, self.rtol, self.atol = gm, rtol, atol
        self.nodes = op_nodes(gm)
        self.values = intermediate_values(gm, example_inputs)
        self.compiles = 0
        self.found: dict[tuple[int, ...], Failure | None] = {}  # how each candidate failed

    def how_it_fails(self, gm: fx.GraphModule, inputs: Sequence[Any]) -> Failure | None:
        self.compiles += 1
        return how_it_fails(gm, inputs, self.rtol, self.atol)

    def cut(self, positions: Sequence[int]) -> tuple[fx.GraphModule, list]:
        return cut_out(self.gm, [self.nodes[i] for i in positions], self.values)

    def fails_as(self, same: Callable[[Failure], bool]) -> Callable[[tuple[int, ...]], bool]:
        def fails(positions: tuple[int, ...]) -> bool:
            try:
                candidate = self.cut(positions)
            except NotCuttable:
                return False
            found = self.found[positions] = self.how_it_fails(*candidate)
            return found is not None and same(found)

        return fails

    def write(self, gm: fx.GraphModule, inputs: list, failure: Failure, same: Callable[[Failure], bool],
              out_dir: str | Path, notes: str) -> tuple[Path, bool]:
        """repro.py for `gm`, random inputs first, exact ones when random do not fail the same way;
        and whether the file, loaded back, does."""
        for exact in (False, True):
            path = write_repro(out_dir, gm, inputs, failure, notes, repro_settings(), self.rtol, self.atol, exact)
            loaded, loaded_inputs, settings = load_repro(path)
            with config.patch(settings):
                found = self.how_it_fails(loaded, loaded_inputs)
            if found is not None and same(found):
                return path, True
        return path, False


def minify(gm: fx.GraphModule, example_inputs: Sequence[Any], failure: str = "auto", out_dir: str | Path = "kiln_minify",
           rtol: float = 1e-3, atol: float = 1e-3, same: Callable[[Failure], bool] | None = None,
           max_compiles: int = 100) -> MinifyResult:
    """Shrink `gm`, which kiln fails on, to the fewest op nodes that fail the same way, and write
    `out_dir`/repro.py (module docstring).

    failure: "compile" (compiling or running raises), "accuracy" (outputs beyond `rtol`/`atol` of
    the float64 eager reference where eager is within them: kiln/debug/check.py), or "auto" (the
    way `gm` fails). same: whether a candidate's Failure counts as the one being minified (default:
    the same kind; for "compile", the same exception type and first line). max_compiles: the most
    candidates compiled; the search then stops with the smallest failing one found.

    Example::

        result = kiln.debug.minify(gm, example_inputs, failure="compile", out_dir="repro")
        print(result)                 # kiln.debug.minify: compile failure: RuntimeError: ...
        result.gm, result.repro       # the smallest failing graph; repro/repro.py
    """
    if failure not in ("auto", *KINDS):
        raise ValueError(f"kiln.debug.minify: failure must be 'auto', 'compile' or 'accuracy', got {failure!r}")
    _check_inputs(example_inputs)
    gm = without_modules(gm)
    with _private_cache():
        minifier = _Minifier(gm, example_inputs, rtol, atol)
        everything = range(len(minifier.nodes))
        found = minifier.how_it_fails(*minifier.cut(everything))
        before = _count_ops(gm)
        same = same or (found.same_as if found is not None else None)
        if found is None or failure not in ("auto", found.kind) or not same(found):
            how = "kiln compiles and runs it within tolerance" if found is None else f"it fails {found.kind}: {found.message}"
            wanted = "fail" if failure == "auto" else f"fail {failure}"
            wanted += " as `same` asks" if found is not None and failure in ("auto", found.kind) else ""
            return MinifyResult(None, nodes_before=before, compiles=minifier.compiles,
                                note=f"the graph ({before} op nodes) does not {wanted} under kiln: {how}")
        kept, search = shrink(len(minifier.nodes), minifier.fails_as(same), max_compiles)
        small, small_inputs = minifier.cut(kept)
        after = _count_ops(small)
        here = minifier.found.get(tuple(kept), found)
        notes = (f"Fails here: {here.message}\n"
                 f"Op nodes: {before} in the graph given, {after} here ({minifier.compiles} compiles to shrink it).")
        path, checked = minifier.write(small, small_inputs, found, same, out_dir, notes)
    note = f"stopped after max_compiles={max_compiles} candidates; a smaller graph may still fail" if search.spent else ""
    return MinifyResult(found, small, small_inputs, before, after, minifier.compiles, path, checked, note)


def captured_graphs(model: Callable, *inputs: Any) -> list[tuple[fx.GraphModule, list]]:
    """Every graph kiln's capture hands a backend when `model(*inputs)` runs, with its example
    inputs (copies, taken before the graph runs), in capture order.

    Example::

        for gm, example_inputs in captured_graphs(model, x):
            print(gm.code)
    """
    graphs = []

    def record(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        graphs.append((gm, [x.clone() if isinstance(x, torch.Tensor) else x for x in example_inputs]))
        return gm.forward

    reset()  # a function compiled before would be answered from capture's cache, unseen
    try:
        with torch.no_grad():
            kiln_compile(model, backend=record)(*inputs)
    finally:
        reset()
    return graphs


def minify_model(model: Callable, *inputs: Any, failure: str = "auto", **options: Any) -> MinifyResult:
    """`minify` the first graph kiln captures from `model(*inputs)` that fails; `options` as minify's.

    Example::

        print(kiln.debug.minify_model(model, torch.randn(8, 16), out_dir="repro"))
    """
    graphs = captured_graphs(model, *inputs)
    compiles = 0
    for gm, example_inputs in graphs:
        result = minify(gm, example_inputs, failure, **options)
        if result.failure is not None:
            result.compiles += compiles
            return result
        compiles += result.compiles
    wanted = "fails" if failure == "auto" else f"fails {failure}"
    return MinifyResult(None, compiles=compiles, note=f"none of the {len(graphs)} graphs kiln captured {wanted} under kiln")
