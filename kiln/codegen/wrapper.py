"""A lowered Program as a callable: scheduled into fused C++ kernels compiled once per graph,
externs through PyTorch, and a generated straight-line Python function that runs them.

`compile_cpp(gm, example_inputs)` is a graph compiler for `kiln.aot.compile`. Today's limits:
all sizes static (symbolic ones raise NotImplementedError, and the graph falls back).
"""

from __future__ import annotations

import ctypes
import hashlib
import pickle
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import fx
from torch.utils import _pytree as pytree

from kiln import logs
from kiln.codegen.cpp.kernel import is_static, kernel_source
from kiln.codegen.cpp.preamble import preamble
from kiln.ir.analysis import OpCounter, run
from kiln.ir.nodes import Buffer, Layout
from kiln.lowering.graph import GraphLowering, Program
from kiln.passes import run_passes
from kiln.passes.constant_split import split_constants
from kiln.passes.constants import has_frozen_inputs, unmark_frozen
from kiln.runtime.frozen import FrozenArtifact, FrozenProgram
from kiln.runtime.prepacked import DIRECT_CALLS
from kiln.runtime.cpp_compile import load_library, workers
from kiln.schedule import Schedule, schedule
from kiln.schedule.fusion import FusedKernel
from kiln.schedule.memory import MemoryPlan


def _ints(layout: Layout) -> tuple[list[int], list[int]]:
    return [int(s) for s in layout.size], [int(s) for s in layout.stride]


def _sizes_strides(layout: Layout) -> tuple[tuple[int, ...], tuple[int, ...]]:
    size, stride = _ints(layout)
    return tuple(size), tuple(stride)


def _in_layout(t: torch.Tensor, layout: tuple[tuple[int, ...], tuple[int, ...]]) -> torch.Tensor:
    # Kernels were generated for these strides; a tensor laid out otherwise is copied to them.
    # `layout` is (sizes, strides) as plain ints: this runs for every extern result of every call.
    size, stride = layout
    if t.stride() == stride or t.numel() <= 1:
        return t
    return torch.empty_strided(size, stride, dtype=t.dtype).copy_(t)


@dataclass
class CompiledGraph:
    """Everything needed to run a compiled graph again, picklable: what the graph cache stores."""

    units: list[str]  # C++ translation units (the library is found in the C++ cache by their hash)
    python: str  # the generated wrapper
    constants: dict[str, Any]  # wrapper globals that are plain values: layouts, dtypes, arguments
    ops: dict[str, str]  # wrapper globals that are ATen ops, by qualified name
    kernels: dict[str, tuple[str, int]]  # kernel -> (C function, pointer count)
    checks_indices: list[str]  # kernels after which the index-error flag is checked
    report: str


def _op_name(op: Any) -> str | None:
    return op.name() if isinstance(op, torch._ops.OpOverload) else None


def _resolve_op(name: str) -> Any:
    direct = DIRECT_CALLS.get(name)
    if direct is not None:  # kiln's own extern ops, called without the dispatcher's detour
        return direct
    namespace, rest = name.split("::")
    packet, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")


