"""Processes sharing one cache directory: two compile the same model at the same moment, with
kiln's default settings (autotuning on, so the autotune cache is shared too), then a third
reuses what they left. Each worker is tests/runtime/compile_worker.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from kiln import disk_cache

ROOT = Path(__file__).resolve().parents[2]


def _start(tmp_path: Path, barrier: Path, peers: int, name: str, cache: Path) -> tuple[subprocess.Popen, Path]:
    out = tmp_path / f"{name}.pt"
    env = {**os.environ, "KILN_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    env.pop("KILN_LOGS", None)
    process = subprocess.Popen([sys.executable, "-m", "tests.runtime.compile_worker", str(barrier), str(peers), str(out)],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return process, out


def _finish(process: subprocess.Popen, out: Path) -> dict:
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output[-4000:]
    return torch.load(out)


def _entries(cache: Path, kind: str, suffix: str) -> list[Path]:
    return sorted((cache / kind).rglob(f"*{suffix}"))


def test_two_processes_compile_into_one_cache_and_a_third_reuses_it(tmp_path):
    cache, barrier = tmp_path / "cache", tmp_path / "barrier"
    barrier.mkdir()
    first, second = (_start(tmp_path, barrier, 2, name, cache) for name in ("first", "second"))
    a, b = _finish(*first), _finish(*second)
    for seen in (a, b):
        assert seen["fallbacks"] == []
        torch.testing.assert_close(seen["compiled"], seen["eager"])
    assert torch.equal(a["compiled"], b["compiled"])  # the same autotune choices, the same library

    # Each autotune question measured by one process only (the other waited for its answer), and
    # each C++ library built once; every entry is whole, and nothing half-written is left.
    questions = _entries(cache, "autotune", ".json")
    libraries = _entries(cache, "cpp", ".so")
    assert questions and libraries
    assert a["measured"] + b["measured"] == len(questions)
    # (kiln's own runtime libraries are built into the test run's runtime folder, not this cache,
    # by these processes when no earlier test of the run has built them: once, too.)
    built = [line.split()[3].rstrip(":") for seen in (a, b) for line in seen["log"] if "C++ cache miss" in line]
    assert len(built) == len(set(built)) and {p.stem[:12] for p in libraries} <= set(built)
    for entry in [*questions, *libraries, *_entries(cache, "aot", ".pkl")]:
        assert disk_cache.read(entry) is not None, entry
    leftovers = [p for p in cache.rglob("*") if p.is_file() and not p.name.endswith((".json", ".so", ".pkl", ".sha256", ".lock"))]
    assert leftovers == [] and [p for p in cache.rglob("*.so.*") if p.is_dir()] == []

    third = _finish(*_start(tmp_path, tmp_path, 1, "third", cache))
    assert torch.equal(third["compiled"], a["compiled"])
    assert third["measured"] == 0
    assert not [line for line in third["log"] if "cache miss" in line]
    assert [line for line in third["log"] if "AOT graph cache hit" in line]
