"""Offline autotuning (kiln/autotune/record.py): a run under backend.autotune=record measures
nothing and logs its questions; `kiln autotune --answer LOG` measures them; a later process reads
every answer and measures nothing, the answers being the online tuner's own questions."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kiln
from kiln import config
from kiln.autotune.choose import COUNTS, clear_memory
from kiln.autotune.cli import answer
from kiln.autotune.record import recorded
from kiln.backend import watch

MODEL = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).eval()
x = torch.randn(32, 64)
"""


def _model():
    scope: dict = {}
    exec(MODEL, scope)
    return scope["model"], scope["x"]


def _compile_counting(cache: Path, mode: str):
    model, x = _model()
    kiln.reset()
    clear_memory()
    before = dict(COUNTS)
    with config.patch({"cache.dir": str(cache), "backend.autotune": mode}), torch.no_grad(), watch() as built:
        torch.testing.assert_close(kiln.compile(model)(x), model(x))
    return {k: COUNTS[k] - before[k] for k in COUNTS}, built


def _answer_files(cache: Path) -> set[str]:
    return {p.name for p in (cache / "autotune").rglob("*.json")}


def _externs(built) -> list[str]:
    graph = built[0].runtime
    return [str(step.op) for step in graph.program.externs]


def test_record_answer_and_a_second_process_that_measures_nothing(tmp_path):
    cache = tmp_path / "cache"
    counts, built = _compile_counting(cache, "record")
    assert counts["measured"] == 0 and counts["recorded"] >= 2  # two GEMMs (the second with its GELU)
    assert not any(op.startswith("kiln.mm") for op in _externs(built))  # what autotune=off runs: ATen's GEMMs
    log = cache / "autotune" / "recorded.jsonl"
    questions = recorded(log)
    assert len(questions) == counts["recorded"] and {q["op"] for q in questions} == {"mm"}
    assert all(q["threads"] == torch.get_num_threads() for q in questions)
    assert _answer_files(cache) == set()

    with config.patch({"cache.dir": str(cache)}):
        rows = answer(str(log))
    assert len(rows) == len(questions) and all(row["measured"] for row in rows)
    with config.patch({"cache.dir": str(cache)}):
        assert not any(row["measured"] for row in answer(str(log)))  # asked again: answered

    # The online tuner, in a cache of its own, asks exactly these questions.
    counts, _ = _compile_counting(tmp_path / "online", "default")
    assert counts["measured"] == len(questions)
    assert _answer_files(tmp_path / "online") == _answer_files(cache)

    # A new process reading the answered cache measures nothing and runs the answers.
    script = MODEL + """
import json, kiln
from kiln.autotune.choose import COUNTS
from kiln.backend import watch
with torch.no_grad(), watch() as built:
    kiln.compile(model)(x)
print(json.dumps({"counts": COUNTS, "externs": [str(s.op) for s in built[0].runtime.program.externs]}))
"""
    env = {**os.environ, "KILN_CACHE_DIR": str(cache), "KILN_AUTOTUNE": "default"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    second = json.loads(done.stdout.strip().splitlines()[-1])
    assert second["counts"]["measured"] == 0 and second["counts"]["cached"] == len(questions)
    chosen = {json.loads(p.read_text())["choice"] for p in (cache / "autotune").rglob("*.json")}
    assert bool(chosen - {"aten"}) == any(op.startswith("kiln.mm") for op in second["externs"])


def test_a_broken_log_is_refused_by_line(tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_text('{"op": "mm"}\nnot json\n')
    with pytest.raises(ValueError, match="log.jsonl:2: not a JSON line"):
        recorded(log)
    log.write_text('{"op": "softmax"}\n')
    with pytest.raises(ValueError, match="log.jsonl:1: not an autotune question"):
        recorded(log)
