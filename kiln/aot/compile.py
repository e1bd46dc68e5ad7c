"""`kiln.aot.compile`: a torch-level graph in, a callable with eager's semantics out.

    compiled = kiln.aot.compile(gm, example_inputs, compile_graph)
    outputs = compiled(*inputs)

Parameters and buffers of `gm` become graph inputs. Under grad mode with an input that requires
grad, the joint forward+backward graph is traced and split by the partitioner, and both halves go
to `compile_graph`; otherwise one inference graph does. Each variant is built on first need.

The trace runs under the caller's autocast (its casts become ops of the graph); the graphs are
compiled, and run (kiln/aot/call_wrappers.py), with autocast off, so that neither a pass re-running ops
on fake values nor an extern call at run time casts a second time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils import _pytree as pytree

from kiln import compile_time, config, logs, profiler, trace
from kiln.aot import cache as aot_cache, dump
from kiln.aot.module_state import mark_module_state, module_state_positions
from kiln.aot.call_wrappers import inference_runner, training_runner
from kiln.aot.signature import Signature, UnsupportedByAot, analyze, mark_written_back
from kiln.aot.trace import differentiable_outputs, trace_inference, trace_joint

CompileGraph = Callable[[fx.GraphModule, Sequence[Any]], Callable]


@runtime_checkable
class SavingGraphCompiler(Protocol):
    """A graph compiler that can also keep what it built across processes (kiln's backend,
    kiln/backend/driver.py): only such compilers take part in the AOT graph cache."""

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable: ...

    def save(self, compiled: Any) -> Any:
        """A picklable payload for `compiled`, or None when it cannot be kept."""

    def load(self, payload: Any) -> Callable:
        """The compiled graph again, from `save`'s payload."""

    def on_first_run(self, compiled: Any, then: Callable[[bool], None]) -> None:
        """`then(True)` once `compiled` has completed its first call, `then(False)` when kiln's
        code failed there and the graph runs through ATen instead; at once where nothing is left
        to fail at the first call. A graph is cached only once it has run: a GPU graph's Triton
        kernels compile at their first launch, and one rejected there must never be stored as
        good, nor loaded by a later process."""


@dataclass(frozen=True)
class AotOptions:
    """How the AOT layer builds graphs.

    recompute: let the partitioner recompute cheap forward ops in the backward instead of saving
    them (min-cut rematerialization); False saves everything the backward needs.
    label: names the debug dump folder of this graph.
    cache: reuse graphs traced and compiled by an earlier process (kiln/aot/cache.py), when
    `compile_graph` is a `SavingGraphCompiler`.
    """

    recompute: bool = True
    label: str = "graph"
    cache: bool = False
    # Applied to each compiled inference graph before it runs, with the positions of its module
    # state among the flat inputs and the label (kiln's backend: CUDA graphs, when asked for).
    wrap_inference: Callable[[Callable, list[int], str], Callable] | None = None
    # Likewise for a training graph's forward and backward: (forward, backward, positions, label)
    # -> (forward, backward).
    wrap_training: Callable[[Callable, Callable, list[int], str], tuple[Callable, Callable]] | None = None


# The backend settings that change what is compiled, part of the AOT graph cache's key: a graph
# built under other values is not loaded. (`compile_workers`, `cuda_graph_sizes`,
# `triton_direct_launch`, `autotune_log` and `huge_pages` change how, not what; tests/runtime/test_first_run.py
# checks every backend setting is one or the other.)
KEYED_SETTINGS = ("freezing", "autotune", "codegen", "symbolic_kernels", "cpp_wrapper", "cuda_graphs", "triton_gemm",
                  "gemm_candidates", "disabled_passes", "fp32_gemm")
UNKEYED_SETTINGS = ("compile_workers", "cuda_graph_sizes", "triton_direct_launch", "autotune_log", "huge_pages")


def _placeholder_values(gm: fx.GraphModule) -> list[Any]:
    return [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]


def _is_symbolic(value: Any) -> bool:
    if isinstance(value, torch.SymInt):
        return True
    return isinstance(value, torch.Tensor) and any(not isinstance(s, int) for s in value.shape)


