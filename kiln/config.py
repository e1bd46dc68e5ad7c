"""Typed settings, grouped by area, each mirrored by a ``KILN_*`` environment variable.

Read a setting as an attribute of its group; change it by assignment (checked against the
declared type) or, in tests and experiments, with :func:`patch`, which puts it back afterwards::

    import kiln
    kiln.config.debug.dump_dir            # None, or $KILN_DEBUG_DIR
    kiln.config.bench.iters = 50          # a str here would raise TypeError
    with kiln.config.patch({"bench.iters": 5}):
        ...

Adding a setting: declare a field with :func:`setting` in its group below. Adding a group: a
class decorated with ``@_group("area")``, a module-level instance, and an entry in ``_GROUPS``.
Every ``KILN_*`` variable kiln reads must be a setting here, because unknown ones are reported
as likely typos.

This module must not import torch: it is read at ``import kiln`` and by tools that only need
settings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import numbers
import os
import re
import sys
import types
import typing
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = [
    "BenchSettings",
    "CacheSettings",
    "CaptureSettings",
    "DebugSettings",
    "as_dict",
    "bench",
    "cache",
    "cache_dir",
    "capture",
    "changed",
    "debug",
    "describe",
    "patch",
    "reload_from_env",
    "setting",
]

ENV_PREFIX = "KILN_"

# ``KILN_*`` variables kiln reads that are deliberately not settings: secrets, which as_dict()
# and describe() must never show. They are not reported as typos.
READ_ELSEWHERE = {
    "KILN_REMOTE_CACHE_SECRET": "the key that signs and checks remote cache entries (kiln/remote_cache.py)",
}


# --- types a setting can have ----------------------------------------------------------------

_REJECT = object()  # returned by a converter for a value of the wrong type


@dataclasses.dataclass(frozen=True)
class _Kind:
    """How one declared type is checked on assignment and parsed from the environment."""

    name: str  # shown in errors and describe(), e.g. "tuple[str, ...]"
    form: str  # the accepted environment spelling, shown when parsing fails
    convert: Callable[[object], object]  # value -> stored value, or _REJECT
    parse: Callable[[str], object]  # env text -> value; raises ValueError


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse_bool(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError(text)


def _split_names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _to_names(value: object) -> object:
    if isinstance(value, str):
        return _split_names(value)
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        return tuple(value)
    return _REJECT


def _is_int(value: object) -> bool:
    # bool is an int subclass, but True as an iteration count is always a mistake.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


_KINDS: dict[object, _Kind] = {
    bool: _Kind(
        "bool",
        "one of 1/0, true/false, yes/no, on/off (any case)",
        lambda v: v if isinstance(v, bool) else _REJECT,
        _parse_bool,
    ),
    int: _Kind(
        "int",
        "an integer, e.g. 20",
        lambda v: int(v) if _is_int(v) else _REJECT,
        lambda text: int(text.strip()),
    ),
    float: _Kind(
        "float",
        "a number, e.g. 900 or 0.5",
        lambda v: float(v) if isinstance(v, numbers.Real) and not isinstance(v, bool) else _REJECT,
        lambda text: float(text.strip()),
    ),
    str: _Kind("str", "any text", lambda v: v if isinstance(v, str) else _REJECT, str),
    tuple[str, ...]: _Kind(
        "tuple[str, ...]",
        "comma-separated names, e.g. graph,code",
        _to_names,
        _split_names,
    ),
}


def _optional(kind: _Kind) -> _Kind:
    # An empty variable means "not set": `KILN_DEBUG_DIR= cmd` turns dumping off.
    return _Kind(
        f"{kind.name} | None",
        f"{kind.form}, or empty for None",
        lambda v: None if v is None else kind.convert(v),
        lambda text: None if text == "" else kind.parse(text),
    )


def _kind_for(hint: object) -> _Kind:
    if hint in _KINDS:
        return _KINDS[hint]
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 2:
        inner = [arg for arg in args if arg is not type(None)]
        if len(inner) == 1 and inner[0] in _KINDS:
            return _optional(_KINDS[inner[0]])
    supported = ", ".join(kind.name for kind in _KINDS.values())
    raise TypeError(f"settings may be {supported}, or one of those | None; not {hint!r}")


# --- declaring settings ----------------------------------------------------------------------


def setting(default: object, *, env: str, help: str) -> typing.Any:
    """Declare one setting in a group: its default, environment variable and one-line help.

    Example::

        @_group("bench")
        class BenchSettings(_Group):
            iters: int = setting(20, env="KILN_BENCH_ITERS", help="timed iterations")
    """
    if not env.startswith(ENV_PREFIX):
        raise ValueError(f"environment variable {env!r} must start with {ENV_PREFIX!r}")
    return dataclasses.field(default=default, metadata={"env": env, "help": help})


@dataclasses.dataclass(frozen=True)
class _Spec:
    """Everything declared about one setting."""

    name: str  # "group.field"
    kind: _Kind
    default: object
    env: str
    help: str

    def check(self, value: object) -> object:
        stored = self.kind.convert(value)
        if stored is _REJECT:
            raise TypeError(
                f"{self.name} expects {self.kind.name}, got {value!r} ({type(value).__name__})"
            )
        return stored

    def from_env(self, text: str) -> object:
        try:
            return self.kind.parse(text)
        except ValueError:
            raise ValueError(
                f"environment variable {self.env}={text!r} is not valid for {self.name}: "
                f"expected {self.kind.form}"
            ) from None


class _Group:
    """Base of every settings group: a dataclass whose assignments are type-checked."""

    _area: typing.ClassVar[str]
    _specs: typing.ClassVar[dict[str, _Spec]]

    def __setattr__(self, field: str, value: object) -> None:
        spec = self._specs.get(field)
        if spec is None:
            raise _unknown(f"{self._area}.{field}")
        object.__setattr__(self, field, spec.check(value))

    def __getattr__(self, field: str) -> typing.NoReturn:
        # Only reached for names that do not exist; keep Python's protocol probes quiet.
        if field.startswith("__"):
            raise AttributeError(field)
        raise _unknown(f"{self._area}.{field}")


def _group(area: str) -> Callable[[type], type]:
    """Make a class a settings group named ``area``: a dataclass with checked fields."""

    def wrap(cls: type) -> type:
        cls._area = area
        cls = dataclasses.dataclass(cls)
        hints = typing.get_type_hints(cls)
        specs = {}
        for field in dataclasses.fields(cls):
            if "env" not in field.metadata:
                raise TypeError(f"{area}.{field.name} must be declared with setting(...)")
            specs[field.name] = _Spec(
                name=f"{area}.{field.name}",
                kind=_kind_for(hints[field.name]),
                default=field.default,
                env=field.metadata["env"],
                help=field.metadata["help"],
            )
        cls._specs = specs
        return cls

    return wrap


# --- the settings ----------------------------------------------------------------------------


@_group("debug")
class DebugSettings(_Group):
    """What kiln reports about its own work: log artifacts and per-graph dump files."""

    logs: tuple[str, ...] = setting(
        (),
        env="KILN_LOGS",
        help="which named log artifacts are on, e.g. graph,code or all (see kiln.logs)",
    )
    dump_dir: str | None = setting(
        None,
        env="KILN_DEBUG_DIR",
        help="folder that every layer dumps per-graph debug files into; None for no dumps",
    )
    trace_dir: str | None = setting(
        None,
        env="KILN_TRACE",
        help="folder for the HTML compile report (index.html per process, with every stage's dumps); None for none",
    )
    verify: bool = setting(
        False,
        env="KILN_VERIFY",
        help="check every graph after each pass, after lowering and after scheduling (slower compiles)",
    )


@_group("cache")
class CacheSettings(_Group):
    """Where compiled artifacts persist between processes."""

    dir: str = setting(
        "~/.cache/kiln",
        env="KILN_CACHE_DIR",
        help="root folder of the on-disk compile caches (~ is expanded); refused if others can write it",
    )
    runtime_dir: str = setting(
        "",
        env="KILN_RUNTIME_CACHE_DIR",
        help="where kiln's own libraries (its runtime over libtorch, its CPython extension) are cached, and "
        "the objects of kiln's runtime and kernels that every kiln.export links; empty for under cache.dir. "
        "They depend only on the machine, compiler, torch and Python",
    )
    prebuilt_dir: str = setting(
        "",
        env="KILN_PREBUILT_DIR",
        help="where `kiln prebuild` (run by the README's set-up) puts kiln's own libraries at install "
        "time, looked up before cache.runtime_dir; empty for <the environment's prefix>/share/kiln",
    )
    remote: str = setting(
        "",
        env="KILN_REMOTE_CACHE",
        help="a shared cache tier under the disk cache, redis://[[user]:password@]host[:port][/db] "
        "(rediss:// for TLS; needs kiln's `remote` extra, redis-py); empty for none "
        "(KILN_REMOTE_CACHE_SECRET, if set, signs and checks its entries)",
    )
    remote_connect_timeout_s: float = setting(
        5.0,
        env="KILN_REMOTE_CACHE_CONNECT_TIMEOUT",
        help="seconds to wait for a connection to the cache.remote server (and its TLS handshake) "
        "before the tier is switched off for the process",
    )
    remote_timeout_s: float = setting(
        5.0,
        env="KILN_REMOTE_CACHE_TIMEOUT",
        help="seconds one read or write on the cache.remote connection may wait for the server "
        "before the tier is switched off for the process",
    )


@_group("backend")
class BackendSettings(_Group):
    """How kiln's backend builds the kernels of a graph."""

    compile_workers: int = setting(
        0,
        env="KILN_COMPILE_WORKERS",
        help="C++ compiler processes (Triton compile worker processes on a GPU) run at once for one graph's kernels; "
        "0 for one per CPU core",
    )
    freezing: bool = setting(
        True,
        env="KILN_FREEZING",
        help="in inference, treat parameters and buffers as constants (folded, prepacked); re-frozen when changed",
    )
    autotune: str = setting(
        "default",
        env="KILN_AUTOTUNE",
        help="how GEMM and convolution implementations are chosen: off (fixed rules), default, max-autotune, "
        "record (questions the caches cannot answer are logged, not measured: `kiln autotune --answer`)",
    )
    autotune_log: str = setting(
        "",
        env="KILN_AUTOTUNE_LOG",
        help="where backend.autotune=record appends its questions (empty: <cache dir>/autotune/recorded.jsonl)",
    )
    codegen: str = setting(
        "auto",
        env="KILN_CODEGEN",
        help="code generator for kernels: auto (C++ on CPU, Triton on CUDA), cpp, or triton "
        "(on CPU tensors through Triton's interpreter: how the Triton printer is tested without a GPU)",
    )
    symbolic_kernels: bool = setting(
        True,
        env="KILN_SYMBOLIC_KERNELS",
        help="compile a graph with symbolic sizes once, kernels taking the sizes as arguments; "
        "off (or where kiln cannot) it is compiled again for each new set of sizes",
    )
    cpp_wrapper: bool = setting(
        True,
        env="KILN_CPP_WRAPPER",
        help="run each compiled CPU graph through a generated C++ wrapper (one call from Python per graph, "
        "not one per kernel); off: the Python wrapper, which stays the debugging view either way",
    )
    cuda_graphs: bool = setting(
        False,
        env="KILN_CUDA_GRAPHS",
        help="replay each compiled CUDA inference graph as one CUDA graph (what mode='reduce-overhead' turns on)",
    )
    cuda_graph_sizes: int = setting(
        8,
        env="KILN_CUDA_GRAPH_SIZES",
        help="CUDA graphs recorded per compiled graph, one per set of input sizes; beyond, calls run without one",
    )
    triton_direct_launch: bool = setting(
        True,
        env="KILN_TRITON_DIRECT_LAUNCH",
        help="launch a GPU graph's Triton kernels straight to their compiled binaries after each launch's "
        "first call (alignment and device checked per call); off: through Triton's fn[grid](...) every time",
    )
    triton_gemm: str = setting(
        "auto",
        env="KILN_TRITON_GEMM",
        help="a matrix product fused with its pointwise consumer into one Triton kernel: auto (always "
        "under the interpreter on CPU; timed on CUDA), always, timed (the fused kernel timed against "
        "the library's product and a separate kernel at the first call, the faster kept), never",
    )
    disabled_passes: tuple[str, ...] = setting(
        (),
        env="KILN_DISABLED_PASSES",
        help="rewrite passes the backend skips, e.g. gemm_prepack,dead_code (names in kiln/passes/pipeline.py "
        "REWRITES): how kiln.debug.bisect finds the pass that changes a result; empty: every pass runs",
    )
    gemm_candidates: tuple[str, ...] = setting(
        (),
        env="KILN_GEMM_CANDIDATES",
        help="GEMM implementations the autotuner may choose from, e.g. mkl,kiln (names of "
        "kiln.externs.prepacked.MM_IMPLS, or onednn_post_op); empty for all; aten, the fallback, always",
    )
    huge_pages: bool = setting(
        True,
        env="KILN_HUGE_PAGES",
        help="kiln's packed weights (its GEMM's panels, its quantized panels) and its runtime's buffers in memory advised as 2 MB "
        "transparent huge pages, where the kernel allows them (transparent_hugepage `madvise` or `always`): "
        "a decode step streams them from DRAM with fewer TLB misses (docs/gemm.md); off: PyTorch's allocator",
    )
    fp32_gemm: str = setting(
        "fp32",
        env="KILN_FP32_GEMM",
        help="how float32 products with a frozen weight multiply: fp32, or bf16 (fast math, as oneDNN's "
        "FPMATH_MODE=BF16: the weight and the activations rounded to bfloat16, sums, epilogues and "
        "outputs float32, in kiln's GEMM for every such product; docs/gemm.md)",
    )


