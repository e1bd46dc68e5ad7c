"""Sources: how a value the interpreter reads is reached from the frame's inputs.

A source prints as a Python expression over `L` (the frame's bound arguments, a tuple) and names
bound in a namespace (`ConstSource` objects, kept by identity). Guards and the compiled frame's
input getter are both generated from these expressions.

    ItemSource(AttrSource(LocalSource("self", 0), "_modules"), "encoder")   # L[0]._modules['encoder']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class Namespace:
    """Names for objects that generated code refers to by identity (`C0`, `C1`, ...)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self._by_id: dict[Any, str] = {}

    def bind(self, value: Any, stem: str = "C", key: Any = None) -> str:
        """The name of `value`; one name per object, or per `key` where given (for values made
        anew for each use, as a class's `__dict__` view)."""
        key = id(value) if key is None else key
        name = self._by_id.get(key)
        if name is None:
            name = f"{stem}{len(self.values)}"
            self.values[name] = value
            self._by_id[key] = name
        return name


class Source:
    """Base class; subclasses are frozen dataclasses so equal paths compare and hash equal."""

    def expr(self, ns: Namespace, name_of: Any = None) -> str:
        """The expression; `name_of(source)` may return a hoisted local name for a sub-source."""
        raise NotImplementedError

    def _sub(self, base: "Source", ns: Namespace, name_of: Any) -> str:
        return base.read(ns, name_of)

    def read(self, ns: Namespace, name_of: Any = None) -> str:
        """The local `name_of` says holds this source (read once before), else its expression."""
        hoisted = name_of(self) if name_of is not None else None
        return hoisted if hoisted is not None else self.expr(ns, name_of)

    def chain(self) -> list["Source"]:
        """This source and every base it is built on, outermost first."""
        base = getattr(self, "base", None)
        return [*base.chain(), self] if base is not None else [self]

    def is_local(self) -> bool:
        return isinstance(self.chain()[0], LocalSource)

    def __str__(self) -> str:
        return self.expr(_DisplayNamespace())


class _DisplayNamespace(Namespace):
    def bind(self, value: Any, stem: str = "C") -> str:
        return _display_name(value)


def _display_name(value: Any) -> str:
    name = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
    if isinstance(name, str):
        return f"<{name}>"
    return f"<{type(value).__name__} object>"


@dataclass(frozen=True)
class LocalSource(Source):
    """An argument of the compiled frame: position `index` in the bound-arguments tuple."""

    name: str
    index: int

    def expr(self, ns: Namespace, name_of: Any = None) -> str:
        return f"L[{self.index}]"

    def __str__(self) -> str:
        return f"L[{self.name!r}]"


@dataclass(frozen=True, eq=False)
class ConstSource(Source):
    """An object whose identity a guard (or a registration hook) already pins."""

    value: Any
    label: str = ""

    def expr(self, ns: Namespace, name_of: Any = None) -> str:
        if isinstance(ns, _DisplayNamespace) and self.label:
            return f"<{self.label}>"  # guards print as `<globals of __main__>['torch']`
        return ns.bind(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConstSource) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)

    def __str__(self) -> str:
        return self.label or _display_name(self.value)


@dataclass(frozen=True)
class AttrSource(Source):
    base: Source
    name: str

    def expr(self, ns: Namespace, name_of: Any = None) -> str:
        return f"{self._sub(self.base, ns, name_of)}.{self.name}"


@dataclass(frozen=True)
class ClassDictSource(Source):
    """`klass.__dict__`, a class's own namespace. Bound once: the read-only view it returns is a
    live view of the class's dict (what is set on the class later shows in it), and asking the
    class for a new view costs a check ~25 ns each time (a dozen classes on a small model)."""

    klass: type

    def expr(self, ns: Namespace, name_of: Any = None) -> str:
        if isinstance(ns, _DisplayNamespace):
            return f"{_display_name(self.klass)}.__dict__"
        return ns.bind(self.klass.__dict__, "C", key=("class dict", id(self.klass)))


@dataclass(frozen=True)
class ItemSource(Source):
    """`base[key]` for a constant key (int, str, or any hashable bound by identity); with
    `read_with`, `read_with(base, key)` (`tuple.__getitem__` for a tuple subclass whose own
    `__getitem__` means something else)."""

    base: Source
    key: Any
    read_with: Any = None

    def expr(self, ns: Namespace, name_of: Any = None) -> str:
        key = repr(self.key) if isinstance(self.key, (int, str)) and not isinstance(self.key, bool) else ns.bind(self.key, "K")
        if self.read_with is not None:
            return f"{ns.bind(self.read_with, 'F')}({self._sub(self.base, ns, name_of)}, {key})"
        return f"{self._sub(self.base, ns, name_of)}[{key}]"