def _fake_mode_for(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> FakeTensorMode:
    """The mode of the graph's symbolic placeholder values or of fake inputs, else a new one.

    A graph with symbolic sizes must be traced in the mode that owns its symbols. Otherwise kiln
    uses its own mode, whose shape environment lets data-dependent values (`.item()` inside
    `narrow`, `nonzero`) trace as unbacked symbols, which a caller's mode may forbid.
    """
    metas = [n.meta.get("example_value", n.meta.get("val")) for n in gm.graph.nodes if n.op == "placeholder"]
    symbolic = [m for m in metas if isinstance(m, torch._subclasses.FakeTensor) and _is_symbolic(m)]
    fake_inputs = [a for a in example_inputs if isinstance(a, torch._subclasses.FakeTensor)]
    for value in (*symbolic, *fake_inputs):
        return value.fake_mode
    numbers = [m for m in metas if isinstance(m, torch.SymInt)]
    if numbers:  # symbolic int inputs alone (an int argument that changed): tensors faked in their shape env
        return FakeTensorMode(shape_env=numbers[0].node.shape_env)
    return FakeTensorMode(shape_env=ShapeEnv())


class AotCompiled:
    """The callable `kiln.aot.compile` returns; builds the inference or training variant on demand."""

    def __init__(self, gm: fx.GraphModule, example_inputs: Sequence[Any], compile_graph: CompileGraph, options: AotOptions) -> None:
        self.compile_graph, self.options = compile_graph, options
        self.gm, self.example_inputs = gm, list(example_inputs)
        lifted = dict(gm.named_parameters(remove_duplicate=False)) | dict(gm.named_buffers(remove_duplicate=False))
        self.lifted_names, self.lifted = list(lifted), list(lifted.values())
        self.out_spec: pytree.TreeSpec | None = None
        self.fn = self._flat_function(gm)
        self.sig: Signature | None = None  # with fake_mode and fake_args, made by _prepare()
        self.variants: dict[bool, Callable[..., list[Any]]] = {}
        self.graphs: dict[bool, list[Any]] = {}  # what compile_graph made of each variant's graph(s)
        self.partition: Any = None  # the training variant's Partition, once built
        # Build now for the grad mode of the example inputs, so compile errors surface here (where
        # a backend can fall back) rather than in the middle of the user's call.
        self._variant(self._wants_training([*self.lifted, *self.example_inputs]))

    def _prepare(self) -> None:
        """Fake inputs and the signature: what tracing needs (a cache hit needs neither)."""
        if not hasattr(self, "fake_args"):
            self.fake_mode = _fake_mode_for(self.gm, self.example_inputs)
            self.fake_args = [self._fake(a) for a in self.lifted] + self._fake_inputs(self.gm, self.example_inputs)
            # Always analyzed here, even after a cache hit: a loaded signature holds sympy
            # expressions where tracing needs the SymInts of this process.
            self.sig = analyze(self.fn, self.fake_args, self.fake_mode)

    def _flat_function(self, gm: fx.GraphModule) -> Callable[..., tuple]:
        n = len(self.lifted_names)

        def flat(*args: Any) -> tuple:
            state = dict(zip(self.lifted_names, args[:n]))
            leaves, spec = pytree.tree_flatten(torch.func.functional_call(gm, state, tuple(args[n:])))
            self.out_spec = spec
            return tuple(leaves)

        return flat

    def _fake(self, value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or isinstance(value, torch._subclasses.FakeTensor):
            return value
        return self.fake_mode.from_tensor(value, static_shapes=True)

    def _fake_inputs(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> list[Any]:
        # Under the caller's mode, the graph's own placeholder values carry its symbolic sizes.
        metas = [n.meta.get("example_value", n.meta.get("val")) for n in gm.graph.nodes if n.op == "placeholder"]
        if len(metas) != len(example_inputs):
            metas = [None] * len(example_inputs)
        return [meta if self._in_our_mode(meta) else self._fake(a) for meta, a in zip(metas, example_inputs)]

    def _in_our_mode(self, value: Any) -> bool:
        if isinstance(value, torch._subclasses.FakeTensor):
            return value.fake_mode is self.fake_mode
        return isinstance(value, torch.SymInt) and value.node.shape_env is self.fake_mode.shape_env

    def _wants_training(self, args: Sequence[Any]) -> bool:
        return torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)

    def _build_inference(self) -> tuple[Callable[..., list[Any]], list[Any], int]:
        with compile_time.stage("aot"):
            self._prepare()
            graph = trace_inference(self.fn, self.fake_args, self.sig, self.fake_mode)
            mark_module_state(graph, module_state_positions(len(self.lifted), self.example_inputs, self.sig))
            mark_written_back(graph, self.sig)
            dump.inference(self.options.label, graph, self.sig)
        with compile_time.stage("inference graph"), torch._C._DisableAutocast():
            compiled = self.compile_graph(graph, _placeholder_values(graph))
        return inference_runner(self._wrapped(compiled), self.sig), [compiled], 0

    def _wrapped(self, compiled: Callable) -> Callable:
        wrap = self.options.wrap_inference
        if wrap is None:
            return compiled
        return wrap(compiled, module_state_positions(len(self.lifted), self.example_inputs, self.sig), self.options.label)

    def _build_training(self) -> tuple[Callable[..., list[Any]], list[Any], int]:
        from kiln.aot.partition import PartitionPolicy, partition  # networkx, only when training

        with compile_time.stage("aot"):
            self._prepare()
            sig = self.sig
            for i in sig.mutated_inputs:
                if getattr(self.fake_args[i], "requires_grad", False):
                    raise UnsupportedByAot(f"input {i} requires grad and is mutated in place")
            joint = trace_joint(self.fn, self.fake_args, sig, self.fake_mode)
            num_forward_outputs = sig.num_outputs + len(sig.mutated_inputs)
            split = partition(joint, num_forward_outputs, policy=PartitionPolicy(recompute=self.options.recompute))
            self.partition = split  # for inspection: what is saved and recomputed
            gradients = next(n for n in split.backward.graph.nodes if n.op == "output").args[0]
            sig.inputs_without_gradient = [i for i, g in enumerate(gradients) if g is None]
            dump.training(self.options.label, joint, split, sig)
        with compile_time.stage("forward graph"), torch._C._DisableAutocast():
            forward = self.compile_graph(split.forward, _placeholder_values(split.forward))
        with compile_time.stage("backward graph"), torch._C._DisableAutocast():
            backward = self.compile_graph(split.backward, _placeholder_values(split.backward))
        runner = training_runner(*self._wrapped_training(forward, backward), sig, differentiable_outputs(sig),
                                 split.num_saved_tensors)
        return runner, [forward, backward], split.num_saved_tensors

    def _wrapped_training(self, forward: Callable, backward: Callable) -> tuple[Callable, Callable]:
        wrap = self.options.wrap_training
        if wrap is None:
            return forward, backward
        return wrap(forward, backward, module_state_positions(len(self.lifted), self.example_inputs, self.sig),
                    self.options.label)

    def _runner(self, training: bool, compiled: list[Any], num_saved: int) -> Callable[..., list[Any]]:
        if training:
            return training_runner(*self._wrapped_training(*compiled), self.sig, differentiable_outputs(self.sig), num_saved)
        return inference_runner(self._wrapped(compiled[0]), self.sig)

    def _cache_key(self, training: bool) -> str | None:
        if not (self.options.cache and isinstance(self.compile_graph, SavingGraphCompiler)):
            return None
        lifted = dict(zip(self.lifted_names, self.lifted))
        options = (self.options.recompute, *(getattr(config.backend, name) for name in KEYED_SETTINGS))
        return aot_cache.cache_key(self.gm, self.example_inputs, lifted, training, options)

    def _from_cache(self, key: str | None, training: bool) -> Callable[..., list[Any]] | None:
        if key is not None and trace.active():
            # The compile report shows every stage of every graph; a cached graph has none to show.
            compile_time.note("AOT graph cache not read: KILN_TRACE compiles every graph")
            return None
        variants = aot_cache.load(key) if key is not None else None
        if variants is None:
            return None
        env = aot_cache.shape_env(aot_cache.placeholder_values(self.gm))
        entry, guards, unmet = aot_cache.fitting_variant(variants, env)
        if entry is None:
            logs.log("cache", "AOT graph cache entry %s was built for other sizes (%s is false here): rebuilding",
                     key[:12], unmet)
            return None
        compile_time.note("graph loaded from the AOT graph cache")
        try:
            compiled = [self.compile_graph.load(p) for p in entry.payloads]
        except Exception as error:  # noqa: BLE001 - an entry that does not load is rebuilt
            logs.log("cache", "AOT graph cache entry %s not loaded (%s): rebuilding", key[:12], error)
            return None
        for guard in guards:  # (what its build decided about the sizes: now this frame's guards too)
            env.evaluate_expr(guard)
        self.graphs[training] = compiled
        for graph in compiled:  # (it ran where it was stored; here, on another GPU, it may not)
            self.compile_graph.on_first_run(graph, lambda ran: ran or aot_cache.drop(key))
        self.sig = self.sig or entry.sig
        self.out_spec = pytree.treespec_loads(entry.out_spec)
        return self._runner(training, compiled, entry.num_saved_tensors)

    def _to_cache(self, key: str | None, compiled: list[Any], num_saved: int, added_guards: tuple[Any, ...]) -> None:
        """Stores the graphs under `key` once each has completed its first call (never, if one
        failed there)."""
        if key is None or self.out_spec is None:
            return
        waiting, failed = set(range(len(compiled))), []

        def ran(position: int, ok: bool) -> None:
            waiting.discard(position)
            failed.extend([] if ok else [position])
            if not waiting and not failed:
                self._store(key, compiled, num_saved, added_guards)

        # (A graph that has nothing left to fail is stored at once, inside this stage; one that
        # waits for its first call is stored by that call, outside any compile-time stage.)
        with compile_time.stage("aot cache store"):
            for position, graph in enumerate(compiled):
                self.compile_graph.on_first_run(graph, lambda ok, position=position: ran(position, ok))

    def _store(self, key: str, compiled: list[Any], num_saved: int, added_guards: tuple[Any, ...]) -> None:
        spec = aot_cache.dumps_spec(self.out_spec)
        payloads = [self.compile_graph.save(c) for c in compiled] if spec is not None else []
        if spec is not None and all(p is not None for p in payloads):
            aot_cache.store(key, aot_cache.CachedVariant(self.sig, spec, payloads, num_saved, added_guards))

    def _variant(self, training: bool) -> Callable[..., list[Any]]:
        if training not in self.variants:
            with compile_time.stage("aot cache lookup"):
                key = self._cache_key(training)
                runner = self._from_cache(key, training)
                if self.options.cache:
                    profiler.mark(f"kiln cache {'hit' if runner is not None else 'miss'}: aot graph")
            if runner is None:
                logs.log("aot", "building the %s graph(s) of %s", "training" if training else "inference", self.options.label)
                env = aot_cache.shape_env(aot_cache.placeholder_values(self.gm))
                known = len(env.guards) if env is not None else 0
                runner, compiled, num_saved = self._build_training() if training else self._build_inference()
                self.graphs[training] = compiled
                self._to_cache(key, compiled, num_saved, aot_cache.guards_added_since(env, known))
            self.variants[training] = runner
        return self.variants[training]

    def built(self, training: bool = False) -> list[Any]:
        """What `compile_graph` made of the inference graph (or of the training variant's forward
        and backward graphs), built now if no call has yet: how a caller that builds ahead of
        time (kiln.export) gets the backend's program."""
        self._variant(training)
        return self.graphs[training]

    def __call__(self, *args: Any) -> Any:
        # Under no_grad (inference) the parameter scan is skipped: that is the hot path.
        if torch.is_grad_enabled():
            run = self._variant(self._wants_training([*self.lifted, *args]))
        else:
            run = self.variants.get(False) or self._variant(False)
        return self._rebuild(run(*self.lifted, *args))

    def _rebuild(self, outputs: Sequence[Any]) -> Any:
        """The user's output structure from the flat outputs (`out_spec`): a tuple or list of
        tensors directly, anything else through pytree (~2 µs a call for a tuple)."""
        spec = self.out_spec
        if (spec.type is tuple or spec.type is list) and spec.num_leaves == spec.num_children:  # children all leaves
            return tuple(outputs) if spec.type is tuple else list(outputs)
        return pytree.tree_unflatten(outputs, spec)


def compile(
    gm: fx.GraphModule,
    example_inputs: Sequence[Any],
    compile_graph: CompileGraph,
    *,
    options: AotOptions | None = None,
) -> Callable:
    """Trace `gm` to functional core-ATen graph(s), compile each with `compile_graph`, and return
    a callable with eager's mutation, aliasing and autograd semantics.

    Example::

        compiled = kiln.aot.compile(gm, inputs, lambda aten_gm, example: aten_gm)
        out = compiled(*inputs)
    """
    if not isinstance(gm, fx.GraphModule):
        raise TypeError(f"kiln.aot.compile: gm must be a torch.fx.GraphModule, got {type(gm).__name__}")
    if not callable(compile_graph):
        raise TypeError("kiln.aot.compile: compile_graph must be callable as compile_graph(aten_gm, example_inputs)")
    options = options or AotOptions()
    if not isinstance(options, AotOptions):
        raise TypeError(f"kiln.aot.compile: options must be kiln.aot.AotOptions, got {type(options).__name__}")
    return AotCompiled(gm, example_inputs, compile_graph, options)
