"""kiln's backend driver: one ATen graph in, a callable that runs it out, stage by stage.

    graph ─ specialize_sizes ─ rewrites (passes/pipeline.py) ─ split_constants
          ─ lowering ─ scheduling ─ code generation (for the graph's device) ─ build ─ load

This is the one place that assembles the stages after the AOT layer, in the order the pipeline
lists them. Each stage is timed (`KILN_LOGS=compile_time`, kiln/compile_time.py), its result can
be dumped (`KILN_DEBUG_DIR`, kiln/backend/dump.py) and, under `KILN_VERIFY=1`, checked: the ATen
graph after every rewrite, the IR after lowering and after scheduling. The code generator is chosen once per graph, from its device
(`choose_codegen`): C++ for CPU, Triton for CUDA; the driver calls its object in the table
`CODEGENS` (kiln/backend/codegens.py), and the stages before it read its traits on the `Target`.

`Backend` is a graph compiler for `kiln.aot.compile` that can also save what it built and load it
back, so the AOT graph cache can keep it across processes.

Example::

    compiled = kiln.aot.compile(gm, example_inputs, Backend())
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import fx

from kiln import compile_time, config, logs
from kiln.backend import dump
from kiln.backend.codegens import AUTO, CODEGENS, Kernels
from kiln.backend.report import fusion_report
from kiln.codegen.wrapper import WrapperCode
from kiln.codegen.wrapper_plan import WrapperPlan, wrapper_plan
from kiln.ir.program import Program
from kiln.ir.target import Target
from kiln.ir.verify import verify_program
from kiln.lowering.graph import GraphLowering
from kiln.lowering.registry import LOWERINGS
from kiln.passes import pipeline
from kiln.passes.constants import has_frozen_inputs, unmark_frozen
from kiln.passes.quantized_gemm import reference_products
from kiln.passes.specialize_sizes import (has_symbolic_sizes, reads_computed_values, scalar_inputs, specialize, symbolic_declined,
                                          symbolic_inputs)
from kiln.passes.verify import verify_graph
from kiln.runtime import saved
from kiln.runtime.compiled_graph import CompiledGraph, GraphArtifact, build
from kiln.runtime.fallback import record_fallback
from kiln.runtime.frozen import FrozenProgram
from kiln.runtime.specialized import SizeSpecialized
from kiln.ir.schedule import Schedule
from kiln.schedule import schedule
from kiln.schedule.verify import verify_schedule


@dataclass
class BuiltStages:
    """What one graph was compiled from, kept on the CompiledGraph for tests, dumps and
    kiln.debug.bisect (which checks each stage against the one before)."""

    graph: fx.GraphModule  # the ATen graph after the rewrites: what was lowered
    program: Program  # after lowering
    schedule: Schedule  # after scheduling
    kernels: Kernels  # after code generation
    wrapper: WrapperCode


def graph_device(gm: fx.GraphModule) -> str:
    """The device type of the graph's tensors: an accelerator's where any tensor is on one (host
    tensors beside them are scalars and indices eager accepts there), else "cpu"."""
    devices = {val.device.type for node in gm.graph.nodes
               if isinstance(val := node.meta.get("val"), torch.Tensor)}
    accelerators = sorted(devices - {"cpu"})
    return accelerators[0] if accelerators else "cpu"


def choose_codegen(device: str) -> str:
    """The name of the code generator for graphs on `device`: the one place this is decided.
    `auto` (the setting `backend.codegen`) is C++ on CPU and Triton on CUDA; `triton` on CPU runs
    the Triton kernels under Triton's interpreter (tests); `cpp` is for CPU graphs only."""
    wanted = config.backend.codegen
    settings = ("auto", *CODEGENS)
    if wanted not in settings:
        raise ValueError(f"backend.codegen (KILN_CODEGEN) must be one of {', '.join(settings)}; got {wanted!r}")
    if device not in AUTO:
        raise NotImplementedError(f"kiln generates code for CPU and CUDA graphs; this graph's tensors are on {device!r}")
    name = AUTO[device] if wanted == "auto" else wanted
    CODEGENS[name].check_available(device)
    return name


