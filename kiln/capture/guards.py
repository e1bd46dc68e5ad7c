"""Guards: the assumptions a captured graph relies on, compiled into one Python check.

Each `Guard` has a kind (TYPE_MATCH, ID_MATCH, EQUALS, TENSOR_MATCH, SHAPE, ALIASING, LENGTH_MATCH,
HASATTR, DICT_CONTAINS, GLOBAL_STATE, MODULE_STRUCTURE), the source of the value it checks and the
expected value.
`GuardSet.compile()` prints them as the statements of one function `check(L) -> bool`, with
sub-expressions shared by several guards read once into locals. `KILN_LOGS=guards` prints the
list and the generated code.

Most of a language model's guards read no input: they pin what the traced code found in modules'
globals, classes, a config's attributes and closures (156 of a Llama decode step's 307). Where
the `kiln_python` extension is loaded and Python versions its dicts, those guards run only when one
of the dicts, instance dicts or cells they read changed since they last held (`Watch`, one C call
of ~70 ns): `stable_reads` says which guards qualify and what they read.

    guards.add(Guard("TENSOR_MATCH", LocalSource("x", 0), expected=TensorFacts.of(tensor)))
    check = guards.compile()
    check((x,))     # True while x keeps its dtype, device, shape, strides and requires_grad
"""

from __future__ import annotations

import gc
import re
import types
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from kiln.capture import module_watch
from kiln.capture.sources import (CellSource, ClassDictSource, ClosureSource, ConstSource, InstanceDictSource,
                                  ItemSource, KeysSource, Namespace, Source, instance_dict)
from kiln.native import python_door

GUARD_KINDS = (
    "TYPE_MATCH",  # type(x) is T
    "ID_MATCH",  # x is obj (modules, functions, classes)
    "EQUALS",  # x == value, of the same type (Python constants)
    "TENSOR_MATCH",  # tensor type, dtype, device, size, stride, requires_grad (dynamic: no size, stride)
    "SHAPE",  # a relation of dynamic inputs' sizes the trace relied on (from the ShapeEnv)
    "ALIASING",  # which tensor inputs are one object (f(x, x)) and which are distinct
    "LENGTH_MATCH",  # len(x) == n (containers whose items were read)
    "HASATTR",  # hasattr(x, name) is b
    "DICT_CONTAINS",  # (name in x) is b: an instance dict that does not shadow a class attribute
    "GLOBAL_STATE",  # grad mode, autocast, default dtype
    "MODULE_STRUCTURE",  # no watched nn.Module gained or lost a child, parameter or buffer
)


@dataclass(frozen=True)
class TensorFacts:
    """What a TENSOR_MATCH guard checks of a tensor, without the tensor: a guard lives as long as
    its compiled entry, and holding the input itself kept the user's tensor (and its memory)
    alive after every reference of theirs was gone."""

    cls: type
    dtype: torch.dtype
    device: torch.device
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    requires_grad: bool

    @staticmethod
    def of(t: torch.Tensor) -> "TensorFacts":
        return TensorFacts(type(t), t.dtype, t.device, tuple(t.shape), tuple(t.stride()), bool(t.requires_grad))

    def dim(self) -> int:
        return len(self.shape)

    def stride(self) -> tuple[int, ...]:
        return self.strides


@dataclass(frozen=True)
class Guard:
    kind: str
    source: Source | None
    expected: Any = None
    detail: str = ""  # HASATTR's attribute name, GLOBAL_STATE's item, "dynamic" for TENSOR_MATCH

    def key(self) -> tuple:
        expected = id(self.expected) if self.kind == "ID_MATCH" else _hashable(self.expected)
        return (self.kind, self.source, self.detail, expected)

    def check_expr(self, value: str, ns: Namespace, name_of: Callable[[Source], str | None] | None = None) -> str:
        """The boolean expression that holds while the assumption does; `name_of`: the local that
        holds a source already read (the sources an ALIASING or SHAPE guard reads besides its own)."""
        return _EXPRS[self.kind](self, value, ns, name_of)

    def reads(self) -> list[Source]:
        """The sources the check reads: its own, and the inputs an ALIASING or SHAPE guard compares."""
        own = [self.source] if self.source is not None else []
        if self.kind == "ALIASING":
            return own + list(self.expected[1])
        if self.kind == "SHAPE":
            return own + [source for _, source in self.expected[1]]
        return own

    def describe(self) -> str:
        where = str(self.source) if self.source is not None else self.detail
        return f"{self.kind:<16} {where}  {_describe_expected(self)}"


