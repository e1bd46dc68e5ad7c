"""`wrap` and `wrap_constant_result`: how any module of the capture turns a real Python value into
a variable, without importing the builder.

The builder (builder.py) picks the variable kind for a value, so it imports every kind; the kinds
in turn wrap the values they read (an attribute, a default, the result of an operation folded on
constants). To keep that from being an import cycle, the kinds call the functions here, which
import no kind: builder.py installs its `build` when it is imported, and frame.py imports it before
any capture runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from kiln.capture.guards import Guard
from kiln.capture.sources import ConstSource

if TYPE_CHECKING:
    from kiln.capture.sources import Source
    from kiln.capture.variables.base import Variable


def _builder_missing(tx: Any, value: Any, source: "Source | None") -> "Variable":
    raise RuntimeError("kiln.capture.variables.builder was not imported: nothing can turn values into variables")


_build: Callable[[Any, Any, "Source | None"], "Variable"] = _builder_missing


def install(build: Callable[[Any, Any, "Source | None"], "Variable"]) -> None:
    """Called once by builder.py: `build(tx, value, source)` makes the variable for `value`."""
    global _build
    _build = build


def wrap(tx: Any, value: Any, source: "Source | None") -> "Variable":
    """The variable for `value`, read from the frame at `source` (None: made while capturing, not
    guarded). One variable per source: a second read gives the first one back."""
    if source is not None:
        cached = tx.output.wrapped.get(source)
        if cached is not None:
            return cached
        alias = _same_container(tx, value, source) if isinstance(value, (list, dict, set)) else _same_object(tx, value, source)
        if alias is not None:
            return alias
    var = _build(tx, value, source)
    if source is not None:
        tx.output.wrapped[source] = var
        if isinstance(value, (list, dict, set)):
            tx.output.wrapped_containers[id(value)] = (value, var)
        elif getattr(var, "one_per_object", False) and getattr(var, "value", None) is value:
            tx.output.wrapped_objects[id(value)] = (value, var)
    return var


def _same_container(tx: Any, value: Any, source: "Source") -> "Variable | None":
    """The variable of a list, dict or set already reached from another place (`self.a` and `self.b`
    one list; an argument that is also a global). One variable, so that a change made through
    either place is seen through both and replayed once; both places are pinned to this very
    object, so a later call where they are two objects compiles again."""
    seen = tx.output.wrapped_containers.get(id(value))
    if seen is None or seen[0] is not value:
        return None
    first = seen[1]
    tx.output.guards.add(Guard("ID_MATCH", first.source, value))
    tx.output.guards.add(Guard("ID_MATCH", source, value))
    tx.output.wrapped[source] = first
    return first


def _same_object(tx: Any, value: Any, source: "Source") -> "Variable | None":
    """The variable of a user object already reached from another place (an argument that is also
    an item of a frozenset argument): one variable, so that what the trace writes through one place
    is read through the other; both places are pinned to the object, as for containers."""
    seen = tx.output.wrapped_objects.get(id(value))
    if seen is None or seen[0] is not value:
        return None
    first = seen[1]
    for where in (first.source, source):
        if where is not None and not isinstance(where, ConstSource):  # (a ConstSource is pinned already)
            tx.output.guards.add(Guard("ID_MATCH", where, value))
    tx.output.wrapped[source] = first
    return first


def wrap_constant_result(value: Any) -> "Variable":
    """The variable for a value computed while capturing (no source, no guard)."""
    return _build(None, value, None)