def prepare_codegen(device: str) -> None:
    """A graph on `device` is on its way: its code generator starts what can overlap the stages
    before the lowering (Triton's compile workers); an error here is the driver's to report."""
    try:
        CODEGENS[choose_codegen(device)].prepare(device)
    except Exception:  # noqa: BLE001 - the driver meets the same error and records its fallback
        pass


def host_inputs(gm: fx.GraphModule, target: Target) -> frozenset[str]:
    """Inputs of a GPU graph whose tensors are on the CPU (scalars, indices eager accepts there)."""
    if target.device == "cpu":
        return frozenset()
    return frozenset(n.name for n in gm.graph.nodes if n.op == "placeholder"
                     and isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].device.type == "cpu")


def target_for(gm: fx.GraphModule) -> Target:
    device = graph_device(gm)
    if device != "cpu":
        for node in gm.graph.nodes:
            val = node.meta.get("val")
            # (A 0-dim host value made inside the graph, a scalar_tensor, is lowered to a constant.)
            if node.op != "placeholder" and isinstance(val, torch.Tensor) and val.device.type == "cpu" and val.dim() > 0:
                raise NotImplementedError(f"a {device} graph that computes on the CPU too ({node.format_node()})")
    return Target(device=device, codegen=CODEGENS[choose_codegen(device)].traits, loop_ops=frozenset(LOWERINGS))


# Called with what every Backend returns for an ATen graph it builds, the doors' own Backends
# included: the doors build theirs with no `observe`, so this is how a test sees what the default
# configuration produced. Graphs loaded from the AOT graph cache are not built and not seen.
WATCHERS: list[Callable[[Any], None]] = []


@contextlib.contextmanager
def watch() -> Iterator[list[Any]]:
    """What each ATen graph compiled in the block became, in build order: a FrozenProgram, a
    CompiledGraph, the graph itself (run by ATen, recorded as a fallback), or a SizeSpecialized
    followed by what each size it compiles becomes.

    Example::

        with kiln.backend.watch() as built:
            torch.compile(model, backend="kiln")(x)
        assert isinstance(built[0], kiln.runtime.frozen.FrozenProgram)
    """
    built: list[Any] = []
    watcher = built.append
    WATCHERS.append(watcher)
    try:
        yield built
    finally:
        WATCHERS.remove(watcher)


def _tell_reference_products(gm: fx.GraphModule) -> None:
    # A quantized Linear kiln's GEMM did not take (freezing off, float16 activations, a GPU) runs
    # eager's reference, dequantizing its whole weight every call: often slower than the float
    # model, so it is said even with logs off.
    count = reference_products(gm)
    if count:
        warnings.warn(f"kiln: {count} weight-only quantized linear layer(s) of a compiled graph run eager's "
                      "dequantizing reference (kiln's quantized GEMM takes frozen weights with float32 or bfloat16 "
                      "activations on the CPU: backend.freezing on, the model in float32 or bfloat16)", RuntimeWarning, stacklevel=2)


