"""kiln.debug.minify: a failure planted in one op of a 300-node graph shrinks to a repro of a few
nodes that, run as a script, fails the same way.

How failures are planted: one entry of kiln's lowering table (`LOWERINGS[aten.tanh.default]`) is
replaced by a function of PLANTED: one that raises (a compile failure) or one that computes
sigmoid instead (an accuracy failure). In this process the test patches it with monkeypatch. The
written repro.py runs in a subprocess, which no monkeypatch reaches: RUN_PLANTED plants the same
function there, then runs repro.py as __main__. With the plant undone, the same repro prints `ok`.
"""

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import fx

import kiln
from kiln import config
from kiln.debug import minify, minify_model
from kiln.debug.check import Failure, compile_failure
from kiln.debug.minify import repro_settings
from kiln.debug.repro import load_repro, write_repro
from kiln.debug.shrink import shrink
from kiln.debug.subgraph import cut_out, intermediate_values, op_nodes
from kiln.lowering.pointwise import pointwise
from kiln.lowering.registry import LOWERINGS

REPO = Path(__file__).resolve().parents[2]
TANH = torch.ops.aten.tanh.default


def raising_tanh(x):
    raise RuntimeError("planted tanh lowering failure")


def tanh_as_sigmoid(x):
    return pointwise("sigmoid", [x])


PLANTED = {"compile": raising_tanh, "accuracy": tanh_as_sigmoid}

RUN_PLANTED = """
import runpy, sys, torch
from kiln.lowering.registry import LOWERINGS
from tests.debug.test_minify import PLANTED
LOWERINGS[torch.ops.aten.tanh.default] = PLANTED[sys.argv[1]]
runpy.run_path(sys.argv[2], run_name="__main__")
"""


def run_planted(path, planted):
    """repro.py at `path` run in a fresh Python with the failure `planted` (a PLANTED key)."""
    command = [sys.executable, "-c", RUN_PLANTED, planted, str(path)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(command, cwd=path.parent, env=env, capture_output=True, text=True, timeout=120)


STEPS = ("torch.sin(h)", "h * 1.5", "h + x", "torch.abs(h)", "h - 0.25", "torch.neg(h)", "h * 0.7")


def chain(n_ops=300, tanh_at=None):
    """A traced graph of `n_ops` op nodes over inputs x (8, 16) and w (16, 16): pointwise ops, a
    matmul every 40 and a mean-centering every 50 (a reduction), the running value output every 50
    ops (a long chain of squashing ops would hide a wrong value from the last output), and one
    torch.tanh at position `tanh_at`."""
    lines, count = [], 0
    while count < n_ops:
        if count == tanh_at:
            line, size = "h = torch.tanh(h)", 1
        elif count % 40 == 39:
            line, size = "h = h @ w", 1
        elif count % 50 == 48:
            line, size = "h = h - h.mean(-1, keepdim=True); outs.append(h)", 2
        else:
            line, size = f"h = {STEPS[count % len(STEPS)]}", 1
        lines.append(line)
        count += size
    source = "def forward(self, x, w):\n    h, outs = x, []\n" + "".join(f"    {line}\n" for line in lines)
    namespace = {"torch": torch}
    exec(source + "    return (*outs, h)\n", namespace)
    gm = fx.symbolic_trace(type("Chain", (torch.nn.Module,), {"forward": namespace["forward"]})())
    assert len(op_nodes(gm)) == n_ops
    return gm


def chain_inputs():
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(8, 16, generator=generator), torch.randn(16, 16, generator=generator) / 4]


def has_tanh(gm):
    return any(n.target is torch.tanh for n in gm.graph.nodes)


def test_shrink_finds_one_node_in_300_by_bisection_and_two_interacting_ones():
    kept, search = shrink(300, lambda kept: 150 in kept, budget=60)
    assert kept == [150] and search.tests <= 20
    kept, search = shrink(300, lambda kept: {40, 290} <= set(kept), budget=60)
    assert kept == [40, 290] and search.tests <= 60


def test_the_same_failure_is_the_same_kind_and_for_a_compile_error_the_same_type_and_first_line():
    planted = compile_failure(RuntimeError("planted\nin tanh_3"))
    assert planted == Failure("compile", "RuntimeError: planted")
    assert planted.same_as(compile_failure(RuntimeError("planted\nin tanh")))
    assert not planted.same_as(compile_failure(ValueError("planted")))
    assert not planted.same_as(compile_failure(RuntimeError("planted elsewhere")))
    assert not planted.same_as(Failure("accuracy", "RuntimeError: planted")) and not planted.same_as(None)
    assert Failure("accuracy", "output 3: ...").same_as(Failure("accuracy", "output 0: ..."))