def _hashable(value: Any) -> Any:
    try:
        hash(value)
        return (type(value), value)
    except TypeError:
        return id(value)


def _describe_expected(guard: Guard) -> str:
    e = guard.expected
    if guard.kind == "TENSOR_MATCH" and guard.detail == "dynamic":
        return f"{e.cls.__name__}({e.dtype}, {e.device}, dim={e.dim()}, requires_grad={e.requires_grad}; sizes: SHAPE guards)"
    if guard.kind == "TENSOR_MATCH":
        return f"{e.cls.__name__}({e.dtype}, {e.device}, size={e.shape}, stride={e.strides}, requires_grad={e.requires_grad})"
    if guard.kind == "ALIASING":
        pattern, sources = e
        text = "inputs " + ", ".join(str(s) if i == p else f"{s} is {sources[p]}" for i, (s, p) in enumerate(zip(sources, pattern)))
        return text + ("; memory shared as " + repr(pattern[len(sources):]) if guard.detail == "storage" else "")
    if guard.kind == "SHAPE":
        text, sources = e
        for name, source in sources:
            text = text.replace(name, str(source))
        return text
    if guard.kind in ("ID_MATCH", "TYPE_MATCH"):
        name = getattr(e, "__qualname__", None) or type(e).__name__
        return f"is {name} (id {id(e):#x})"
    if guard.kind == "HASATTR":
        return f"hasattr(.., {guard.detail!r}) is {e}"
    if guard.kind == "DICT_CONTAINS":
        return f"({guard.detail!r} in ..) is {e}"
    if guard.kind == "GLOBAL_STATE":
        return f"{guard.detail} == {e!r}"
    return f"== {e!r}"


def _type_match(g: Guard, v: str, ns: Namespace, name_of: Any = None) -> str:
    return f"type({v}) is {ns.bind(g.expected, 'T')}"


def _id_match(g: Guard, v: str, ns: Namespace, name_of: Any = None) -> str:
    return f"{v} is {ns.bind(g.expected, 'O')}"


def _equals(g: Guard, v: str, ns: Namespace, name_of: Any = None) -> str:
    e = g.expected
    if e is None or isinstance(e, bool) or e is Ellipsis or e is NotImplemented:
        return f"{v} is {e!r}"
    if isinstance(e, (torch.dtype, torch.memory_format, torch.layout)):
        return f"{v} is {ns.bind(e, 'O')}"
    if type(e) is int and -5 <= e <= 256:
        return f"{v} is {ns.bind(e, 'V')}"  # CPython keeps one object per small int
    if type(e) in (int, str):
        return f"type({v}) is {type(e).__name__} and {v} == {e!r}"
    # floats (nan != nan), tuples, enums, ...: compare to the bound value.
    same = f"({v} == {ns.bind(e, 'V')} or {v} != {v})" if isinstance(e, float) else f"{v} == {ns.bind(e, 'V')}"
    return f"type({v}) is {ns.bind(type(e), 'T')} and {same}"


def _tensor_match(g: Guard, v: str, ns: Namespace, name_of: Any = None, layout: "StaticLayout | None" = None) -> str:
    """`layout`: a dynamic tensor's static sizes, strides and offset, checked in the same C call
    (the SHAPE guards they come from are then not emitted: `_static_layouts`)."""
    t = g.expected
    check = python_door.tensor_check()
    if check is not None and t.cls in (torch.Tensor, torch.nn.Parameter):
        # One C call (~30 ns) for what the expression below reads in ~0.4 µs. Only for the plain
        # tensor types: a subclass may answer `.size()` or `.dtype` through __torch_function__.
        if g.detail != "dynamic":
            matches = check(t.cls, t.dtype, t.device, t.dim(), t.shape, t.strides, t.requires_grad)
        elif layout is not None:
            matches = check(t.cls, t.dtype, t.device, t.dim(), layout.sizes, layout.strides, t.requires_grad,
                            storage_offset=layout.offset)
        else:
            matches = check(t.cls, t.dtype, t.device, t.dim(), None, None, t.requires_grad)
        return f"{ns.bind(matches, 'K')}({v})"
    if g.detail == "dynamic":
        return (f"type({v}) is {ns.bind(t.cls, 'T')} and {v}.dtype is {ns.bind(t.dtype, 'O')}"
                f" and {v}.device == {ns.bind(t.device, 'D')} and {v}.dim() == {t.dim()} and {v}.requires_grad is {t.requires_grad!r}")
    return (
        f"type({v}) is {ns.bind(t.cls, 'T')} and {v}.dtype is {ns.bind(t.dtype, 'O')}"
        f" and {v}.device == {ns.bind(t.device, 'D')} and {v}.size() == {t.shape!r}"
        f" and {v}.stride() == {t.strides!r} and {v}.requires_grad is {t.requires_grad!r}"
    )


