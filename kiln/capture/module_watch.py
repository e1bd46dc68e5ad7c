"""One counter that moves whenever a captured nn.Module changes.

Captured graphs read submodules, parameters and plain attributes of modules (`self.eps`,
`self.training`, `self.config`) as they were at capture time. Instead of re-checking each of
those reads on every call, kiln watches the modules a capture read (`watch`): assigning or
deleting an attribute of one (`nn.Module.__setattr__`/`__delattr__`, which `train()`/`eval()`
use; assigning an int, bool, string, None or tuple of them equal to the attribute's value, or the
very object it holds, is no change, and so is assigning an attribute no capture read: `note_read`),
registering a child, parameter or buffer, or converting it (`_apply`: `to()`, `float()`,
...) moves the version, and every `MODULE_STRUCTURE` guard fails.

To see assignments and registrations, kiln wraps `nn.Module.__setattr__`, `__delattr__`,
`_apply`, `register_parameter`, `register_buffer` and `add_module` once, on the first capture; the
wrappers call the originals, then check membership in a WeakSet. Not torch's global registration
hooks (`register_module_parameter_registration_hook` and the others): Dynamo guards every frame it
compiles on those hook tables being empty, so that kiln's first capture made each function
torch.compile had compiled before it compile again, once (a HuggingFace decoder's prompt and step
under Inductor in the same process as kiln: ~20 s each, inside the llm suite's first timed round).

The wrappers do nothing while torch.compile (Dynamo) traces through them: reading the WeakSet
there put kiln's watched set into Dynamo's guards (a recompile whenever kiln watched another
module, and an IndexError while building the guard when a watched module died during the
compile).

Not seen: changes made inside code that torch.compile compiled, writes that bypass those methods (`module.__dict__[...] = `, `object.__setattr__`,
`module._modules[...] = `), in-place changes of a mutable attribute's contents (those contents
are guarded where the trace reads them), and `param.data = ...`. Call `kiln.reset()` after such
a change.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch
from torch import nn


class _State:
    def __init__(self) -> None:
        self.version = 0
        self.watched: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()
        # The instance attributes some capture read of each watched module ("__dict__": all of them).
        self.read: "weakref.WeakKeyDictionary[nn.Module, set[str]]" = weakref.WeakKeyDictionary()
        self.installed = False


STATE = _State()


def _bump_if_watched(module: nn.Module) -> None:
    if module in STATE.watched:
        STATE.version += 1


_CONSTANTS = (int, bool, str, bytes, type(None))
ABSENT = object()


def same_constant(old: Any, new: Any) -> bool:
    """`new` is `old`, or an equal value of the same immutable constant type (tuples of them
    included; floats by their repr, so 0.0 and -0.0 differ): assigning it changes nothing a
    capture read."""
    if old is new:
        return True
    if type(old) is not type(new):
        return False
    if isinstance(old, tuple):
        return len(old) == len(new) and all(same_constant(a, b) for a, b in zip(old, new))
    if isinstance(old, float):
        return repr(old) == repr(new)
    return isinstance(old, _CONSTANTS) and old == new


def _wrap(method: Any) -> Any:
    @functools.wraps(method)
    def watched(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        if not torch.compiler.is_compiling() and STATE.watched:
            _bump_if_watched(self)
        return result

    watched.__kiln_watch__ = method  # type: ignore[attr-defined]
    return watched


def note_read(module: nn.Module, name: str) -> None:
    """A capture read instance attribute `name` of `module` (or, `name` "__dict__", all of them)."""
    STATE.read.setdefault(module, set()).add(name)


def _read_by_a_capture(module: nn.Module, name: str) -> bool:
    names = STATE.read.get(module)
    return names is not None and (name in names or "__dict__" in names)


def _wrap_setattr(method: Any) -> Any:
    # A forward that re-assigns an attribute the value it already has (HF's Swin sets
    # `self.shift_size = 0` and `self.window_size = ...` on every call of its last stage's layers)
    # changes nothing: counting it failed every guard on the next call, a recompile per call.
    # Nor does an attribute no capture read: HF's `generate` sets `_previous_max_cache_length` on
    # the model whenever a static cache of another length is made, which failed every graph's
    # guard, the prompt's and the step's compiled again for each length up to the limit.
    # Registering a parameter or buffer moves the version through the wrapped register_parameter
    # and register_buffer, which __setattr__ calls; a child module (or None in its place) it
    # registers itself, as add_module would: that moves it here.
    @functools.wraps(method)
    def watched(self: nn.Module, name: str, value: Any) -> None:
        if torch.compiler.is_compiling() or not STATE.watched or self not in STATE.watched:
            method(self, name, value)
            return
        old = self.__dict__.get(name, ABSENT)
        child = isinstance(value, nn.Module) or (value is None and name in self.__dict__.get("_modules", {}))
        method(self, name, value)
        if child or (old is ABSENT or not same_constant(old, value)) and _read_by_a_capture(self, name):
            STATE.version += 1

    watched.__kiln_watch__ = method  # type: ignore[attr-defined]
    return watched


def _install() -> None:
    for name in ("__setattr__", "__delattr__", "_apply", "register_parameter", "register_buffer", "add_module"):
        method = getattr(nn.Module, name)
        if not hasattr(method, "__kiln_watch__"):
            setattr(nn.Module, name, (_wrap_setattr if name == "__setattr__" else _wrap)(method))
    STATE.installed = True


class Snapshot:
    """The version a frame's MODULE_STRUCTURE guard expects. A frame whose writes to watched modules
    leave every attribute it read holding the constant it read (side_effects.py
    `module_writes_keep_reads`) moves it past its own writes after replaying them (capture/frame.py):
    its next call matches, while every other frame's guard still fails."""

    def __init__(self, version: int) -> None:
        self.version = version

    def __repr__(self) -> str:
        return str(self.version)


def watch(module: nn.Module) -> None:
    """Count later changes of `module` as structure changes."""
    if not STATE.installed:
        _install()
    STATE.watched.add(module)
