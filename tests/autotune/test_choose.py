"""Autotuning picks the measured fastest candidate, keeps the answer on disk, and a later process
uses it without measuring; a damaged entry is measured again."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

import kiln
from kiln.autotune import choose, store
from kiln.autotune.choose import clear_memory


@pytest.fixture(autouse=True)
def private_cache(tmp_path):
    clear_memory()
    with kiln.config.patch({"cache.dir": str(tmp_path / "cache")}):
        yield tmp_path / "cache"
    clear_memory()


def _sleeper(seconds, calls):
    def run():
        calls.append(seconds)
        time.sleep(seconds)
    return run


def test_the_faster_candidate_wins_and_is_remembered():
    calls = []
    candidates = {"slow": _sleeper(0.004, calls), "fast": _sleeper(0.001, calls)}
    assert choose("demo", (1, 2), candidates, budget_s=0.01) == "fast"
    measured = len(calls)
    assert choose("demo", (1, 2), candidates, budget_s=0.01) == "fast" and len(calls) == measured
    assert choose("demo", (1, 3), candidates, budget_s=0.01) == "fast" and len(calls) > measured  # a new question


def test_within_three_percent_the_first_candidate_wins(monkeypatch):
    from kiln.autotune import timing

    clock = [0.0]
    monkeypatch.setattr(timing, "_clock", lambda: clock[0])

    def taking(seconds):
        def run():
            clock[0] += seconds
        return run

    assert choose("demo", "tie", {"first": taking(1.0), "second": taking(0.98)}) == "first"
    assert choose("demo", "clear", {"first": taking(1.0), "second": taking(0.9)}) == "second"


_CHILD = textwrap.dedent("""
    import sys, time
    import kiln
    from kiln.autotune import choose
    kiln.config.cache.dir = sys.argv[1]
    measured = []
    def sleeper(s):
        return lambda: (measured.append(s), time.sleep(s))
    # Measuring now would pick "b"; the answer written by the first process says "a".
    print(choose("demo", ("shape",), {"a": sleeper(float(sys.argv[2])), "b": sleeper(float(sys.argv[3]))}, budget_s=0.01), len(measured))
