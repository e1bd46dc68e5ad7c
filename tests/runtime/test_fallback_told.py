"""A graph kiln cannot compile runs eagerly, so the user's program goes on, and the user is told: a
RuntimeWarning naming the graph and the reason, logs on or off (kiln/runtime/fallback.py); the
fallback is recorded as before."""

import pytest
import torch

import kiln
from kiln.native import build
from kiln.runtime import fallback


def test_a_graph_whose_cpp_fails_to_compile_runs_eagerly_and_is_told(tmp_path, monkeypatch):
    def failing(commands):
        raise RuntimeError("C++ compilation failed:\nkernels.cpp:1:1: error: planted")

    monkeypatch.setattr(build, "_run_all", failing)
    model, x = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval(), torch.randn(4, 8)
    with kiln.config.patch({"cache.dir": str(tmp_path / "cache"), "backend.autotune": "off"}):
        kiln.reset()
        fallback.reset()
        with pytest.warns(RuntimeWarning, match=r"graph_\d+ runs eagerly: RuntimeError: C\+\+ compilation failed:, "
                                                 r"without kiln's speed-up"):
            with torch.no_grad():
                out = kiln.compile(model)(x)
        torch.testing.assert_close(out, model(x))
        assert [f.reason for f in fallback.FALLBACKS] == ["RuntimeError: C++ compilation failed:"]
    kiln.reset()
    fallback.reset()
