"""The AOT graph cache: a later process that meets the same torch-level graph with the same input
layouts skips tracing, partitioning and compiling, and loads what the first one built.

Only graph compilers that can save and restore what they build take part (`SavingGraphCompiler`
in kiln/aot/compile.py, which kiln's backend driver is).
The key covers the graph's code, every input's and lifted parameter's layout and requires_grad,
the values of tensor constants, grad mode, CPU autocast and the default dtype, the options, the
machine (the CPU's model and ISA, `disk_cache.cpu_identity`, and torch's thread count: a graph
carries the autotuner's answers for them), and the versions of torch and of kiln's own source
(every file of it, the runtime's C++ included). A graph with symbolic sizes is keyed by its
inputs' symbolic layouts and the shape environment's guards, replacements and ranges, so one
entry serves every size; graphs handed fake inputs are not cached. What tracing and compiling such
a graph added to the shape environment (a size specialized to 0 or 1, two sizes found equal) is
not in the key, which is computed before them: each variant stored under a key records those
guards, a load takes the first whose guards hold for this call's sizes and adds them to this
frame's guards, and a call where none holds builds and stores another variant.
"""

from __future__ import annotations

import hashlib
import pickle
from dataclasses import dataclass
from typing import Any, Sequence

import sympy
import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils import _pytree as pytree

from kiln import disk_cache, logs
from kiln.aot.signature import Signature
from kiln.ir.sizes import size_examples


@dataclass
class CachedVariant:
    sig: Signature
    out_spec: str  # pytree.treespec_dumps
    payloads: list[Any]  # the compile_graph's saved graphs: [inference] or [forward, backward]
    num_saved_tensors: int = 0
    # The shape environment's guards its tracing and compiling added (sympy expressions over the
    # capture's size symbols): true for the sizes it was built for, maybe false for another's.
    added_guards: tuple[Any, ...] = ()


def _describe(value: Any) -> str | None:
    if isinstance(value, torch._subclasses.FakeTensor) or isinstance(value, torch.SymInt):
        return None
    if isinstance(value, torch.Tensor):
        return f"T{tuple(value.shape)}{value.stride()}{value.storage_offset()}{value.dtype}{value.device}{value.requires_grad}"
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    return None


def _constants(gm: fx.GraphModule, lifted: set[str]) -> bytes:
    h = hashlib.sha256()
    for node in gm.graph.nodes:
        if node.op == "get_attr" and node.target not in lifted:
            value = getattr(gm, node.target, None)
            if isinstance(value, torch.Tensor):
                h.update(value.detach().contiguous().cpu().numpy().tobytes() if value.numel() else b"")
    return h.digest()


def placeholder_values(gm: fx.GraphModule) -> list[Any]:
    """The values a captured graph's placeholders were traced with (fake tensors, SymInts)."""
    return [node.meta.get("example_value", node.meta.get("val")) for node in gm.graph.nodes if node.op == "placeholder"]


def _is_symbolic(value: Any) -> bool:
    return isinstance(value, torch.SymInt) or (isinstance(value, torch.Tensor) and
                                               any(not isinstance(size, int) for size in value.shape))


def _describe_traced(value: Any, example: Any) -> str | None:
    """A placeholder of a graph with symbolic sizes, by its traced value: sizes and strides as
    expressions over the capture's size symbols, so every size the graph serves has one key."""
    if isinstance(value, torch.SymInt):
        return f"I{value.node.expr}"
    if isinstance(value, torch._subclasses.FakeTensor):
        layout = (tuple(map(str, value.shape)), tuple(map(str, value.stride())), str(value.storage_offset()))
        return f"T{layout}{value.dtype}{value.device}{value.requires_grad}"
    return _describe(example)


def shape_env(values: Sequence[Any]) -> ShapeEnv | None:
    """The shape environment of a graph's symbolic placeholder values (None: all static)."""
    return next((v.node.shape_env if isinstance(v, torch.SymInt) else v.fake_mode.shape_env
                 for v in values if _is_symbolic(v)), None)


def _shape_facts(values: Sequence[Any]) -> str:
    """What the shape environment knew when the graph was handed over: its guards, replacements
    and the ranges of the size symbols. A graph compiled under other facts (a size guarded equal to
    another, a range from a branch) is compiled differently and must not be loaded for this one."""
    env = shape_env(values)
    guards = [str(guard.expr) for guard in env.guards]
    replacements = sorted(f"{k}={v}" for k, v in env.replacements.items())
    ranges = sorted(f"{k}:{v}" for k, v in env.var_to_range.items())
    return repr((guards, replacements, ranges))


