"""A compiled graph as it runs: its kernel library loaded, its Python wrapper bound and ready.

`GraphArtifact` is everything needed to run the graph again, picklable: what the AOT graph cache
stores. `CompiledGraph(artifact)` loads it: the artifact's `KernelLibrary` builds and loads its
kernels (C++: the library found in the C++ cache by the hash of its translation units, built when
missing, the kernels bound as ctypes functions; Triton: the module imported, its launchers), the
wrapper's ATen ops are resolved by name, and the wrapper is executed to define `call`.

`CompiledGraph.instrumented(wrap)` defines `call` a second time from the same wrapper text with
each kernel and extern op passed through `wrap`: how the profiler (benchmarks/profile.py) times
every step without a second wrapper to generate or keep, and without a cost on the normal call.
"""

from __future__ import annotations

import ctypes
import dataclasses
import pickle
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from kiln import compile_time
from kiln.externs import native_ops
from kiln.native import libkiln, python_door
from kiln.native.build import build_library
from kiln import profiler
from kiln.runtime.fallback import record_fallback
from kiln.heap import keep_freed_memory
from kiln.runtime.error_flag import ErrorFlag, IndexOutOfRange
from kiln.runtime.triton_kernels import load_module, module_path


class KernelLibrary:
    """How the runtime builds and loads the kernels one code generator printed. The artifact
    carries its generator's (kiln/backend/codegens.py puts it there), so the runtime never asks
    which generator printed a graph, and a graph loaded from the AOT graph cache needs no driver."""

    # The kernels compile at their first launch, after the driver returned (Triton's): kiln's code
    # can still fail in the first call, so the compiled graph keeps its ATen graph to run instead.
    compiles_at_first_launch = False

    def build(self, artifact: GraphArtifact) -> str:
        """The path of what `load` loads, built now where the cache lacks it."""
        raise NotImplementedError

    def load(self, artifact: GraphArtifact, library: str, scope: dict[str, Any]) -> dict[str, Any]:
        """Each kernel's callable; binds the index-error flag they report to as `index_error` in `scope`."""
        raise NotImplementedError


class CppLibrary(KernelLibrary):
    """C++ translation units (and the C++ wrapper) built into one shared library, found in the C++
    cache by their hash; each kernel a ctypes function of it."""

    def build(self, artifact: GraphArtifact) -> str:
        if artifact.cpp_wrapper is not None:
            python_door.build_in_background()  # on a machine's first compile, beside the runtime's build
            libkiln.library()  # its symbols global before a wrapper that calls them is loaded
        # The wrapper is straight-line calls: optimizing it buys nothing and cost BERT-base 3.2 s of
        # compile (-O2: 3.7 s, -O0: 0.5 s for its 1,700 lines).
        unit_flags = [[]] * len(artifact.units) + [["-O0"]] if artifact.cpp_wrapper is not None else []
        path, built = build_library(artifact.library_units, unit_flags=unit_flags)
        functions = len({function for function, _ in artifact.kernels.values()})
        compile_time.note(f"{len(artifact.units)} units, {functions} kernels compiled" if built
                          else f"{functions} kernels loaded from the C++ cache")
        return str(path)

    def load(self, artifact: GraphArtifact, library: str, scope: dict[str, Any]) -> dict[str, Any]:
        libkiln.load_if_built()  # first: the kernels' regions then ask its team (kiln_team.h)
        loaded = ctypes.CDLL(library)
        scope["index_error"] = ctypes.c_int.in_dll(loaded, "kiln_index_error")
        kernels = {}
        for kernel, (function, count) in artifact.kernels.items():
            fn = getattr(loaded, function)
            fn.argtypes = [ctypes.c_void_p] * count + [ctypes.c_int64] * len(artifact.size_arguments.get(kernel, ()))
            fn.restype = None
            kernels[kernel] = fn
        return kernels


class TritonModule(KernelLibrary):
    """One Triton module (the artifact's only unit) written to kiln's cache and imported; each
    kernel a launcher of it, its jit functions compiled by Triton at their first launch."""

    compiles_at_first_launch = True

    def build(self, artifact: GraphArtifact) -> str:
        compile_time.note(f"{len(set(f for f, _ in artifact.kernels.values()))} Triton kernels (compiled at first launch)")
        return str(module_path(artifact.units[0]))

    def load(self, artifact: GraphArtifact, library: str, scope: dict[str, Any]) -> dict[str, Any]:
        module = load_module(artifact.units[0], artifact.device)
        scope["index_error"] = ErrorFlag(module.kiln_error_flag)
        return {kernel: getattr(module, function) for kernel, (function, _) in artifact.kernels.items()}


