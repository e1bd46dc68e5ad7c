"""Values that change between calls are never baked into a graph: impure C calls run eagerly
(recorded), and state read from the standard library (os.environ) is guarded."""

import os
import random
import time

import pytest
import torch

import kiln

@pytest.mark.parametrize("impure", [lambda: random.random(), lambda: time.perf_counter()], ids=["random", "clock"])
def test_impure_calls_run_eagerly_every_time(impure):
    def f(x):
        return x + impure()

    compiled = kiln.compile(f, backend="eager")
    x = torch.zeros(1, dtype=torch.float64)
    first, second = compiled(x), compiled(x)
    assert not torch.equal(first, second)  # a value computed once while capturing would repeat
    # A graph break at the call, which runs for real on every call (the frame's closure cell,
    # `impure`, goes to the resume function), recorded where it happened.
    assert len(compiled.kiln_cache.entries) == 1 and compiled.kiln_cache.fallback is None
    assert kiln.capture.BREAKS[-1].kind == "unsupported_call" and kiln.capture.BREAKS[-1].resumed
    with pytest.raises(kiln.CaptureError, match="C code kiln does not model"):
        kiln.compile(f, backend="eager", fullgraph=True)(x)


def test_environment_read_is_guarded(monkeypatch):
    def f(x):
        return x * len(os.environ.get("KILN_TEST_FLAG", ""))

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.ones(2)
    monkeypatch.delenv("KILN_TEST_FLAG", raising=False)
    assert compiled(x).sum() == 0
    monkeypatch.setenv("KILN_TEST_FLAG", "abc")
    assert compiled(x).sum() == 6
    assert len(compiled.kiln_cache.entries) == 2