def _shape(g: Guard, v: str, ns: Namespace, name_of: Any = None) -> str:
    text, sources = g.expected
    for name, source in sources:
        text = text.replace(name, f"({source.read(ns, name_of)})")
    return text


@dataclass
class StaticLayout:
    """What the shape environment fixed of a dynamic tensor: sizes and strides (None where not
    fixed) and its storage offset (None: not fixed)."""

    sizes: list[int | None]
    strides: list[int | None]
    offset: int | None = None


# A SHAPE guard that fixes one number of one input: `__kiln_input3__.size()[0] == 1`.
_FIXED_NUMBER = re.compile(r"^(__kiln_input\d+__)\.(size\(\)\[(\d+)\]|stride\(\)\[(\d+)\]|storage_offset\(\)) == (-?\d+)$")


def _static_layouts(guards: list[Guard]) -> tuple[list[Guard], dict[int, StaticLayout]]:
    """`guards` without the SHAPE guards that fix a size, stride or storage offset of an input
    whose dynamic TENSOR_MATCH guard is among them and checks in C, and those numbers by that
    guard's id: its one C call checks them (a decode step's KV cache: ~500 such guards, each a
    `.size()` and an index in Python)."""
    if python_door.tensor_check() is None:
        return guards, {}
    dynamic = {g.source: g for g in guards if g.kind == "TENSOR_MATCH" and g.detail == "dynamic"
               and g.expected.cls in (torch.Tensor, torch.nn.Parameter)}
    layouts: dict[int, StaticLayout] = {}
    kept = []
    sources: dict[int, dict] = {}  # (one placeholder -> source map per SHAPE guards' shared tuple)
    for g in guards:
        fixed = _FIXED_NUMBER.match(g.expected[0]) if g.kind == "SHAPE" else None
        if fixed and id(g.expected[1]) not in sources:
            sources[id(g.expected[1])] = dict(g.expected[1])
        match = dynamic.get(sources[id(g.expected[1])].get(fixed.group(1))) if fixed else None
        if match is None:
            kept.append(g)
            continue
        dim = match.expected.dim()
        layout = layouts.setdefault(id(match), StaticLayout([None] * dim, [None] * dim))
        size_dim, stride_dim, value = fixed.group(3), fixed.group(4), int(fixed.group(5))
        # (An index past the dimensions, or a second number for one place, stays a Python line:
        # it fails there as it would.)
        if size_dim is not None and int(size_dim) < dim and layout.sizes[int(size_dim)] in (None, value):
            layout.sizes[int(size_dim)] = value
        elif stride_dim is not None and int(stride_dim) < dim and layout.strides[int(stride_dim)] in (None, value):
            layout.strides[int(stride_dim)] = value
        elif size_dim is None and stride_dim is None and layout.offset in (None, value):
            layout.offset = value
        else:
            kept.append(g)
    return kept, layouts


def alias_pattern(tensors: Sequence[Any], by_storage: bool = False,
                  expected: tuple[int, ...] | None = None) -> tuple[int, ...] | bool:
    """For each tensor, the index of the first that is the same object; `by_storage`: then,
    for each, the index of the first whose memory it may share: in the same storage, their spans
    of bytes (first to last element) overlapping (an empty tensor shares none). Two disjoint parts
    of one buffer (two layers' KV caches cut from one allocation) are then two inputs a graph
    may write in place, each its own. With `expected`, whether the pattern is it (the extension's
    never makes the pattern then). The guards call the extension's, the same in one C loop, where
    this process has it."""
    first: dict[int, int] = {}
    pattern = tuple(first.setdefault(id(t), i) for i, t in enumerate(tensors))
    if by_storage:
        spans = [_memory_span(t) for t in tensors]
        pattern += tuple(next(j for j in range(i + 1) if _overlap(spans[j], spans[i])) if spans[i] else i
                         for i in range(len(tensors)))
    return pattern if expected is None else pattern == expected


