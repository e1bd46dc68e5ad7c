"""`kiln.debug.bisect`: which stage of kiln moves a model's output away from eager's.

The model runs eagerly (the expected output), then up a ladder of rungs, each compiled afresh
(`kiln.reset()` before it, the AOT graph cache not used), stopping at the first rung whose
output is beyond tolerance (kiln/debug/tolerance.py):

1. capture: kiln's bytecode capture, its graphs run as captured (`backend="eager"`);
2. aot: capture and kiln's AOT layer, the ATen graphs run by ATen (`backend="aot_eager"`);
3. backend: capture, AOT and kiln's backend, as `kiln.compile(model)` builds it.

A wrong backend rung is searched further:

- passes: the backend again with each rewrite that changed a graph skipped in turn
  (`backend.disabled_passes`); every rewrite whose skipping brings the output back within
  tolerance is listed, and the first in pipeline order is the culprit. (A run in which a graph
  fell back to eager proves nothing and is not counted.)
- kernels, when no pass explains it: each compiled graph is checked on the inputs of its call
  (kiln/debug/kernel_check.py): its lowering against its ATen graph, and each kernel, run alone on
  the reference values of its inputs, against the loop-IR reference. The first wrong kernel is the
  culprit, named by its generated function as in the KILN_DEBUG_DIR dump.

Example::

    result = kiln.debug.bisect(model, x)   # prints the report
    result.rung, result.culprit_pass, result.culprit_kernel  # ('backend', None, 'kernel_93565f38a12a286b')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import fx
from torch.utils import _pytree as pytree

import kiln
from kiln import config
from kiln.backend.backends import with_aot
from kiln.backend.driver import Backend
from kiln.capture.break_records import BREAKS
from kiln.debug.kernel_check import GraphCheck, KernelCheck, check_graph
from kiln.debug.report import report
from kiln.debug.tolerance import Difference, Tolerance, compare
from kiln.passes import pipeline
from kiln.runtime import fallback
from kiln.runtime.compiled_graph import CompiledGraph

RUNGS = ("capture", "aot", "backend")
_SEED = 0  # every run draws the same random numbers from torch's generator


@dataclass
class Run:
    """One compiled run of the model: how far its output is from eager's, and the graphs that
    fell back to eager in it (their output is eager's, so they prove nothing)."""

    name: str
    difference: Difference
    fallbacks: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.difference.ok


@dataclass
class GraphFinding:
    """A compiled graph of the backend rung checked on the inputs of its call."""

    index: int  # in build order
    compiled: Difference  # the compiled graph's outputs against its ATen graph's
    check: GraphCheck | None  # None when it could not be checked (`skipped` says why)
    skipped: str = ""


@dataclass
class BisectResult:
    """What `bisect` found; `str()` is its report.

    rung: "none" when every rung matches eager, else the first that does not.
    culprit_pass: the rewrite whose skipping brings the backend's output back, if one does.
    culprit_kernel: the first kernel wrong on reference inputs (its generated function's name),
    when no pass explains a wrong backend rung.
    """

    rung: str
    tolerance: Tolerance
    rungs: list[Run]  # the ladder as far as it went
    passes: list[Run] = field(default_factory=list)  # the backend with one rewrite skipped, in pipeline order
    graphs: list[GraphFinding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    culprit_pass: str | None = None
    culprit_kernel: str | None = None

    @property
    def fixing_passes(self) -> list[str]:
        """Every rewrite whose skipping brings the output back within tolerance."""
        return [run.name for run in self.passes if run.ok and not run.fallbacks]

    @property
    def wrong_kernels(self) -> list[tuple[int, KernelCheck]]:
        """(graph index, kernel) of every kernel wrong on reference inputs, in build order."""
        return [(g.index, k) for g in self.graphs if g.check is not None for k in g.check.wrong_kernels]

    def __str__(self) -> str:
        return report(self)


def _copied(value: Any) -> Any:
    """A copy of every tensor in `value`: each run gets inputs no earlier run wrote to."""
    return pytree.tree_map_only(torch.Tensor, lambda t: t.clone(), value)


@dataclass
class _Recorded:
    """A CompiledGraph and copies of the inputs and outputs of its first call (None until then)."""

    graph: CompiledGraph
    inputs: tuple | None = None
    outputs: tuple | None = None


class _RecordingBackend:
    """kiln's backend as `kiln.compile(model)` uses it, with the AOT graph cache off (a cached graph
    has no stages to check, and may have been built under other settings), keeping every
    CompiledGraph it builds with the inputs and outputs of its first call."""

    def __init__(self) -> None:
        self.backend = Backend(observe=self._observe)
        self.graphs: list[_Recorded] = []

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        return with_aot("kiln", gm, example_inputs, self.backend)

    def _observe(self, graph: CompiledGraph) -> None:
        record = _Recorded(graph)
        self.graphs.append(record)
        call = graph.call

        def recording(*args: Any) -> Any:
            first = record.inputs is None
            inputs = _copied(args) if first else None  # (before the call: kernels may write over buffers)
            outputs = call(*args)
            if first:
                record.inputs, record.outputs = inputs, _copied(tuple(outputs))
            return outputs

        graph.call = recording


class _Ladder:
    """The model, its inputs and eager's output; each run compiles afresh."""

    def __init__(self, model: Callable, args: tuple, kwargs: dict, tolerance: Tolerance) -> None:
        self.model, self.args, self.kwargs, self.tolerance = model, args, kwargs, tolerance
        self.expected = self._call(model)

    def _call(self, fn: Callable) -> Any:
        torch.manual_seed(_SEED)
        return fn(*_copied(self.args), **_copied(self.kwargs))

    def run(self, name: str, backend: Any) -> Run:
        kiln.reset()
        before = len(fallback.FALLBACKS)
        try:
            difference = compare(self.expected, self._call(kiln.compile(self.model, backend=backend)), self.tolerance)
        except Exception as error:  # noqa: BLE001 - a rung that raises is a wrong rung, reported
            difference = Difference(float("inf"), float("inf"), f"the call raised {type(error).__name__}: {error}")
        # A graph the backend could not compile, or a frame capture failed on, ran eagerly.
        eager = [str(f) for f in fallback.FALLBACKS[before:]]
        eager += [f"capture: {record.explanation}" for record in BREAKS if record.kind == "internal_error"]
        return Run(name, difference, eager)

    def eager_is_deterministic(self) -> bool:
        return compare(self.expected, self._call(self.model), self.tolerance).ratio == 0.0


def _passes(ladder: _Ladder, changed: list[str]) -> list[Run]:
    """The backend run again with each rewrite in `changed` skipped (those already skipped too)."""
    runs = []
    for name in changed:
        with config.patch({"backend.disabled_passes": (*config.backend.disabled_passes, name)}):
            runs.append(ladder.run(name, _RecordingBackend()))
    return runs


def _graphs(recorded: _RecordingBackend, tolerance: Tolerance) -> list[GraphFinding]:
    """Each graph of the backend rung checked on the inputs of its first call."""
    findings = []
    for index, record in enumerate(recorded.graphs):
        if record.inputs is None:
            findings.append(GraphFinding(index, Difference(), None, "it was never called"))
            continue
        compiled = compare(tuple(record.graph.stages.graph(*record.inputs)), record.outputs, tolerance)
        try:
            findings.append(GraphFinding(index, compiled, check_graph(record.graph, record.inputs, tolerance)))
        except NotImplementedError as error:  # a graph the check does not serve, which says why
            findings.append(GraphFinding(index, compiled, None, str(error)))
        except Exception as error:  # noqa: BLE001 - the check failed on this graph: reported, the others checked
            findings.append(GraphFinding(index, compiled, None, f"the check raised {type(error).__name__}: {error}"))
    return findings


def bisect(model: Callable, *args: Any, rtol: float = 1e-3, atol: float = 1e-3, verbose: bool = True,
           **kwargs: Any) -> BisectResult:
    """Find the first stage of kiln whose output for `model(*args, **kwargs)` is not eager's,
    under torch.no_grad(); prints the report (`verbose`) and returns it.

    An output is within tolerance when every element has |actual - expected| <= atol * scale +
    rtol * |expected|, `scale` being the largest |expected| in that tensor (1 if all zeros);
    integer, boolean and non-tensor outputs must be equal (kiln/debug/tolerance.py). `rtol`,
    `atol` and `verbose` are bisect's own: the model cannot take keyword arguments by those names.
    Compiled state is reset before each run and after the last (`kiln.reset()`).

    Example::

        result = kiln.debug.bisect(model, input_ids, attention_mask=mask)
        if result.rung == "backend":
            print(result.culprit_pass or result.culprit_kernel)
    """
    tolerance = Tolerance(rtol, atol)
    with torch.no_grad():
        try:
            result = _bisect(model, args, kwargs, tolerance)
        finally:
            kiln.reset()  # no later kiln.compile(model) reuses a graph built with a rewrite skipped
    if verbose:
        print(result)
    return result


def _bisect(model: Callable, args: tuple, kwargs: dict, tolerance: Tolerance) -> BisectResult:
    pipeline.rewrites()  # a bad backend.disabled_passes fails here, not as a backend rung run eagerly
    ladder = _Ladder(model, args, kwargs, tolerance)
    result = BisectResult("none", tolerance, [])
    if not ladder.eager_is_deterministic():
        result.notes.append("eager's own output changes from call to call even with the same seed "
                            "(a nondeterministic op?): every rung is compared with its first call")
    if isinstance(model, torch.nn.Module) and model.training:
        result.notes.append("the model is in training mode (dropout, batch norm's statistics): model.eval() "
                            "compares inference")
    recorded = _RecordingBackend()
    for rung, backend in zip(RUNGS, ("eager", "aot_eager", recorded)):
        result.rungs.append(ladder.run(rung, backend))
        if not result.rungs[-1].ok:
            result.rung = rung
            break
    if result.rung != "backend":
        return result
    result.passes = _passes(ladder, recorded.backend.changed_by)
    if result.fixing_passes:
        result.culprit_pass = result.fixing_passes[0]
        return result
    result.graphs = _graphs(recorded, tolerance)
    if result.wrong_kernels:
        result.culprit_kernel = result.wrong_kernels[0][1].function
    return result