class Backend:
    """`Backend()(gm, example_inputs) -> callable`, with `save` and `load` for the AOT graph cache.

    observe: called with every CompiledGraph built (each size specialization and the runtime graph
    of a frozen one included), for tests that look at Programs and kernels.
    changed_by: the rewrites that changed a graph it built, in pipeline order (kiln.debug.bisect
    tries skipping these only: skipping one that changed nothing changes nothing).
    """

    def __init__(self, observe: Callable[[CompiledGraph], None] | None = None) -> None:
        self.observe = observe
        self.changed_by: list[str] = []

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        built = self._build(gm, example_inputs)
        for watcher in WATCHERS:
            watcher(built)
        return built

    def _build(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
        if reads_computed_values(gm):
            # A number read from a tensor the graph computes (tensor.item() kept in the graph by
            # capture.scalar_outputs or fullgraph=True), and what is made from it, exist only when
            # the graph runs; kiln's lowering takes neither. (A number read from an input is
            # specialized on, below.)
            record_fallback("kiln", "graph reading numbers from computed tensors", NotImplementedError(
                "the graph reads a number from a tensor it computes (tensor.item() kept by "
                "capture.scalar_outputs or fullgraph=True): it runs through ATen, op by op"))
            return gm
        higher_order = sorted({str(n.target) for n in gm.graph.nodes if isinstance(n.target, torch._ops.HigherOrderOperator)
                               and any(a.op == "get_attr" for a in n.all_input_nodes)})  # (ops calling graphs)
        if higher_order:
            # `torch.cond` kept in the graph (kiln/capture/variables/control_flow.py): kiln's
            # lowering has no branches; the graph runs through ATen, the op calling its branches.
            record_fallback("kiln", "graph with higher-order ops", NotImplementedError(
                f"the graph calls {', '.join(higher_order)}, which kiln's lowering does not take: it runs through ATen, op by op"))
            return gm
        target = target_for(gm)
        folder = logs.dump_folder("kiln_backend")
        dump.aten_graph(folder, gm)
        name, needs_specialization = pipeline.SPECIALIZE_SIZES
        with compile_time.stage(f"pass {name}"):
            per_size = needs_specialization(gm)
        if not per_size:
            return self._pipeline(gm, target, folder)
        symbolic = self._symbolic(gm, target, folder)
        if symbolic is not None:
            return symbolic
        return SizeSpecialized(scalar_inputs(gm), symbolic_inputs(gm),
                               lambda args, values: self(specialize(gm, args, values), args), eager=gm)

    def _symbolic(self, gm: fx.GraphModule, target: Target, folder: Any) -> Callable | None:
        """`gm` compiled once for all its sizes (kernels take them as arguments), or None where
        it cannot be, said in the `recompiles` log: the caller then compiles it per size."""
        reason = symbolic_declined(gm, target)
        if reason is None:
            # The rewrites edit the graph in place; a copy keeps `gm` for per-size compiles.
            graph_copy = fx.GraphModule(gm, copy.deepcopy(gm.graph))
            try:
                return self._pipeline(graph_copy, target, folder, symbolic=True)
            except (NotImplementedError, TypeError, ValueError) as error:
                # NotImplementedError: a stage declined a symbolic size. A TypeError or
                # ValueError there is a stage meeting a symbol where it wanted a number: the
                # per-size path, which sees only numbers, still compiles the graph.
                reason = f"{type(error).__name__}: {error}"
        logs.log("recompiles", "kiln backend: a graph with symbolic sizes is compiled per size: %s", reason)
        return None

    def _pipeline(self, gm: fx.GraphModule, target: Target, folder: Any, symbolic: bool = False) -> Callable:
        for name, rewrite in pipeline.rewrites():
            with compile_time.stage(f"pass {name}"):
                changed = rewrite(gm, target)
                if changed:
                    gm.recompile()
                if config.debug.verify:
                    verify_graph(gm, after=name)
            if changed:
                logs.log_lazy("passes", lambda: f"after {name}:\n{gm.code}")
                self._changed(name)
            dump.after_pass(folder, name, gm, changed)
        _tell_reference_products(gm)
        name, split_constants = pipeline.SPLIT_CONSTANTS
        with compile_time.stage(f"pass {name}"):
            split = split_constants(gm) if has_frozen_inputs(gm) else None
        if split is None:
            unmark_frozen(gm)
            return self._lowered(gm, target, folder, symbolic)
        dump.constant_split(folder, split)
        return FrozenProgram(split, self._lowered(split.runtime, target, folder, symbolic))

    def _changed(self, name: str) -> None:
        if name not in self.changed_by:
            order = [n for n, _ in pipeline.REWRITES]
            self.changed_by = sorted([*self.changed_by, name], key=order.index)

    def _lowered(self, gm: fx.GraphModule, target: Target, folder: Any, symbolic: bool = False) -> Callable:
        try:
            return self._compile(gm, target, folder)
        except NotImplementedError as error:
            if symbolic or not has_symbolic_sizes(gm):
                raise
            # Sizes computed from tensor values inside the graph (unique, nonzero, masks) that an
            # op kiln lowers depends on: the graph runs through ATen, op by op, recorded as a fallback.
            record_fallback("kiln", "graph with data-dependent sizes", error)
            return gm

    def _compile(self, gm: fx.GraphModule, target: Target, folder: Any) -> CompiledGraph:
        codegen = CODEGENS[target.codegen.name]
        codegen.prepare(target.device)
        with compile_time.stage("lowering"):
            program = GraphLowering(gm, codegen.unprintable_ops()).lower()
            if config.debug.verify:
                verify_program(program)
        dump.ir_before_fusion(folder, program)
        with compile_time.stage("scheduling"):
            scheduled = schedule(program, target)
            if config.debug.verify:
                verify_schedule(scheduled)
        with compile_time.stage(f"codegen {codegen.name}"):
            kernels = codegen.kernels(scheduled.kernels, target)
            units = codegen.units(kernels)
            # One plan of the wrapper, printed by the Python printer and, where it runs the graph, a native one.
            plan = wrapper_plan(scheduled, set(kernels.checks), kernels.size_arguments, target.device,
                                host_inputs(gm, target))
            wrapper = codegen.python_wrapper(plan)
            report = fusion_report(program, scheduled, kernels)
            functions = {k: (kernels.functions[k], kernels.arity[k]) for k in kernels.functions}
            native = codegen.native_wrapper(plan, functions)
        artifact = GraphArtifact(units, wrapper.source, wrapper.constants, wrapper.ops, functions,
                                 kernels.checks, report, codegen.name, codegen.kernel_library, target.device,
                                 kernels.size_arguments, native, len(scheduled.outputs),
                                 *(_native_input_positions(plan) if native else ((), ())))
        dump.ir_after_fusion(folder, scheduled, kernels.functions, report)
        dump.code(folder, codegen.kernels_file, kernels.source, wrapper.source, native)
        dump.traced_kernels(folder, scheduled, kernels, codegen)
        with compile_time.stage("build"):
            library = build(artifact)
        with compile_time.stage("load"):
            compiled = CompiledGraph(artifact, library, BuiltStages(gm, program, scheduled, kernels, wrapper), eager=gm)
        logs.log("fusion", "%s", report)
        if self.observe is not None:
            self.observe(compiled)
        return compiled

    def save(self, compiled: Any) -> Any:
        """What the AOT graph cache stores for `compiled`, or None when it cannot be kept."""
        return saved.save(compiled)

    def load(self, payload: Any) -> Callable:
        """`compiled` again from what `save` gave."""
        with compile_time.stage("load"):
            return saved.load(payload)

    def on_first_run(self, compiled: Any, then: Callable[[bool], None]) -> None:
        """`then(ok)` after `compiled`'s first call (kiln/aot/compile.py `SavingGraphCompiler`)."""
        saved.on_first_run(compiled, then)


def _native_input_positions(plan: WrapperPlan) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The positions of the graph's integer inputs and of those it never reads: what a native
    wrapper's call converts and what it leaves out (GraphArtifact `number_inputs`, `unused_inputs`)."""
    kinds = [p.kind for p in plan.parameters]
    return (tuple(k for k, kind in enumerate(kinds) if kind == "size"),
            tuple(k for k, kind in enumerate(kinds) if kind == "unused"))


def compile_graph(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    """kiln's backend as a plain graph compiler: `Backend()(gm, example_inputs)`."""
    return Backend()(gm, example_inputs)