def cache_key(gm: fx.GraphModule, example_inputs: Sequence[Any], lifted: dict[str, Any], training: bool, options: Any) -> str | None:
    """The key of `gm` compiled for these inputs, or None when it cannot be cached."""
    traced = placeholder_values(gm)
    # A graph captured with symbolic sizes has the same code as its static twin and is handed
    # real example inputs: it is keyed by its symbolic layouts and shape facts, never by the
    # example sizes (which would load the twin, compiled for those sizes only).
    symbolic = len(traced) == len(example_inputs) and any(_is_symbolic(v) for v in traced)
    if symbolic:
        inputs = [_describe_traced(v, a) for v, a in zip(traced, example_inputs)] + [_shape_facts(traced)]
    elif any(_is_symbolic(v) for v in traced):
        return None
    else:
        inputs = [_describe(v) for v in example_inputs]
    described = [_describe(v) for v in lifted.values()] + inputs
    if any(d is None for d in described):
        return None
    # Ambient state the trace bakes in: autocast's casts (a graph traced under autocast differs)
    # and the default dtype of factory calls.
    # (CUDA's autocast too: found on an H200, where a float32 BERT loaded the graph its bfloat16
    # autocast run had stored.)
    ambient = repr((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
                    torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"), torch.get_default_dtype()))
    # The machine's decisions the compiled graph carries: the autotuner's answers, measured on this
    # CPU at this thread count, and the kernels chosen for its ISA. (Shared through the remote
    # tier, an entry would otherwise bring one machine's choices to another.)
    machine = repr((disk_cache.cpu_identity(), torch.get_num_threads()))
    parts = [gm.code, *lifted, *described, repr(training), repr(options), ambient, machine, torch.__version__,
             disk_cache.kiln_fingerprint()]
    h = hashlib.sha256("\0".join(parts).encode())
    h.update(_constants(gm, set(lifted)))
    return h.hexdigest()


def guards_added_since(env: ShapeEnv | None, count: int) -> tuple[Any, ...]:
    """The guards `env` gained after its first `count`: what a build decided about the sizes."""
    return tuple(guard.expr for guard in env.guards[count:]) if env is not None else ()


def fitting_variant(variants: Sequence[CachedVariant], env: ShapeEnv | None) -> tuple[CachedVariant | None, list[Any], str]:
    """The first of a key's variants whose added guards hold for the sizes `env`'s symbols have
    now, and those guards over `env`'s symbols (to add to it once the variant is loaded: the frame
    then guards what the loaded graph assumes); else None, [] and a guard that does not hold."""
    unmet = ""
    for variant in variants:
        guards, unmet = _guards_here(variant.added_guards, env)
        if not unmet:
            return variant, guards, ""
    return None, [], unmet


def _guards_here(added_guards: Sequence[Any], env: ShapeEnv | None) -> tuple[list[Any], str]:
    """`added_guards` over `env`'s symbols, and "" if they hold for its values, else the first false one."""
    if not added_guards:
        return [], ""
    if env is None:
        return [], "a guard over sizes, for a graph without symbolic sizes"
    values = size_examples(env)  # each backed symbol's value for this call
    symbols = {str(symbol): symbol for symbol in values}
    guards = []
    for guard in added_guards:
        # (Symbols unpickled here are matched to this environment's by name: the key holds the names.)
        names = {symbol: symbols.get(str(symbol)) for symbol in guard.free_symbols}
        if None in names.values():
            return [], f"{guard} (a symbol this capture does not have)"
        guard = guard.xreplace(names)
        if not bool(guard.xreplace({symbol: sympy.Integer(values[symbol]) for symbol in guard.free_symbols})):
            return [], str(guard)
        guards.append(guard)
    return guards, ""


# A key's variants kept: one per set of added guards (a size specialized to 0, to 1, or left symbolic).
MAX_VARIANTS = 4


def load(key: str) -> list[CachedVariant] | None:
    """The variants stored under `key` (newest last), or None."""
    variants = _read(key)
    if variants:
        logs.log("cache", "AOT graph cache hit %s", key[:12])
    return variants or None


def _read(key: str) -> list[CachedVariant]:
    data = disk_cache.read(disk_cache.entry("aot", key, ".pkl"))
    if data is None:
        return []
    try:
        variants = pickle.loads(data)
    except Exception:  # noqa: BLE001 - an entry that does not unpickle is rebuilt
        return []
    if not (isinstance(variants, list) and all(isinstance(v, CachedVariant) for v in variants)):
        return []
    return variants


def store(key: str, entry: CachedVariant) -> None:
    """Adds `entry` to `key`'s variants, in place of one built under the same added guards."""
    kept = [v for v in _read(key) if repr(v.added_guards) != repr(entry.added_guards)]
    try:
        data = pickle.dumps([*kept[-(MAX_VARIANTS - 1):], entry])
    except Exception as error:  # noqa: BLE001 - what cannot be pickled is simply not cached
        logs.log("cache", "AOT graph not cached: %s", error)
        return
    disk_cache.write(disk_cache.entry("aot", key, ".pkl"), data)


def drop(key: str) -> None:
    """Forget the entry of `key`: a graph loaded from it failed where it ran."""
    disk_cache.remove(disk_cache.entry("aot", key, ".pkl"))
    logs.log("cache", "AOT graph cache entry %s dropped", key[:12])


def dumps_spec(spec: pytree.TreeSpec) -> str | None:
    try:
        return pytree.treespec_dumps(spec)
    except Exception:  # noqa: BLE001 - output structures pytree cannot serialize are not cached
        return None
