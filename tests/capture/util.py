"""Shared checks for capture tests: run a function eagerly and through kiln.compile, compare."""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch

import kiln


def assert_same(actual: Any, expected: Any) -> None:
    """Same structure, same Python values, tensors equal (close for floats)."""
    assert type(actual) is type(expected), f"{type(actual).__name__} != {type(expected).__name__}"
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-6)
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e)
    elif isinstance(expected, dict):
        assert list(actual) == list(expected)
        for k in expected:
            assert_same(actual[k], expected[k])
    elif hasattr(expected, "__dataclass_fields__"):
        for name in expected.__dataclass_fields__:
            assert_same(getattr(actual, name), getattr(expected, name))
    else:
        assert actual == expected, f"{actual!r} != {expected!r}"


def check(fn: Callable, *args: Any, backend: str = "eager", graphs: int = 1, **kwargs: Any) -> Any:
    """Compile `fn` with fullgraph=True (no fallback allowed), run it and eager on copies of the
    arguments, and compare results and the arguments afterwards (mutations must match too).

    Returns the compiled function, whose `kiln_cache.entries` tests may inspect.
    """
    compiled = kiln.compile(fn, backend=backend, fullgraph=True)
    eager_args, eager_kwargs = copy.deepcopy((args, kwargs))
    expected = fn(*eager_args, **eager_kwargs)
    compiled_args, compiled_kwargs = copy.deepcopy((args, kwargs))
    actual = compiled(*compiled_args, **compiled_kwargs)
    assert_same(actual, expected)
    assert_same(compiled_args, eager_args)
    assert_same(compiled_kwargs, eager_kwargs)
    assert len(compiled.kiln_cache.entries) == graphs, f"expected {graphs} compiled entries"
    assert compiled.kiln_cache.fallback is None
    return compiled


def op_count(compiled: Any, entry: int = 0) -> int:
    """How many tensor operations the captured graph of one entry holds."""
    return compiled.kiln_cache.entries[entry].stats["ops"]

