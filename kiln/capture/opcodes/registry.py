"""The opcode table and the decorator that fills it."""

from __future__ import annotations

from typing import Callable

from kiln.capture.bytecode import PY

HANDLERS: dict[str, Callable] = {}
ALL = ((3, 11), (3, 12), (3, 13))
SINCE_312 = ((3, 12), (3, 13))
UNTIL_312 = ((3, 11), (3, 12))


def opcode(*names: str, versions: tuple[tuple[int, int], ...] = ALL) -> Callable[[Callable], Callable]:
    """Register the decorated function for `names` when the running Python is one of `versions`."""

    def register(fn: Callable) -> Callable:
        if PY in versions:
            for name in names:
                if name in HANDLERS:
                    raise ValueError(f"opcode {name} has two handlers")
                HANDLERS[name] = fn
        return fn

    return register