@pytest.mark.parametrize("kind", ["compile", "accuracy"])
def test_planted_failure_in_300_nodes_shrinks_to_a_repro_that_fails_the_same_way(kind, monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(LOWERINGS, TANH, PLANTED[kind])
    result = minify(chain(tanh_at=150), chain_inputs(), failure=kind, out_dir=tmp_path)

    assert result.failure.kind == kind
    assert result.nodes_before == 300 and result.nodes_after <= 10
    assert has_tanh(result.gm)
    assert result.compiles <= 60
    assert result.repro == tmp_path / "repro.py" and result.repro_checked
    text = result.repro.read_text()
    assert "import kiln" in text and "Op nodes: 300 in the graph given" in text
    if kind == "compile":
        expected = result.failure.message
        assert expected == "RuntimeError: planted tanh lowering failure"
    else:
        # The whole graph's first wrong output is the fourth (after tanh); the repro's only output is.
        assert result.failure.message.startswith("output 3: max abs error")
        expected = "AssertionError: output 0: max abs error"
    planted = run_planted(result.repro, kind)
    assert planted.returncode != 0 and expected in planted.stderr, planted.stderr[-2000:]
    monkeypatch.undo()  # kiln fixed: the same repro passes (run here: a fresh Python costs ~5 s)
    runpy.run_path(str(result.repro), run_name="__main__")
    assert capsys.readouterr().out.strip() == "ok"


def test_a_passing_graph_gives_no_repro_and_says_so(tmp_path):
    result = minify(chain(n_ops=20), chain_inputs(), out_dir=tmp_path)
    assert result.failure is None and result.repro is None and result.gm is None
    assert "does not fail under kiln: kiln compiles and runs it within tolerance" in str(result)
    assert not (tmp_path / "repro.py").exists()


def test_a_graph_failing_another_way_than_asked_is_not_minified(monkeypatch, tmp_path):
    monkeypatch.setitem(LOWERINGS, TANH, tanh_as_sigmoid)
    result = minify(chain(n_ops=20, tanh_at=10), chain_inputs(), failure="compile", out_dir=tmp_path)
    assert result.failure is None and "does not fail compile under kiln: it fails accuracy: output" in str(result)
    result = minify(chain(n_ops=20, tanh_at=10), chain_inputs(), same=lambda failure: "NaN" in failure.message,
                    out_dir=tmp_path)
    assert result.failure is None and "does not fail as `same` asks under kiln: it fails accuracy" in str(result)
    assert not (tmp_path / "repro.py").exists()


def test_minify_model_finds_the_failing_graph_kiln_captures(monkeypatch, tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    monkeypatch.setitem(LOWERINGS, TANH, raising_tanh)
    # Autotuning off: where it times a GEMM with the tanh as its post-op fastest, the tanh is never
    # lowered (and the graph does not fail) — a choice that differs from machine to machine.
    with config.patch({"backend.autotune": "off"}):
        result = minify_model(model, torch.randn(8, 16), out_dir=tmp_path)
    assert result.failure == Failure("compile", "RuntimeError: planted tanh lowering failure")
    assert result.nodes_before == 3 and result.nodes_after == 1 and has_tanh(result.gm)
    assert result.repro_checked


@pytest.mark.parametrize("exact", [False, True])
def test_a_repro_defines_the_graph_its_constants_and_inputs(exact, tmp_path):
    """Without compiling: the cut-out middle of a captured Linear-ReLU-Linear, written and loaded
    back, computes what the original computes there (exact values), or has its shapes (random)."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    (gm, inputs), = kiln.debug.captured_graphs(model, torch.randn(8, 16))
    values = intermediate_values(gm, inputs)
    small, small_inputs = cut_out(gm, op_nodes(gm)[1:], values)  # relu, linear: its weights are constants
    path = write_repro(tmp_path, small, small_inputs, Failure("accuracy", "planted"), "notes", {}, 1e-3, 1e-3, exact)
    loaded, loaded_inputs, settings = load_repro(path)
    assert settings == {} and (tmp_path / "repro_inputs.pt").exists() == exact
    assert [t.shape for t in loaded_inputs] == [(8, 16)]
    expected, got = small(*small_inputs)[0], loaded(*loaded_inputs)[0]
    assert torch.equal(got, expected) == exact and got.shape == expected.shape
    assert torch.equal(expected, model(inputs[0]))


def test_a_repro_sets_again_the_settings_that_change_what_is_built():
    with kiln.config.patch({"backend.cpp_wrapper": False, "debug.logs": ("graph",)}):
        settings = repro_settings()
    assert settings["backend.cpp_wrapper"] is False
    assert not [name for name in settings if name.startswith(("cache.", "debug.logs"))]
