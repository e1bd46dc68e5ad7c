"""kiln bench end to end: real subprocesses, real torch.compile, and the files it writes."""

import json
import subprocess
import sys

import matplotlib.image
import pytest

import kiln
from kiln import heap
from benchmarks.results import Case
from benchmarks.runner import run_in_subprocess


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    cmd = [sys.executable, "-m", "kiln.cli", "bench", "--models", "mlp", "--modes", "eager,inductor,kiln",
           "--threads", "1", "--iters", "3", "--warmup", "1", "--timeout", "600",
           "--json", str(out / "run.json"), "--markdown", str(out / "run.md"), "--plot", str(out / "run.png")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_every_mode_is_reported(run):
    out, proc = run
    data = json.loads((out / "run.json").read_text())
    by_mode = {r["mode"]: r for r in data["results"]}
    assert list(by_mode) == ["eager", "inductor", "kiln"]
    inductor = by_mode["inductor"]
    assert inductor["status"] == "ok" and inductor["accuracy"] == "pass"
    assert inductor["compile_s"] > 0 and inductor["speedup"] > 0 and inductor["peak_rss_mb"] > 0
    assert inductor["graphs"] == 1 and inductor["graph_breaks"] == 0
    kiln = by_mode["kiln"]  # kiln's own capture and backend: one graph, nothing run eagerly
    assert kiln["status"] == "ok" and kiln["accuracy"] == "pass", kiln["error"]
    assert kiln["graphs"] == 1 and kiln["graph_breaks"] == 0 and kiln["fallbacks"] == 0
    assert data["meta"]["threads"] == [1] and data["meta"]["torch"]
    assert "[3/3] mlp · kiln · 1 thread:" in proc.stderr


def test_every_cases_process_runs_under_the_runs_malloc_setting():
    # An eager case's process as much as a kiln one's, from its start: glibc's thresholds are the
    # whole process's, so a comparison is equal only when every side runs under the same ones.
    case = Case("mlp", "eager", 1, iters=1, warmup=0)
    assert run_in_subprocess(case, 600).malloc.startswith("left alone (runtime.keep_freed_mb = 0")
    if heap._glibc_mallopt() is None:
        return
    with kiln.config.patch({"runtime.keep_freed_mb": 64}):
        result = run_in_subprocess(case, 600)
    assert result.status == "ok" and "up to 64 MiB of freed heap kept" in result.malloc


def test_an_impossible_mode_is_not_available(tmp_path):
    # Inductor freezes for inference only: said so, never run under its name.
    cmd = [sys.executable, "-m", "kiln.cli", "bench", "--models", "mlp", "--modes", "inductor-freeze", "--train",
           "--threads", "1", "--iters", "1", "--warmup", "0", "--json", str(tmp_path / "run.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    (result,) = json.loads((tmp_path / "run.json").read_text())["results"]
    assert result["status"] == "n/a" and "inference only" in result["error"]
    assert "mlp · inductor-freeze · 1 thread: not available" in proc.stderr
    assert "not available" in proc.stdout


def test_outputs_are_valid(run):
    out, proc = run
    md = (out / "run.md").read_text()
    assert "![speedup per model and mode](run.png)" in md
    assert "| mlp | 1 | eager | ok | pass |" in md
    assert "Summary per mode" in proc.stdout
    image = matplotlib.image.imread(out / "run.png")
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_report_re_renders_a_saved_run(run, tmp_path):
    out, _ = run
    proc = subprocess.run([sys.executable, "-m", "kiln.cli", "report", str(out / "run.json"),
                           "--markdown", str(tmp_path / "again.md")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "again.md").read_text() == (out / "run.md").read_text().replace(
        "\n![speedup per model and mode](run.png)\n", "")


def test_training_step_through_inductor():
    r = run_in_subprocess(Case("mlp", "inductor", 1, train=True, iters=2, warmup=1), timeout_s=600)
    assert r.status == "ok" and r.accuracy == "pass", r.error


def test_a_hang_becomes_a_timeout():
    # Importing torch alone takes longer than this, so the case is killed mid-way.
    r = run_in_subprocess(Case("mlp", "eager", 1), timeout_s=0.2)
    assert r.status == "timeout" and "no result after" in r.error


def test_a_dying_worker_becomes_a_crash():
    r = run_in_subprocess(Case("no-such-model", "eager", 1), timeout_s=600)
    assert r.status == "crash" and "exit code 1" in r.error and "no-such-model" in r.error