""")


def _child(cache, a, b):
    out = subprocess.run([sys.executable, "-c", _CHILD, str(cache), str(a), str(b)], capture_output=True, text=True, check=True)
    choice, measured = out.stdout.split()
    return choice, int(measured)


def test_a_result_written_by_one_process_is_used_by_the_next(private_cache):
    choice, measured = _child(private_cache, 0.001, 0.004)
    assert choice == "a" and measured > 0
    choice, measured = _child(private_cache, 0.004, 0.001)
    assert choice == "a" and measured == 0


def test_a_damaged_entry_is_measured_again(private_cache):
    calls = []
    assert choose("demo", "damaged", {"a": _sleeper(0.001, calls), "b": _sleeper(0.004, calls)}, budget_s=0.01) == "a"
    (entry,) = [p for p in private_cache.rglob("*.json")]
    entry.write_text(entry.read_text().replace('"a"', '"b"'))  # edited: its digest no longer matches
    clear_memory()
    calls.clear()
    assert choose("demo", "damaged", {"a": _sleeper(0.001, calls), "b": _sleeper(0.004, calls)}, budget_s=0.01) == "a"
    assert calls  # measured again, not read


def test_a_question_no_candidate_could_run_is_not_remembered(private_cache):
    """Candidates that raise are left out and the answer says why; where none ran, the first is
    taken for this call and nothing is stored: a later question measures again."""
    calls = []

    def unsupported():
        raise RuntimeError("this library has no such dtype\nmore")

    assert choose("demo", "partly", {"a": unsupported, "b": _sleeper(0.001, calls)}, budget_s=0.01) == "b"
    (entry,) = private_cache.rglob("*.json")
    assert json.loads(entry.read_text())["failed"] == {"a": "RuntimeError: this library has no such dtype"}
    assert choose("demo", "none", {"a": unsupported, "b": unsupported}, budget_s=0.01) == "a"
    assert len(list(private_cache.rglob("*.json"))) == 1  # the first answer only
    clear_memory()
    assert choose("demo", "none", {"a": unsupported, "b": _sleeper(0.001, calls)}, budget_s=0.01) == "b"


def test_the_key_names_threads_and_candidates():
    import torch

    key = store.question_key("mm", (1, 2), ["a", "b"])
    assert key != store.question_key("mm", (1, 2), ["a", "c"])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert key != store.question_key("mm", (1, 2), ["a", "b"])
    finally:
        torch.set_num_threads(threads)


def test_the_key_of_a_question_with_kiln_s_kernels_names_their_source(monkeypatch):
    # A faster kiln GEMM is timed again rather than losing to its older self's stored answers;
    # questions among libraries alone keep their answers.
    with_kiln, libraries = store.question_key("mm", (1, 2), ["aten", "kiln"]), store.question_key("mm", (1, 2), ["aten", "mkl"])
    monkeypatch.setattr(store.kernels_unit, "source", lambda: "// another kiln GEMM")
    store._kiln_kernels.cache_clear()
    try:
        assert store.question_key("mm", (1, 2), ["aten", "kiln"]) != with_kiln
        assert store.question_key("mm", (1, 2), ["aten", "mkl"]) == libraries
    finally:
        store._kiln_kernels.cache_clear()


def test_a_gemm_with_a_post_op_also_times_onednn_and_kiln_with_the_op_inside(monkeypatch):
    import torch

    from kiln.autotune import gemm

    seen = {}

    def record(op, signature, candidates, budget_s, max_rounds, cleanup=None, question=None, default=None):
        seen.update(signature=signature, names=list(candidates))
        for run in candidates.values():  # every candidate computes the same activated product
            seen.setdefault("outs", []).append(run())
        return gemm.FUSED_POST_OP

    monkeypatch.setattr(gemm, "choose", record)
    a, b, bias = torch.empty(8, 16), torch.empty(16, 32), torch.empty(32)
    assert gemm.choose_mm(a, b, bias, "default", ("gelu", [], "tanh")) == gemm.FUSED_POST_OP
    plain = gemm.mm_impls(torch.float32)
    # kiln's GEMM first, so that a tie goes to it; the others in the table's order
    assert seen["names"] == ["kiln", *(n for n in plain if n != "kiln"), *gemm.FUSED_POST_OPS]
    assert seen["signature"][-3:] == ("gelu", (), "tanh")
    assert (seen["outs"][0] >= -0.2).all()  # gelu's minimum is about -0.17: the op was applied
    for out in seen["outs"][1:]:
        torch.testing.assert_close(out, seen["outs"][0], rtol=1e-4, atol=1e-4)


def _kiln_autotune(cache):
    env = {**os.environ, "KILN_CACHE_DIR": str(cache), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "kiln", "autotune", "benchmarks.models:workload", "mlp", "--threads", "1"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = [line for line in done.stdout.splitlines() if line.startswith("| mlp |")]
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_kiln_autotune_measures_once_and_a_second_process_reads_the_cache(tmp_path):
    first = _kiln_autotune(tmp_path / "cache")
    assert int(first[2]) > 0  # questions measured
    # Without the compiled graphs (the AOT cache would skip compiling altogether), a second process
    # asks the same questions and the autotune cache answers them all.
    shutil.rmtree(tmp_path / "cache" / "aot")
    second = _kiln_autotune(tmp_path / "cache")
    assert int(second[2]) == 0 and int(second[3]) == int(first[2]) + int(first[3])


def test_an_answer_stored_where_no_candidate_ran_is_asked_again(private_cache):
    """Such answers were stored before 2026-12-01 (the first candidate, nothing measured): one is
    not loaded, the question is measured."""
    calls = []
    candidates = {"a": _sleeper(0.004, calls), "b": _sleeper(0.001, calls)}
    key = store.question_key("demo", "old", list(candidates))
    store.save(key, {"op": "demo", "signature": "'old'", "choice": "a", "seconds": {"a": float("inf"), "b": float("inf")},
                     "rounds": 0, "remeasured": [], "extra_rounds": 0})
    assert store.load(key) is None
    assert choose("demo", "old", candidates, budget_s=0.01) == "b" and calls
