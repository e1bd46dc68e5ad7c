"""One counter that moves whenever a captured nn.Module changes.

Captured graphs read submodules, parameters and plain attributes of modules (`self.eps`,
`self.training`, `self.config`) as they were at capture time. Instead of re-checking each of
those reads on every call, kiln watches the modules a capture read (`watch`): assigning or
deleting an attribute of one (`nn.Module.__setattr__`/`__delattr__`, which `train()`/`eval()`
use), registering a child, parameter or buffer, or converting it (`_apply`: `to()`, `float()`,
...) moves the version, and every `MODULE_STRUCTURE` guard fails.

To see assignments, kiln wraps `nn.Module.__setattr__`, `__delattr__` and `_apply` once, on the
first capture; the wrappers call the originals, then check membership in a WeakSet.

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
from torch.nn.modules import module as module_file


class _State:
    def __init__(self) -> None:
        self.version = 0
        self.watched: "weakref.WeakSet[nn.Module]" = weakref.WeakSet()
        self.installed = False


STATE = _State()


def _bump_if_watched(module: nn.Module) -> None:
    if module in STATE.watched:
        STATE.version += 1


def _on_registration(module: nn.Module, name: str, value: Any) -> None:
    if not torch.compiler.is_compiling():
        _bump_if_watched(module)


def _wrap(method: Any) -> Any:
    @functools.wraps(method)
    def watched(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        if not torch.compiler.is_compiling() and STATE.watched:
            _bump_if_watched(self)
        return result

    watched.__kiln_watch__ = method  # type: ignore[attr-defined]
    return watched


def _install() -> None:
    module_file.register_module_module_registration_hook(_on_registration)
    module_file.register_module_parameter_registration_hook(_on_registration)
    module_file.register_module_buffer_registration_hook(_on_registration)
    for name in ("__setattr__", "__delattr__", "_apply"):
        method = getattr(nn.Module, name)
        if not hasattr(method, "__kiln_watch__"):
            setattr(nn.Module, name, _wrap(method))
    STATE.installed = True


def watch(module: nn.Module) -> None:
    """Count later changes of `module` as structure changes."""
    if not STATE.installed:
        _install()
    STATE.watched.add(module)