@_group("capture")
class CaptureSettings(_Group):
    """How kiln.compile captures graphs from Python bytecode."""

    recompile_limit: int = setting(
        8,
        env="KILN_RECOMPILE_LIMIT",
        help="compiled entries kept per function (and sizes per symbolic graph); calls beyond run eagerly",
    )
    inline_depth: int = setting(
        64, env="KILN_INLINE_DEPTH", help="deepest chain of user calls the interpreter inlines"
    )
    scalar_outputs: bool = setting(
        False,
        env="KILN_CAPTURE_SCALAR_OUTPUTS",
        help="keep tensor.item(), tolist(), int()/float()/bool() of a tensor in the graph as data-dependent "
        "symbolic numbers (Dynamo's capture_scalar_outputs; always so under fullgraph=True) instead of breaking "
        "the graph there; kiln's own backend compiles such a graph per value read from an input and runs "
        "one reading a computed tensor through ATen",
    )
    dynamic_ints: bool = setting(
        True,
        env="KILN_DYNAMIC_INTS",
        help="an int argument (or an item or attribute of one) whose value changed between calls is captured "
        "again as a symbolic int, so later values reuse that capture (as Dynamo's automatic dynamic shapes); "
        "kiln.compile(dynamic=True) makes int arguments symbolic from the first capture",
    )
    dynamic_sources: tuple[str, ...] = setting(
        (),
        env="KILN_DYNAMIC_SOURCES",
        help="inputs made symbolic from the first capture, whatever `dynamic` says, as torch.compiler.config."
        "dynamic_sources: names as kiln's guards print them (L['x'], L['self'].step, L['y'][1]) or regular "
        "expressions matching a whole name; a tensor's every dimension, or only dimension N with a ':N' suffix",
    )
    error_on_fx_trace: bool = setting(
        True,
        env="KILN_ERROR_ON_FX_TRACE",
        help="torch.fx.symbolic_trace through a function kiln.compile made raises (as Dynamo's "
        "error_on_nested_fx_trace: FX would record the original ops, past kiln); off: FX traces the original function",
    )
    greedy_loop: bool = setting(
        True,
        env="KILN_GREEDY_LOOP",
        help="a greedy or sampling HuggingFace `generate` through kiln.compile(model) runs kiln's decoding loop "
        "(kiln/capture/hf_greedy.py: HF's tokens and random draws, less Python between the steps); off: HF's `_sample`",
    )
    settled_steps: bool = setting(
        True,
        env="KILN_SETTLED_STEPS",
        help="once kiln's greedy decoding loop runs nothing but its own code between the steps, a step's guard check "
        "reads only its new arguments and its frozen weights are stamped once a generate (kiln/settled.py); off: in full every step",
    )
    warn_eager_frames: bool = setting(
        True,
        env="KILN_WARN_EAGER_FRAMES",
        help="warn once per function whose whole frame kiln cannot capture and runs eagerly (the reason in the warning)",
    )