@dataclass(frozen=True)
class ConvertedSource(Source):
    """`convert(base)`: an input the graph reads in another form than the caller's (an ndarray's
    memory as a tensor, kiln/capture/variables/numpy_arrays.py)."""

    base: Source
    convert: Any

    def expr(self, ns: Namespace, name_of: Any = None) -> str:
        return f"{ns.bind(self.convert, 'F')}({self._sub(self.base, ns, name_of)})"


TUPLE_ITERATOR = type(iter(()))
# The iterators of tuples, lists and ranges, whose items left are read without advancing them.
SEQUENCE_ITERATORS = (TUPLE_ITERATOR, type(iter([])), type(iter(range(0))))


def remaining_items(iterator: Any) -> tuple:
    """The items a tuple, list or range iterator has not produced yet, without advancing it."""
    state = iterator.__reduce__()  # (iter, (sequence,), position), or (iter, ((),)) once exhausted
    return tuple(state[1][0][state[2]:]) if len(state) > 2 else ()


@dataclass(frozen=True)
class RemainingItemsSource(Source):
    """The items the tuple iterator `base` has left, as a tuple."""

    base: Source

    def expr(self, ns: Namespace, name_of: Any = None) -> str:
        return f"{ns.bind(remaining_items, 'F')}({self._sub(self.base, ns, name_of)})"


@dataclass(frozen=True)
class ClosureSource(Source):
    """The contents of cell `index` of a function's closure."""

    base: Source
    index: int

    def expr(self, ns: Namespace, name_of: Any = None) -> str:
        return f"{self._sub(self.base, ns, name_of)}.__closure__[{self.index}].cell_contents"


@dataclass(frozen=True)
class CellSource(Source):
    """A closure's cell `index` itself, not its contents (what a guard watch compares: guards.py)."""

    base: Source
    index: int

    def expr(self, ns: Namespace, name_of: Any = None) -> str:
        return f"{self._sub(self.base, ns, name_of)}.__closure__[{self.index}]"


@dataclass(frozen=True)
class TypeSource(Source):
    base: Source

    def expr(self, ns: Namespace, name_of: Any = None) -> str:
        return f"type({self._sub(self.base, ns, name_of)})"


@dataclass(frozen=True)
class DefaultSource(Source):
    """A default argument value of a function: `fn.__defaults__[i]` or `fn.__kwdefaults__[name]`."""

    base: Source
    key: Any
    keyword: bool = field(default=False)

    def expr(self, ns: Namespace, name_of: Any = None) -> str:
        where = "__kwdefaults__" if self.keyword else "__defaults__"
        return f"{self._sub(self.base, ns, name_of)}.{where}[{self.key!r}]"


@dataclass(frozen=True)
class KeysSource(Source):
    """The keys of a dict, in order, as a list."""

    base: Source

    def expr(self, ns: Namespace, name_of: Any = None) -> str:
        return f"list({self._sub(self.base, ns, name_of)}.keys())"


@dataclass(frozen=True)
class InstanceDictSource(Source):
    """`base.__dict__` as `object.__getattribute__` finds it: no class `__getattribute__` runs."""

    base: Source

    def expr(self, ns: Namespace, name_of: Any = None) -> str:
        base = self._sub(self.base, ns, name_of)
        if isinstance(ns, _DisplayNamespace):  # logs and node names read as the user would write it
            return f"{base}.__dict__"
        return f"{ns.bind(instance_dict, 'F')}({base})"


def read_once(sources: list[Source], ns: Namespace, stem: str = "_in") -> tuple[list[str], list[str]]:
    """Expressions for `sources`, each sub-source that several of them read (other than an argument
    or a constant) read once into a local `<stem>k` first: (the assignments, in order, and the
    expressions). A decode step's graph reads its 36 KV-cache tensors through the cache's layers:
    13 instance-dict reads instead of 72."""
    uses: dict[Source, int] = {}
    for source in sources:
        for sub in source.chain()[:-1]:
            uses[sub] = uses.get(sub, 0) + 1
    hoisted: dict[Source, str] = {}
    lines: list[str] = []
    exprs: list[str] = []
    for source in sources:
        for sub in source.chain()[:-1]:
            if uses[sub] > 1 and sub not in hoisted and not isinstance(sub, (LocalSource, ConstSource)):
                name = f"{stem}{len(hoisted)}"
                lines.append(f"{name} = {sub.expr(ns, hoisted.get)}")
                hoisted[sub] = name
        exprs.append(source.read(ns, hoisted.get))
    return lines, exprs


def instance_dict(obj: Any) -> dict:
    """`obj.__dict__` without the class's own `__getattribute__`; a C type that keeps its
    instances' dicts itself (threading.local) answers only its own attribute."""
    try:
        return object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return type(obj).__dict__["__dict__"].__get__(obj) if "__dict__" in type(obj).__dict__ else obj.__dict__