def _memory_span(t: Any) -> tuple | None:
    """(device, storage, first byte, past the last byte) of a tensor's elements; None when empty."""
    if not t.numel():
        return None
    size = t.element_size()
    start = t.storage_offset() * size
    extent = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.device, t.untyped_storage().data_ptr(), start, start + (extent + 1) * size


def _overlap(a: tuple | None, b: tuple | None) -> bool:
    return a is not None and b is not None and a[:2] == b[:2] and a[2] < b[3] and b[2] < a[3]


def _aliasing(g: Guard, v: str, ns: Namespace, name_of: Any = None) -> str:
    pattern, sources = g.expected
    values = "".join(f"{source.read(ns, name_of)}, " for source in sources)
    function = python_door.alias_pattern_function() or alias_pattern
    return f"{ns.bind(function, 'F')}(({values}), {g.detail == 'storage'!r}, {ns.bind(tuple(pattern), 'V')})"


def _length_match(g: Guard, v: str, ns: Namespace, name_of: Any = None) -> str:
    return f"len({v}) == {g.expected!r}"


def _hasattr(g: Guard, v: str, ns: Namespace, name_of: Any = None) -> str:
    return f"hasattr({v}, {g.detail!r}) is {bool(g.expected)!r}"


def _dict_contains(g: Guard, v: str, ns: Namespace, name_of: Any = None) -> str:
    return f"({g.detail!r} in {v}) is {bool(g.expected)!r}"


def _global_state(g: Guard, v: str, ns: Namespace, name_of: Any = None) -> str:
    reader = ns.bind(GLOBAL_STATE_READERS[g.detail], "S")
    return f"{reader}() == {ns.bind(g.expected, 'V')}"


def _module_structure(g: Guard, v: str, ns: Namespace, name_of: Any = None) -> str:
    return f"{ns.bind(module_watch.STATE, 'W')}.version == {ns.bind(g.expected, 'S')}.version"


_EXPRS: dict[str, Callable[[Guard, str, Namespace], str]] = {
    "TYPE_MATCH": _type_match,
    "ID_MATCH": _id_match,
    "EQUALS": _equals,
    "TENSOR_MATCH": _tensor_match,
    "SHAPE": _shape,
    "ALIASING": _aliasing,
    "LENGTH_MATCH": _length_match,
    "HASATTR": _hasattr,
    "DICT_CONTAINS": _dict_contains,
    "GLOBAL_STATE": _global_state,
    "MODULE_STRUCTURE": _module_structure,
}


def _autocast_state() -> tuple:
    return (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))