CPP_LIBRARY, TRITON_MODULE = CppLibrary(), TritonModule()


@dataclass
class GraphArtifact:
    units: list[str]  # C++ translation units (the library is found in the C++ cache by their hash)
    python: str  # the generated wrapper
    constants: dict[str, Any]  # wrapper globals that are plain values: layouts, dtypes, arguments
    ops: dict[str, str]  # wrapper globals that are ATen ops, by qualified name
    kernels: dict[str, tuple[str, int]]  # kernel -> (C function, pointer count)
    checks_indices: list[str]  # kernels after which the index-error flag is checked
    report: str  # kernels, ops fused and vectorized (KILN_LOGS=fusion)
    codegen: str  # the name of the code generator that printed the kernels ("cpp", "triton")
    kernel_library: KernelLibrary  # how the runtime builds and loads them: `units` are its input
    device: str  # where the graph's tensors are
    size_arguments: dict[str, list[str]] = field(default_factory=dict)  # kernel -> size symbols after its pointers
    # The C++ wrapper (kiln/codegen/cpp_wrapper.py), a unit of the library, when the graph runs
    # through it; then `python` is the debugging view (and the profiler's instrumented call).
    cpp_wrapper: str | None = None
    num_outputs: int = 0
    # Positions of the integer inputs (symbolic sizes passed as numbers): the C++ wrapper takes
    # them as 0-d int64 tensors.
    number_inputs: tuple[int, ...] = ()
    # Positions of the inputs the graph never reads (one its freezing passes left unread):
    # the C++ wrapper does not take them.
    unused_inputs: tuple[int, ...] = ()
    # A Triton graph's ATen graph, pickled (set when the AOT graph cache stores it): what a
    # loaded graph runs instead if one of its kernels fails at its first launch here.
    aten_graph: bytes | None = None

    @property
    def library_units(self) -> list[str]:
        return [*self.units, self.cpp_wrapper] if self.cpp_wrapper is not None else list(self.units)


def _in_layout(t: torch.Tensor, layout: tuple[tuple[int, ...], tuple[int, ...]]) -> torch.Tensor:
    # Kernels were generated for these strides; a tensor laid out otherwise is copied to them.
    # `layout` is (sizes, strides) as plain ints: this runs for every extern result of every call.
    size, stride = layout
    if t is None or t.stride() == stride or t.numel() <= 1:  # None: an optional result not computed
        return t
    return torch.empty_strided(size, stride, dtype=t.dtype, device=t.device).copy_(t)


_LAYOUT_COPY = profiler.region("kiln layout copy")


def _traced_layout_copy(t: torch.Tensor, layout: tuple[tuple[int, ...], tuple[int, ...]]) -> torch.Tensor:
    if t is None or t.stride() == layout[1] or t.numel() <= 1:
        return t
    with _LAYOUT_COPY:
        return _in_layout(t, layout)


def _raise_index_error(flag: ctypes.c_int | ErrorFlag, kernel: str) -> None:
    when = flag.when() if isinstance(flag, ErrorFlag) else ""
    flag.value = 0
    raise IndexOutOfRange(f"index out of range in kiln kernel {kernel} (an indexing op read outside its input){when}")


def _resolve_op(name: str) -> Any:
    namespace, rest = name.split("::")
    if namespace == "kiln" and rest in native_ops.FAKES:  # kiln's C++ operators, called as a C++ wrapper calls them
        return native_ops.direct(rest)
    packet, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")


def build(artifact: GraphArtifact) -> str | None:
    """The path of what the artifact's kernel library loads, built now where kiln's cache lacks
    it (None when the graph has no kernels). Notes on the open compile-time stage what was built."""
    if not artifact.kernels and artifact.cpp_wrapper is None:
        compile_time.note("no kernels")
        return None
    return artifact.kernel_library.build(artifact)


# Every CompiledGraph alive in this process, built or loaded from the AOT graph cache: the profiler
# finds a model's graphs here (those a call runs) without having watched them being compiled.
LIVE: "weakref.WeakSet[CompiledGraph]" = weakref.WeakSet()


def _constant_ops(artifact: GraphArtifact) -> list[str]:
    # Externs that are not ATen ops ride in the constants under the same `op<step>` name.
    return [name for name, value in artifact.constants.items()
            if name.startswith("op") and name[2:].isdigit() and callable(value)]


def _load_kernels(artifact: GraphArtifact, library: str | None, scope: dict[str, Any]) -> dict[str, Any]:
    """Each kernel's callable (a ctypes function of the C++ library, or a Triton module's
    launcher); binds the index-error flag they report to as `index_error` in `scope`."""
    if library is None or not artifact.kernels:
        return {}
    return artifact.kernel_library.load(artifact, library, scope)