@_group("runtime")
class RuntimeSettings(_Group):
    """How compiled graphs run."""

    keep_freed_mb: int = setting(
        0,
        env="KILN_KEEP_FREED_MB",
        help="MiB of freed heap glibc's malloc keeps for the next call instead of returning it; 0 (the default) "
        "leaves malloc alone. Set, it changes malloc for the whole process, eager code included (once, at the "
        "first compiled graph, kiln/heap.py)",
    )
    buffer_cache_mb: int = setting(
        32,
        env="KILN_BUFFER_CACHE_MB",
        help="MiB of freed blocks (each up to 1 MiB) kiln's runtime keeps for the tensors it makes itself (its "
        "operators' outputs, a C++ wrapper's buffers) instead of allocating them again; 0: each from c10's CPU "
        "allocator. Only kiln's own tensors: the process's allocator is left as it is (kiln_runtime.cpp)",
    )
    adaptive_team: bool = setting(
        True,
        env="KILN_ADAPTIVE_TEAM",
        help="run kiln's own parallel regions on fewer threads than OpenMP's count while the calling thread waits "
        "for cores other work keeps busy (the kernel's run delay, read every 20 ms), and try more again later: "
        "beside a busy process a 2-thread decode step otherwise waits a time slice at many of its ~200 region "
        "ends. OpenMP's settings and ATen's regions are left as they are (kiln_team.cpp, docs/limits.md)",
    )