def _cuda_autocast_state() -> tuple:
    return (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"))


AUTOCAST_STATES = ("autocast_cpu", "autocast_cuda")

GLOBAL_STATE_READERS: dict[str, Callable[[], Any]] = {
    "grad_enabled": torch.is_grad_enabled,
    "autocast_cpu": _autocast_state,
    "autocast_cuda": _cuda_autocast_state,  # a graph captured under torch.autocast("cuda") casts in its ops
    "default_dtype": torch.get_default_dtype,
    # Guarded only where the trace read them (`if torch.autograd._profiler_enabled(): ...`):
    "profiler_enabled": torch.autograd._profiler_enabled,
    "inference_mode": torch.is_inference_mode_enabled,
    "anomaly_enabled": torch.is_anomaly_enabled,
    "deterministic_algorithms": torch.are_deterministic_algorithms_enabled,
    "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled,
    "num_threads": torch.get_num_threads,
}
# The items every capture guards on entry (the graph's ops depend on them).
ALWAYS_GUARDED = ("grad_enabled", "autocast_cpu", "autocast_cuda", "default_dtype")


class GuardSet:
    """The guards of one compiled entry, in the order they were added, without repeats."""

    def __init__(self) -> None:
        self._guards: dict[tuple, Guard] = {}

    def add(self, guard: Guard) -> None:
        if guard.kind not in GUARD_KINDS:
            raise ValueError(f"unknown guard kind {guard.kind!r}; known: {', '.join(GUARD_KINDS)}")
        self._guards.setdefault(guard.key(), guard)

    def __iter__(self):
        return iter(self._guards.values())

    def __len__(self) -> int:
        return len(self._guards)

    def compile(self) -> "CompiledGuards":
        return CompiledGuards(list(self._guards.values()))

    def describe(self) -> str:
        return "\n".join(g.describe() for g in self)


# Values whose equality to a constant cannot change while they stay the same object.
IMMUTABLE_SCALARS = (int, float, complex, str, bytes, bool, type(None))
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement


@dataclass(frozen=True)
class StableReads:
    """What a guard that reads no input reads: the dicts whose versions, the (owner, instance dict)
    pairs whose identity and the closure cells whose contents decide it. Each a source (a class's
    dict: a constant, the dict behind its read-only view)."""

    dicts: tuple[Source, ...]
    owners: tuple[tuple[Source, Source], ...]
    cells: tuple[Source, ...]


def _class_dict(view: Any) -> dict | None:
    """The dict behind a class's read-only `__dict__` view."""
    behind = [r for r in gc.get_referents(view) if type(r) is dict] if type(view) is types.MappingProxyType else []
    return behind[0] if len(behind) == 1 else None


def stable_reads(guard: Guard) -> StableReads | None:
    """The reads that decide `guard` when its truth is fixed by the contents of plain dicts, of
    instance dicts and of closure cells reached from constants, and by the identity of what they
    hold (a type's identity where the type is a C type, whose instances' class cannot be
    reassigned; an immutable scalar's value); None otherwise (an input, an attribute read that a
    descriptor may answer, a mutable value compared by equality). The chain's values are read now,
    from the constants, to learn their types: where a later call finds another type (a dict replaced
    by another mapping), `Watch.record` raises, the entry's check fails and the call captures anew."""
    if guard.source is None or guard.kind not in ("ID_MATCH", "TYPE_MATCH", "EQUALS", "DICT_CONTAINS", "LENGTH_MATCH"):
        return None
    chain = guard.source.chain()
    if not isinstance(chain[0], (ConstSource, ClassDictSource)):
        return None
    ns = Namespace()
    try:
        values = [eval(source.expr(ns), dict(ns.values)) for source in chain]  # noqa: S307 - kiln's own expressions
    except Exception:  # noqa: BLE001 - a read that fails now is checked every call
        return None
    dicts: list[Source] = []
    owners: list[tuple[Source, Source]] = []
    cells: list[Source] = []

    def dict_read(source: Source, value: Any) -> bool:
        if isinstance(source, ClassDictSource):
            behind = _class_dict(value)
            if behind is None:
                return False
            dicts.append(ConstSource(behind, f"{source}"))
            return True
        if type(value) is not dict:
            return False
        if not isinstance(source, InstanceDictSource):  # (an instance dict: compared whole, with its owner)
            dicts.append(source)
        return True

    for k, step in enumerate(chain[1:], start=1):
        base, base_value = chain[k - 1], values[k - 1]
        if isinstance(step, (ItemSource, KeysSource)):
            if getattr(step, "read_with", None) is not None or not dict_read(base, base_value):
                return None
        elif isinstance(step, InstanceDictSource):
            if type(values[k]) is not dict or values[k] is not instance_dict(base_value):
                return None
            owners.append((base, step))
        elif isinstance(step, ClosureSource):
            if type(base_value) is not types.FunctionType:
                return None
            cells.append(CellSource(base, step.index))
        else:
            return None
    value = values[-1]
    if guard.kind in ("DICT_CONTAINS", "LENGTH_MATCH"):
        if not dict_read(chain[-1], value):
            return None
    elif guard.kind == "TYPE_MATCH":
        if guard.expected.__flags__ & _HEAP_TYPE:
            return None
    elif guard.kind == "EQUALS":
        if not isinstance(chain[-1], KeysSource) and type(guard.expected) not in IMMUTABLE_SCALARS:
            return None
    return StableReads(tuple(dicts), tuple(owners), tuple(cells))



class CompiledGuards:
    """`check(L)`: one generated function; `first_failure(L)` names the guard that fails."""

    def __init__(self, guards: list[Guard]) -> None:
        self.guards = guards
        self.ns = Namespace()
        self.source_code = self._generate()
        scope: dict[str, Any] = dict(self.ns.values)
        exec(compile(self.source_code, "<kiln guards>", "exec"), scope)
        self.check: Callable[[tuple], bool] = scope["check"]

    def _generate(self) -> str:
        lines = ["def check(L):", "    try:"]
        # Captured with autocast off: while no device's autocast is on (one C call) the state is the
        # captured one; only otherwise is each device's (enabled, dtype) read (a Python call and two
        # C calls each, the guard check's largest part on a small model).
        autocast = [g for g in self.guards if g.kind == "GLOBAL_STATE" and g.detail in AUTOCAST_STATES]
        if autocast and not any(g.expected[0] for g in autocast):
            exact = " and ".join(_global_state(g, "None", self.ns) for g in autocast)
            lines.append(f"        if {self.ns.bind(torch._C._is_any_autocast_enabled, 'S')}() and not ({exact}): return False")
        else:
            autocast = []
        rest = [g for g in self.guards if not any(g is a for a in autocast)]
        watch = python_door.watch()
        reads = {id(g): r for g in rest if (r := stable_reads(g)) is not None} if watch is not None else {}
        stable_lines: list[str] = []
        if reads:
            stable = [g for g in rest if id(g) in reads]
            rest = [g for g in rest if id(g) not in reads]
            w = self.ns.bind(watch, "W")
            lines.append(f"        if not {w}() and not check_stable(): return False")
            stable_lines = ["", "def check_stable():", *self._watch_record(w, [reads[id(g)] for g in stable]),
                            *self._guard_lines(stable, "    "), f"    {w}.arm()", "    return True"]
        lines += self._guard_lines(rest, "        ")
        lines += ["    except Exception:", "        return False", "    return True", *stable_lines, ""]
        return "\n".join(lines)

    def _watch_record(self, w: str, reads: list[StableReads]) -> list[str]:
        """`w.record(...)` of every dict, owner and cell the stable guards read, read before them:
        a change made meanwhile (another thread) leaves the watch behind, never ahead."""
        dicts = list(dict.fromkeys(d for r in reads for d in r.dicts))
        owners = list(dict.fromkeys(o for r in reads for o in r.owners))
        cells = list(dict.fromkeys(c for r in reads for c in r.cells))

        def items(sources: list) -> str:
            return "".join(f"{s}, " for s in sources)

        return [f"    {w}.record(({items(d.expr(self.ns) for d in dicts)}), "
                f"({items(f'({o.expr(self.ns)}, {d.expr(self.ns)})' for o, d in owners)}), "
                f"({items(c.expr(self.ns) for c in cells)}))"]

    def _guard_lines(self, guards: list[Guard], indent: str) -> list[str]:
        """Each guard as `if not (...): return False`, sub-expressions read by several read once."""
        # (An ALIASING guard's inputs are read by other guards too: a decode step's 36 KV-cache
        # tensors, each behind two instance dicts, are compared in the locals their TENSOR_MATCH
        # guards read them into.)
        guards, layouts = _static_layouts(guards)
        uses: dict[Source, int] = {}
        for g in guards:
            for read in g.reads():
                for sub in read.chain():
                    uses[sub] = uses.get(sub, 0) + 1
        hoisted: dict[Source, str] = {}
        lines: list[str] = []

        def name_of(source: Source) -> str | None:
            return hoisted.get(source)

        for g in guards:
            for read in g.reads():
                for sub in read.chain():
                    if uses.get(sub, 0) > 1 and sub not in hoisted and sub.__class__.__name__ not in ("LocalSource", "ConstSource"):
                        name = f"v{len(hoisted)}"
                        lines.append(f"{indent}{name} = {sub.expr(self.ns, name_of)}")
                        hoisted[sub] = name
            value = "None"
            if g.source is not None:
                value = g.source.read(self.ns, name_of)
                if not value.isidentifier() and g.check_expr("_v", Namespace()).count("_v") > 1:
                    lines.append(f"{indent}_v = {value}")  # read once, checked several ways
                    value = "_v"
            check = (_tensor_match(g, value, self.ns, layout=layouts[id(g)]) if id(g) in layouts
                     else g.check_expr(value, self.ns, name_of))
            lines.append(f"{indent}if not ({check}): return False")
        return lines

    def first_failure(self, L: tuple) -> Guard | None:
        for g in self.guards:
            ns = Namespace()
            value = g.source.expr(ns) if g.source is not None else "None"
            expr = g.check_expr(value, ns)
            try:
                ok = eval(expr, dict(ns.values), {"L": L})
            except Exception:
                ok = False
            if not ok:
                return g
        return None