def _cpp_call(library: str, artifact: GraphArtifact) -> Callable[..., tuple]:
    """The graph's C++ wrapper as the graph's `call(*inputs) -> tuple of tensors`; the integers
    at `number_inputs` handed over as 0-d int64 tensors (~1 µs each: the Python wrapper such a
    graph ran before cost ~100 µs more a call), the `unused_inputs` left out."""
    runtime = libkiln.library()
    run = python_door.graph_call(ctypes.CDLL(library).kiln_graph_call, runtime.kiln_error, artifact.num_outputs,
                                 runtime=runtime)
    numbers, unused = artifact.number_inputs, sorted(artifact.unused_inputs, reverse=True)
    if not numbers and not unused:
        return run

    def call(*args: Any) -> tuple:
        args = list(args)
        for k in numbers:
            args[k] = torch.tensor(int(args[k]), dtype=torch.int64)
        for k in unused:  # from the last, so that each position still names its input
            del args[k]
        return run(*args)

    return call


class CompiledGraph:
    """`(*inputs) -> tuple of outputs`: the artifact's wrapper over its loaded kernels.

    `stages` is what the driver built it from (kiln/backend/driver.py `BuiltStages`: the Program,
    the Schedule, the C++ kernels), kept for inspection by tests and dumps; None when the graph
    came from the AOT graph cache.
    """

    def __init__(self, artifact: GraphArtifact, library: str | None, stages: Any = None,
                 eager: Callable | None = None) -> None:
        self.artifact, self.stages = artifact, stages
        # Kernels that compile at their first launch (Triton's, on a GPU; under the interpreter,
        # they first run there) do so after the driver returned: kiln's code failing in the first
        # call makes the graph run through ATen (`eager`, the graph it was lowered from),
        # recorded. C++ kernels were built and loaded before this: nothing is left to fail.
        self.aten = eager if artifact.kernel_library.compiles_at_first_launch else None
        self.eager = self.aten
        self.first_run: bool | None = None if self.eager is not None else True  # None: not yet run
        self._after_first_run: list[Callable[[bool], None]] = []
        scope: dict[str, Any] = {"_in_layout": _in_layout, "empty_strided": torch.empty_strided,
                                 "_raise_index_error": _raise_index_error, **artifact.constants}
        scope.update({name: _resolve_op(op) for name, op in artifact.ops.items()})
        self.kernels = _load_kernels(artifact, library, scope)
        scope.update(self.kernels)
        self._bound = dict(scope)  # the wrapper's globals before it runs, for `instrumented`
        exec(compile(artifact.python, "<kiln wrapper>", "exec"), scope)
        self.call = scope["call"] if artifact.cpp_wrapper is None else _cpp_call(library, artifact)
        self._loaded_call = self.call
        self.region = profiler.graph_label(compile_time.open_stages())  # its range on a profiler's timeline
        self._profiled_call: Callable | None = None
        keep_freed_memory()  # where runtime.keep_freed_mb asks: the next call finds its buffers' memory resident
        LIVE.add(self)

    def bound(self, tail: Sequence[Any]) -> Callable[..., tuple]:
        """`lambda *head: self(*head, *tail)`: the graph with its last inputs fixed (a frozen
        graph's constants). A C++ wrapper's call holds them in C++ (python_door `bind_trailing`)
        while the graph runs as loaded; a profiled call, a first call and a graph that went back
        to ATen take the usual way."""
        tail = tuple(tail)
        loaded = self._loaded_call
        fast = python_door.bind_trailing(loaded, tail)

        def call(*head: Any) -> tuple:
            if self.call is loaded and self.eager is None and not profiler.active():
                return fast(*head)
            return self(*head, *tail)

        return call

    def instrumented(self, wrap: Callable[[str, Any], Any]) -> Callable:
        """A second `call`, from the same wrapper text, where each kernel, extern op and
        `_in_layout` is `wrap(name, original)`: names are the wrapper's globals (kernel names,
        `op<step>` for the extern of schedule step <step>, `_in_layout`).

        Example::

            graph.call = graph.instrumented(lambda name, fn: timed(name, fn))  # and back after
        """
        scope = dict(self._bound)
        for name in [*self.kernels, *self.artifact.ops, *_constant_ops(self.artifact), "_in_layout"]:
            scope[name] = wrap(name, scope[name])
        exec(compile(self.artifact.python, "<kiln wrapper, instrumented>", "exec"), scope)
        return scope["call"]

    def other_call(self, wrapper: Any) -> Callable:
        """The `call` of another Python wrapper (a kiln/codegen/wrapper.py `WrapperCode`) over
        this graph's loaded kernels: how kiln.debug.bisect runs one kernel alone, its wrapper
        printed from a schedule of that kernel only.

        Example::

            run_one = graph.other_call(codegen.python_wrapper(wrapper_plan(one_kernel, set())))
        """
        scope = {**self._bound, **wrapper.constants, **{name: _resolve_op(op) for name, op in wrapper.ops.items()}}
        exec(compile(wrapper.source, "<kiln wrapper, other>", "exec"), scope)
        return scope["call"]

    @classmethod
    def load(cls, artifact: GraphArtifact) -> "CompiledGraph":
        """A graph from the AOT graph cache: its library built if missing, loaded, nothing lowered."""
        eager = pickle.loads(artifact.aten_graph) if artifact.aten_graph is not None else None
        return cls(artifact, build(artifact), eager=eager)

    def saved_artifact(self) -> GraphArtifact:
        """The artifact as the AOT graph cache keeps it: a Triton graph's with its ATen graph."""
        if self.aten is None:
            return self.artifact
        return dataclasses.replace(self.artifact, aten_graph=self.artifact.aten_graph or pickle.dumps(self.aten))

    def on_first_run(self, then: Callable[[bool], None]) -> None:
        """`then(True)` once the first call has completed, `then(False)` once it failed in kiln's
        code and the graph runs through ATen; at once if that is already known."""
        if self.first_run is None:
            self._after_first_run.append(then)
        else:
            then(self.first_run)

    def __call__(self, *args: Any) -> tuple:
        if profiler.active():
            return self._profiled(args)
        if self.eager is not None:
            return self._first_call(args)
        return self.call(*args)

    def _profiled(self, args: tuple) -> tuple:
        """A call while torch.profiler runs: one range for the graph, one event per kernel and
        extern call inside it (kiln/profiler.py)."""
        if self.eager is not None or self.call is not self._loaded_call:  # first call, or ATen's graph instead
            with profiler.region(self.region):
                return self._first_call(args) if self.eager is not None else self.call(*args)
        if self._profiled_call is None:
            self._profiled_call = self.instrumented(self._event)
        with profiler.region(self.region):
            return self._profiled_call(*args)

    def _event(self, name: str, fn: Any) -> Callable:
        if name in self.kernels:
            return profiler.traced(self.artifact.kernels[name][0], fn)  # the generated function's name
        if name == "_in_layout":  # a layout check on every extern result: an event only where it copies
            return _traced_layout_copy
        op = self.artifact.ops.get(name) or getattr(fn, "__name__", None) or name
        return profiler.traced(f"{op} ({name})", fn)

    def _first_call(self, args: tuple) -> tuple:
        try:
            outputs = self.call(*args)
        except IndexOutOfRange:  # kiln's kernels ran and found the inputs at fault: raised as it is
            self.eager = None
            self._ran(True)
            raise
        except Exception as error:  # noqa: BLE001 - told apart from the user's errors below
            return self._fall_back(error, args)
        self.eager = None
        self._ran(True)
        return outputs

    def _fall_back(self, error: Exception, args: tuple) -> tuple:
        """The first call failed: where ATen's graph runs these inputs, the failure was kiln's
        (a kernel Triton rejects, a cast it cannot compile), and from now on ATen's graph runs
        instead, recorded. Where ATen's fails too, the inputs are at fault: the error is raised as
        eager would raise one, and the compiled graph is tried again on the next call."""
        eager = self.eager
        try:
            outputs = tuple(eager(*args))
        except Exception:  # noqa: BLE001 - the user's error, reported as the compiled graph's
            raise error from None
        record_fallback("kiln", "a Triton graph at its first call", error)
        self.eager = None
        self.call = lambda *a: tuple(eager(*a))
        self._ran(False)
        return outputs

    def _ran(self, ok: bool) -> None:
        self.first_run = ok
        waiting, self._after_first_run = self._after_first_run, []
        for then in waiting:
            then(ok)

    # What it was built from, for tests and debug dumps (None after a cache load).
    program = property(lambda self: getattr(self.stages, "program", None))
    schedule = property(lambda self: getattr(self.stages, "schedule", None))
    functions = property(lambda self: self.stages.kernels.functions)
    vectorized = property(lambda self: self.stages.kernels.vectorized)
    source = property(lambda self: self.stages.kernels.source)
    python = property(lambda self: self.artifact.python)
    units = property(lambda self: self.artifact.units)

    def report(self) -> str:
        return self.artifact.report
