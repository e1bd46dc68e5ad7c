"""Blocks a graph break is inside: entered again by the runner before the rest of the frame runs.

A graph ends in the grad mode and autocast state it started in; when its frame broke inside
`with torch.no_grad():` or `with torch.autocast("cpu", ...):`, the runner switches to the block's
state again and puts on the stack an `__exit__` that restores the state outside the block, so the
resume function (which starts inside the block) leaves it as the original code would.
"""

from __future__ import annotations

from typing import Any

import torch


def autocast_state() -> tuple:
    """CPU autocast: (enabled, dtype), the state kiln's guards check (GLOBAL_STATE autocast_cpu)."""
    return (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))


def set_autocast_state(state: tuple) -> None:
    enabled, dtype = state
    torch.set_autocast_enabled("cpu", enabled)
    torch.set_autocast_dtype("cpu", dtype)


def reentered_grad_mode_exit(prior: bool, enabled: bool) -> Any:
    """Switch grad mode to `enabled`; the returned `__exit__` restores `prior`."""
    torch._C._set_grad_enabled(prior)
    return torch.set_grad_enabled(enabled).__exit__


def grad_mode_object(cls: type, enabled: bool, prior: bool | None) -> Any:
    """A grad-mode object as the trace left it, the grad mode unchanged: `set_grad_enabled(enabled)`
    that restores `prior` on exit, or `no_grad()` / `enable_grad()` not entered."""
    current = torch.is_grad_enabled()
    obj = cls(enabled) if cls is torch.set_grad_enabled else cls()
    torch._C._set_grad_enabled(current)  # (set_grad_enabled switches on construction: the runner has set the mode)
    if prior is not None:
        obj.prev = prior
    return obj


class ReenteredAutocast:
    """A CPU autocast block entered again: switches to (`enabled`, `dtype`) now; `__exit__`
    restores the state from before."""

    def __init__(self, enabled: bool, dtype: torch.dtype) -> None:
        self.enabled, self.dtype = enabled, dtype
        self.prior = autocast_state()
        set_autocast_state((enabled, dtype))

    def __exit__(self, *exc: Any) -> bool:
        set_autocast_state(self.prior)
        return False


def reentered_autocast_exit(enabled: bool, dtype: torch.dtype) -> Any:
    return ReenteredAutocast(enabled, dtype).__exit__


def with_grad_mode(enabled: bool, fn: Any) -> Any:
    """`fn` run in grad mode `enabled`, as `torch.enable_grad()(fn)` / `torch.no_grad()(fn)` /
    `torch.set_grad_enabled(mode)(fn)` made it in the traced code (alive at a graph break, or
    returned)."""
    import functools

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch.set_grad_enabled(enabled):
            return fn(*args, **kwargs)

    return run