@_group("bench")
class BenchSettings(_Group):
    """How the benchmark harness runs each (model, mode) pair."""

    timeout_s: float = setting(
        900.0,
        env="KILN_BENCH_TIMEOUT",
        help="time limit in seconds for the subprocess that runs one (model, mode)",
    )
    iters: int = setting(20, env="KILN_BENCH_ITERS", help="timed iterations per model and mode")
    warmup: int = setting(
        3, env="KILN_BENCH_WARMUP", help="untimed iterations after compilation, before timing"
    )
    timing_lock: str = setting(
        "",
        env="KILN_BENCH_TIMING_LOCK",
        help="file whose exclusive lock a CUDA case holds while it times its calls; empty: kiln bench "
        "makes one per run (set, one lock is shared by runs and other GPU work: benchmarks/timing_lock.py)",
    )


debug = DebugSettings()
cache = CacheSettings()
backend = BackendSettings()
capture = CaptureSettings()
runtime = RuntimeSettings()
bench = BenchSettings()

# The one list of groups; patch(), describe() and the environment all go through it.
_GROUPS: dict[str, _Group] = {group._area: group for group in (debug, cache, backend, capture, runtime, bench)}


# --- reading settings by name ----------------------------------------------------------------


def _all_specs() -> dict[str, _Spec]:
    return {spec.name: spec for group in _GROUPS.values() for spec in group._specs.values()}