class CppProgram:
    """`program` lowered, scheduled and compiled; calling it runs the graph."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.schedule: Schedule = schedule(program)
        # Kernels are printed under a placeholder name and named by content, so the identical
        # kernels of repeated layers are compiled once.
        sources, self.functions, self.vectorized, checks = {}, {}, {}, []
        for kernel in self.schedule.kernels:
            if not is_static(kernel):
                raise NotImplementedError("C++ kernels with symbolic sizes")
            text, vectorized = kernel_source(kernel, "KILN_KERNEL")
            function = f"kernel_{hashlib.sha256(text.encode()).hexdigest()[:16]}"
            sources.setdefault(function, text.replace("KILN_KERNEL", function))
            self.functions[kernel.name] = function
            self.vectorized[kernel.name] = vectorized
            if "kiln_index(" in text or "kiln::vindex(" in text:
                checks.append(kernel.name)  # indirect indexing: check the error flag after
        self.source = "\n\n".join([preamble(), *sources.values()])
        kernels = {k.name: (self.functions[k.name], len(k.inputs) + len(k.outputs)) for k in self.schedule.kernels}
        constants, ops = {}, {}
        python = self._generate_call(constants, ops, set(checks))
        self.artifact = CompiledGraph(_translation_units(list(sources.values())), python, constants, ops, kernels,
                                      checks, self._report())
        self._load(self.artifact)
        logs.log("fusion", "%s", self.artifact.report)

    @classmethod
    def load(cls, artifact: CompiledGraph) -> "CppProgram":
        """A program from the graph cache: its library loaded, nothing lowered or generated."""
        self = cls.__new__(cls)
        self.program = self.schedule = None
        self.artifact = artifact
        self._load(artifact)
        return self

    def _load(self, artifact: CompiledGraph) -> None:
        self.python, self.units = artifact.python, artifact.units
        library = load_library(artifact.units) if artifact.kernels else None
        scope: dict[str, Any] = {"_in_layout": _in_layout, "empty_strided": torch.empty_strided,
                                 "_raise_index_error": _raise_index_error, **artifact.constants}
        scope.update({name: _resolve_op(op) for name, op in artifact.ops.items()})
        if library is not None:
            scope["index_error"] = ctypes.c_int.in_dll(library, "kiln_index_error")
        self.kernels = {}
        for kernel, (function, count) in artifact.kernels.items():
            fn = getattr(library, function)
            fn.argtypes = [ctypes.c_void_p] * count
            fn.restype = None
            self.kernels[kernel] = scope[kernel] = fn
        exec(compile(artifact.python, "<kiln wrapper>", "exec"), scope)
        self.call = scope["call"]

    def report(self) -> str:
        return self.artifact.report

    def _report(self) -> str:
        """Kernels, ops fused per kernel and the share vectorized, for KILN_LOGS=fusion."""
        kernels = self.schedule.kernels
        lines = [f"{len(kernels)} kernels ({sum(self.vectorized.values())} vectorized, {len(set(self.functions.values()))} distinct) and "
                 f"{len(self.schedule.externs)} extern calls from {len(self.program.kernels)} IR nodes"]
        for k in kernels:
            members = ", ".join(f"{m.name}{'(local)' if m.name in k.locals else ''}" for m in k.members)
            ops = sum(_op_count(m.node) for m in k.members)
            lines.append(f"  {k.name}: {ops} ops, outer {list(k.outer)} [{members}]{' vectorized' if self.vectorized[k.name] else ''}")
        return "\n".join(lines)

    def _generate_call(self, constants: dict[str, Any], ops: dict[str, str], checks: set[str]) -> str:
        """The schedule as straight-line Python: allocate, call kernels and externs, free, return.
        Generated once, so a call pays no interpretation of the step list. Plain values it needs
        go to `constants`, ATen ops to `ops`."""
        lines = []
        params = [b.name if b is not None else f"_unused{k}" for k, b in enumerate(self.program.inputs)]
        for b in self.program.inputs:
            if b is not None:
                constants[f"layout_{b.name}"] = _sizes_strides(b.layout)
                lines.append(f"{b.name} = _in_layout({b.name}, layout_{b.name})")
        memory = self.schedule.memory
        reused = set(memory.reuses.values())
        for k, step in enumerate(self.schedule.steps):
            if isinstance(step, FusedKernel):
                lines += _kernel_call(step, constants, memory, step.name in checks)
            else:
                lines += _extern_call(k, step, constants, ops, memory.extern_inplace.get(k))
            dead = [name for name in memory.frees.get(k, []) if name not in reused]
            if dead:
                lines.append(f"del {', '.join(dead)}")
        returns = []
        for k, o in enumerate(self.program.outputs):
            if isinstance(o, Buffer):
                returns.append(o.name)
            else:
                constants[f"out_const{k}"] = o
                returns.append(f"out_const{k}")
        body = "\n".join(f"    {line}" for line in lines) or "    pass"
        return f"def call({', '.join(params)}):\n{body}\n    return ({', '.join(returns)}{',' if len(returns) == 1 else ''})\n"

    def __call__(self, *args: Any) -> tuple:
        return self.call(*args)


def _op_count(node: Any) -> int:
    """Computing ops in one element of `node` (loads, stores and constants not counted)."""
    counts = run(OpCounter(), node).counts
    return sum(n for op, n in counts.items() if op not in ("load", "store", "constant", "index_expr"))


def _kernel_call(kernel: FusedKernel, constants: dict, memory: MemoryPlan, check: bool) -> list[str]:
    lines = []
    for b in kernel.outputs:
        if b.name in memory.reuses:  # the dead buffer's name goes with its memory
            lines.append(f"{b.name} = {memory.reuses[b.name]}; del {memory.reuses[b.name]}")
        elif b.name in memory.inplace:  # the input's name dies after the call, as it would anyway
            lines.append(f"{b.name} = {memory.inplace[b.name]}")
        else:
            size, stride = _ints(b.layout)
            constants[f"dtype_{b.name}"] = b.layout.dtype
            lines.append(f"{b.name} = empty_strided({size}, {stride}, dtype=dtype_{b.name})")
    ptrs = ", ".join(f"{b.name}.data_ptr()" for b in kernel.inputs + kernel.outputs)
    lines.append(f"{kernel.name}({ptrs})")
    if check:
        lines.append(f"if index_error.value: _raise_index_error(index_error, {kernel.name!r})")
    return lines


def _extern_call(k: int, step, constants: dict, ops: dict, into: str | None = None) -> list[str]:
    """`into`: a kiln::conv whose result the memory plan writes over its added input."""
    name = _op_name(step.op)
    if name is not None:
        ops[f"op{k}"] = name
    else:
        constants[f"op{k}"] = step.op  # not an ATen op: kept as is (such a graph is not cacheable)
    names: dict[str, Any] = {}

    def arg(value: Any) -> str:
        if isinstance(value, Buffer):
            return value.name
        key = f"const{k}_{len(names)}"
        names[key] = value
        return key

    step_args = list(step.args)
    if into is not None:
        step_args[11] = "onednn_into_other"
    args = pytree.tree_map(arg, step_args, is_leaf=lambda v: isinstance(v, Buffer))
    kwargs = pytree.tree_map(arg, dict(step.kwargs), is_leaf=lambda v: isinstance(v, Buffer))
    constants.update(names)
    call = f"op{k}({', '.join(_render(a) for a in args)}{', ' if args and kwargs else ''}" \
           f"{', '.join(f'{key}={_render(v)}' for key, v in kwargs.items())})"
    outs, lines = step.outputs, []
    if len(outs) == 1 and outs[0] is not None:
        lines.append(f"{outs[0].name} = {call}")
    else:
        lines.append(f"_result = {call}")
        lines += [f"{b.name} = _result[{i}]" for i, b in enumerate(outs) if b is not None]
    for b in outs:
        if b is not None and step.op is not torch.ops.aten.as_strided.default and b.layout.is_static:
            constants[f"layout_{b.name}"] = _sizes_strides(b.layout)
            lines.append(f"{b.name} = _in_layout({b.name}, layout_{b.name})")
    return lines


def _translation_units(kernels: list[str]) -> list[str]:
    """Kernels split into about one unit per compile worker (each unit also parses the preamble,
    so small graphs stay one unit); the first unit defines the shared error flag."""
    count = max(1, min(workers(), len(kernels) // 4))
    chunks = [kernels[k::count] for k in range(count)]
    return [preamble(defines_flag=k == 0) + "\n\n" + "\n\n".join(chunk) for k, chunk in enumerate(chunks)]


def _raise_index_error(flag: ctypes.c_int, kernel: str) -> None:
    flag.value = 0
    raise IndexError(f"index out of range in kiln kernel {kernel} (an indexing op read outside its input)")


def _render(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_render(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(_render(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    return str(value)


def _save(compiled: Any) -> CompiledGraph | FrozenArtifact | None:
    """What the AOT graph cache stores for `compiled`, or None when it holds unpicklable values."""
    if isinstance(compiled, FrozenProgram):
        return compiled.artifact(_save)
    if not isinstance(compiled, CppProgram):
        return None
    try:
        pickle.dumps(compiled.artifact)
    except Exception:  # noqa: BLE001 - e.g. a non-ATen extern: not cached, still correct
        return None
    return compiled.artifact


def compile_cpp(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> CppProgram:
    """Lower `gm`, schedule and compile its kernels; the result runs the graph. A graph with
    symbolic sizes is compiled per concrete size set at call time (kiln/codegen/specialize.py)."""
    from kiln.codegen import dump
    from kiln.codegen.specialize import Specialized, has_symbolic_sizes, reads_input_values

    if has_symbolic_sizes(gm, inputs_only=True) or reads_input_values(gm):
        return Specialized(gm, compile_cpp)
    gm = run_passes(gm)
    if has_frozen_inputs(gm):
        split = split_constants(gm)
        if split is not None:
            return FrozenProgram(split, compile_cpp(split.runtime, [n.meta.get("val") for n in split.runtime.graph.nodes if n.op == "placeholder"]))
        unmark_frozen(gm)
    try:
        compiled = CppProgram(GraphLowering(gm).lower())
    except NotImplementedError as error:
        if not has_symbolic_sizes(gm):
            raise
        # Sizes computed from tensor values inside the graph (unique, nonzero, masks) that an op
        # kiln lowers depends on: the graph runs through ATen, op by op, recorded as a fallback.
        from kiln.runtime.fallback import record_fallback

        record_fallback("kiln", "graph with data-dependent sizes", error)
        return gm
    dump.dump(gm, compiled)
    return compiled


compile_cpp.save = _save  # the AOT graph cache's protocol (kiln/aot/cache.py)
def _load(artifact: CompiledGraph | FrozenArtifact) -> Any:
    if isinstance(artifact, FrozenArtifact):
        return FrozenProgram.load(artifact, _load)
    return CppProgram.load(artifact)


compile_cpp.load = _load
