"""benchmarks/tools/gpu_check.sh, the GPU check that runs unattended on a lent machine: its syntax, and in a dry
run every command it would run, each `kiln bench` one parsed by kiln's own arguments."""

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import torch

import benchmarks.runner
from kiln.cli import main

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "tools" / "gpu_check.sh"
RUNS = {"bf16-b8", "bf16-b8-ro", "amp-train-b8", "bf16-b1", "bf16-b1-ro"}


def test_the_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def _dry_run(tmp_path, **env) -> list[list[str]]:
    """The commands a dry run says it would run, split as the shell would."""
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "GPU_CHECK_DRY": "1", "OUT": str(out), "TMPDIR": str(tmp_path), **env})
    assert proc.returncode == 0, proc.stderr
    assert list(out.iterdir()) == [out / "gpu_check.log"]  # nothing ran; the log holds the commands
    return [shlex.split(line[2:]) for line in proc.stdout.splitlines() if line.startswith("+ ")]


def _bench_args(command: list[str]) -> list[str]:
    start = command.index("benchmarks") + 1
    assert command[start - 2:start + 1] == ["-m", "benchmarks", "bench"]
    return command[start:]


@pytest.fixture
def parsed(monkeypatch):
    """`kiln bench ARGS` as the GPU machine would take them, with a stand-in GPU: the cases it would run."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *device: "NVIDIA Stand-in")
    seen = []
    monkeypatch.setattr(benchmarks.runner, "run_cases", lambda cases, *a, **kw: seen.append((cases, kw)) or [])

    def parse(args):
        seen.clear()
        assert main(args) == 0
        return seen[0]

    return parse


def test_a_dry_run_says_every_command_and_each_bench_run_is_valid(tmp_path, parsed):
    commands = _dry_run(tmp_path)
    tests = [c for c in commands if "pytest" in c]
    assert len(tests) == 1 and tests[0][:4] == ["timeout", "-k", "10", "90"]
    assert "benchmarks.timing_lock" in tests[0] and "tests/gpu" in tests[0]
    benches = {}
    for command in (c for c in commands if "bench" in c and "benchmarks" in c):
        assert command[:3] == ["timeout", "-k", "20"] and 60 <= int(command[3]) <= 240  # stopped before the deadline
        args = _bench_args(command)
        json_path = Path(args[args.index("--json") + 1])
        benches[json_path.stem] = parsed(args)
        assert json_path.parent == tmp_path / "out" and json_path.suffix == ".json"
    assert set(benches) == RUNS and len(RUNS) + 3 <= 8  # (+ log, markdown, profile) a lease returns 8 files at most
    profile, train_profile = [c for c in commands if "benchmarks/tools/gpu_profile.py" in c]  # (both into one file)
    for command in (profile, train_profile):
        assert "benchmarks.timing_lock" in command and command[command.index("--modes") + 1] == "kiln,inductor"
    assert "--train" not in profile and "--train" in train_profile
    assert train_profile[train_profile.index("--models") + 1] == "bert"
    for name, (cases, options) in benches.items():
        assert options["jobs"] == (2 if name == "bf16-b1" else 4)  # (beside the main lane's second run: fewer)
        assert all(c.device == "cuda" and c.iters == 30 and c.warmup == 3 and c.threads == 2 for c in cases)
    inference = {name: cases for name, (cases, _) in benches.items() if name != "amp-train-b8"}
    for name, cases in inference.items():
        assert [c.model for c in cases] == ["bert", "gpt2", "resnet50", "mistral", "esm"]
        assert all(c.dtype == "bfloat16" and c.batch == (1 if "b1" in name else 8) and not c.train for c in cases)
        ro = name.endswith("-ro")
        assert {(c.mode, c.against) for c in cases} == (
            {("kiln-reduce-overhead", "inductor-reduce-overhead")} if ro else {("kiln", "inductor")})
    (train,) = benches["amp-train-b8"][0]
    assert (train.model, train.train, train.autocast, train.dtype, train.batch) == ("bert", True, "bfloat16", None, 8)
    assert (train.mode, train.against) == ("kiln", "inductor")


def test_batch_1_can_be_left_out(tmp_path):
    commands = _dry_run(tmp_path, BATCH1="0")
    names = {Path(c[c.index("--json") + 1]).stem for c in commands if "--json" in c}
    assert names == RUNS - {"bf16-b1", "bf16-b1-ro"}


def test_runs_that_cannot_fit_before_the_deadline_are_not_started(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(["bash", str(SCRIPT), "100"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "GPU_CHECK_DRY": "1", "OUT": str(out), "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "bf16-b8: not run" not in proc.stdout  # ~70 s left: the first runs start, limited to them
    assert re.search(r"bf16-b1: not run, (69|70) s left before the deadline \(it needs 90\)", proc.stdout)
    commands = [shlex.split(line[2:]) for line in proc.stdout.splitlines() if line.startswith("+ ")]
    assert all(int(c[3]) <= 70 for c in commands if c[0] == "timeout" and "bench" in c)