def _unknown(name: str) -> AttributeError:
    known = sorted(_all_specs())
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return AttributeError(f"unknown setting {name!r}{hint}; accepted: {', '.join(known)}")


def _lookup(name: str) -> tuple[_Group, str, _Spec]:
    area, _, field = name.partition(".")
    group = _GROUPS.get(area)
    spec = group._specs.get(field) if group is not None else None
    if spec is None:
        raise _unknown(name)
    return group, field, spec


def cache_dir() -> Path:
    """The cache root with ``~`` expanded.

    Example::

        kiln.config.cache_dir() / "kernels"   # PosixPath('/home/me/.cache/kiln/kernels')
    """
    return Path(os.path.expanduser(cache.dir))


def prebuilt_dir() -> Path:
    """Where `kiln prebuild` puts kiln's own libraries: ``cache.prebuilt_dir``, or
    ``<sys.prefix>/share/kiln`` (the virtual environment's own folder: built with the install,
    removed with it)."""
    return Path(os.path.expanduser(cache.prebuilt_dir)) if cache.prebuilt_dir else Path(sys.prefix) / "share" / "kiln"


def runtime_cache_dir() -> Path:
    """Where kiln's own libraries are cached: ``cache.runtime_dir``, or the cache root."""
    return Path(os.path.expanduser(cache.runtime_dir)) if cache.runtime_dir else cache_dir()


def as_dict() -> dict[str, object]:
    """Every setting as ``{"group.field": value}``, in declaration order.

    Example::

        kiln.config.as_dict()["bench.iters"]   # 20
    """
    values = {}
    for name in _all_specs():
        group, field, _ = _lookup(name)
        values[name] = getattr(group, field)
    return values


def changed() -> dict[str, object]:
    """The settings not at their defaults, as ``{"group.field": value}``: what a repro must set
    again to be built the way this process builds (kiln/debug/repro.py).

    Example::

        with kiln.config.patch({"backend.cpp_wrapper": False}):
            kiln.config.changed()   # {"backend.cpp_wrapper": False, ...and any KILN_* set}
    """
    specs = _all_specs()
    return {name: value for name, value in as_dict().items() if value != specs[name].default}


def describe() -> str:
    """A table of every setting: name, type, current value, environment variable and help.

    Example::

        print(kiln.config.describe())
    """
    header = ("setting", "type", "value", "env", "help")
    values = as_dict()
    rows = [header] + [
        (name, spec.kind.name, _without_password(repr(values[name])), spec.env, spec.help)
        for name, spec in _all_specs().items()
    ]
    widths = [max(len(row[col]) for row in rows) for col in range(len(header) - 1)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1]
             for row in rows]
    return "\n".join(line.rstrip() for line in lines)


_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/@\s:]*:)[^@/\s]+@", re.IGNORECASE)


def _without_password(text: str) -> str:
    """``text`` with the password of any URL in it (``scheme://user:password@host``) shown as ***:
    describe() prints settings, and cache.remote may carry a Redis password."""
    return _URL_PASSWORD.sub(r"\1***@", text)


# --- environment -----------------------------------------------------------------------------


def reload_from_env(environ: Mapping[str, str] | None = None) -> None:
    """Reset every setting to its default, then apply ``KILN_*`` variables from ``environ``.

    ``environ`` defaults to ``os.environ``. All variables are parsed before anything changes,
    so a malformed one (ValueError naming it) leaves the settings as they were. An unknown
    ``KILN_*`` variable is most likely a typo and gives a warning.

    Example::

        kiln.config.reload_from_env({"KILN_BENCH_ITERS": "5"})
        kiln.config.bench.iters   # 5
    """
    environ = os.environ if environ is None else environ
    specs = _all_specs()
    by_env = {spec.env: spec for spec in specs.values()}
    values = {name: spec.default for name, spec in specs.items()}
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX):
            continue
        spec = by_env.get(var)
        if spec is None and var in READ_ELSEWHERE:
            continue
        if spec is None:
            close = difflib.get_close_matches(var, by_env, n=1, cutoff=0.8)
            hint = f" (did you mean {close[0]}?)" if close else ""
            warnings.warn(
                f"unknown environment variable {var} is ignored{hint}; "
                f"kiln reads: {', '.join(sorted(by_env))}",
                stacklevel=2,
            )
            continue
        values[spec.name] = spec.from_env(environ[var])
    for name, value in values.items():
        group, field, _ = _lookup(name)
        setattr(group, field, value)


# --- temporary changes -----------------------------------------------------------------------


class patch(contextlib.ContextDecorator):
    """Set settings by ``"group.field"`` name for a ``with`` block or a decorated function.

    Names and types are all checked when the patch is created, before anything changes; the
    previous values come back on exit, also after an exception. Patches nest, and one patch
    object may be entered again (e.g. a decorated function that recurses).

    Example::

        with kiln.config.patch({"bench.iters": 5}, **{"debug.dump_dir": "/tmp/dumps"}):
            ...

        @kiln.config.patch({"debug.logs": "graph"})
        def test_something(): ...
    """

    def __init__(self, changes: Mapping[str, object] | None = None, **kwargs: object) -> None:
        merged = {**(changes or {}), **kwargs}
        self._changes = {}
        for name, value in merged.items():
            _, _, spec = _lookup(name)
            self._changes[name] = spec.check(value)
        self._saved: list[dict[str, object]] = []  # a stack, so re-entry restores in order

    def __enter__(self) -> patch:
        targets = {name: _lookup(name)[:2] for name in self._changes}
        self._saved.append({name: getattr(g, f) for name, (g, f) in targets.items()})
        for name, (group, field) in targets.items():
            setattr(group, field, self._changes[name])
        return self

    def __exit__(self, *exc_info: object) -> None:
        for name, value in self._saved.pop().items():
            group, field, _ = _lookup(name)
            setattr(group, field, value)


def _check_env_names() -> None:
    seen: dict[str, str] = {}
    for spec in _all_specs().values():
        if spec.env in seen:
            raise ValueError(f"{spec.name} and {seen[spec.env]} both read {spec.env}")
        seen[spec.env] = spec.name


_check_env_names()
reload_from_env()
