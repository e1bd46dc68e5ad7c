"""`kiln bench --jobs N`: cases side by side, their GPU timings one at a time under one lock, and a
run's files saved after each case."""

import argparse
import json
import os
import signal
import sys
import threading
import time

import pytest

from kiln import config
from benchmarks import cli, runner, timing_lock, worker
from benchmarks.results import Case, Result


def _cases(n, device="cpu"):
    return [Case("mlp", "eager", 1, iters=i + 1, device=device) for i in range(n)]


def test_jobs_run_cases_side_by_side_and_return_them_in_order():
    both_running = threading.Barrier(2, timeout=30)  # broken unless two cases run at once

    def run_one(case, timeout_s, cold_cache):
        both_running.wait()
        time.sleep(0.2 if case.iters == 1 else 0.0)  # the first case finishes last
        return Result(case, "ok")

    cases = _cases(4)
    seen = []
    results = runner.run_cases(cases, 60.0, cold_cache=False, run_one=run_one, jobs=2,
                               on_result=lambda done: seen.append([r.case.iters for r in done]))
    assert [r.case for r in results] == cases
    assert len(seen) == 4 and seen[-1] == [1, 2, 3, 4]
    assert all(s == sorted(s) for s in seen)  # each partial list in the cases' order


def test_one_job_runs_cases_one_after_another():
    running = []

    def run_one(case, timeout_s, cold_cache):
        running.append(case)
        assert len(running) == 1
        running.clear()
        return Result(case, "ok")

    assert len(runner.run_cases(_cases(3), 60.0, cold_cache=False, run_one=run_one)) == 3


def test_cuda_cases_share_a_timing_lock_made_for_the_run_or_the_callers(monkeypatch, tmp_path):
    monkeypatch.delenv(timing_lock.ENV, raising=False)
    monkeypatch.setattr(config.bench, "timing_lock", "")
    seen = []

    def run_one(case, timeout_s, cold_cache):
        path = os.environ.get(timing_lock.ENV)
        assert path is None or os.path.isdir(os.path.dirname(path))
        seen.append(path)
        return Result(case, "ok")

    runner.run_cases(_cases(2, "cuda"), 60.0, cold_cache=False, run_one=run_one, jobs=2)
    assert seen[0] and seen[0] == seen[1]
    assert timing_lock.ENV not in os.environ and not os.path.exists(os.path.dirname(seen[0]))  # gone after the run
    runner.run_cases(_cases(1, "cpu"), 60.0, cold_cache=False, run_one=run_one)
    assert seen[2] is None  # CPU runs take no lock
    monkeypatch.setattr(config.bench, "timing_lock", str(tmp_path / "shared.lock"))  # e.g. benchmarks/tools/gpu_check.sh's
    runner.run_cases(_cases(1, "cuda"), 60.0, cold_cache=False, run_one=run_one)
    assert seen[3] == str(tmp_path / "shared.lock")


def test_the_lock_lets_one_holder_at_a_time(tmp_path):
    path = str(tmp_path / "gpu.lock")
    waited = []
    with timing_lock.held(path):
        other = threading.Thread(target=lambda: waited.append(timing_lock.held(path).__enter__()))
        other.start()
        time.sleep(0.3)
        assert not waited  # still waiting for the first holder
    other.join(10)
    assert waited and waited[0] >= 0.25
    with timing_lock.held(None) as nothing:
        assert nothing is None


def test_the_lock_runs_a_command_once_free(tmp_path, monkeypatch):
    # `python -m benchmarks.timing_lock CMD...` (benchmarks/tools/gpu_check.sh runs tests/gpu so), in a thread here.
    path = str(tmp_path / "gpu.lock")
    monkeypatch.setattr(config.bench, "timing_lock", path)
    codes = []
    with timing_lock.held(path):
        other = threading.Thread(target=lambda: codes.append(timing_lock.main([sys.executable, "-c", "exit(3)"])))
        other.start()
        other.join(1.0)
        assert not codes  # waits while the lock is held
    other.join(60)
    assert codes == [3]  # and then runs, its exit code passed on
    assert timing_lock.main([]) == 2
    monkeypatch.setattr(config.bench, "timing_lock", "")
    assert timing_lock.main(["true"]) == 2  # no lock named: refused, not run unlocked


def test_a_cuda_cases_timing_phase_holds_the_lock_a_cpu_case_none(monkeypatch):
    held = []
    monkeypatch.setattr(timing_lock, "held", lambda path: held.append(path) or timing_lock.contextlib.nullcontext(0.5))
    monkeypatch.setattr(config.bench, "timing_lock", "/tmp/some.lock")
    with worker._timing_lock(Case("mlp", "eager", 1, device="cuda")) as waited:
        assert waited == 0.5
    worker._timing_lock(Case("mlp", "eager", 1))
    assert held == ["/tmp/some.lock", None]


def test_a_run_is_saved_after_each_case(tmp_path):
    args = argparse.Namespace(json=str(tmp_path / "run.json"), markdown=str(tmp_path / "run.md"))
    meta = dict(task="inference", suite="gpu", threads=[1], iters=5, warmup=1, cache="cold", torch="2.x",
                cpu="cpu", cores=2, date="today", jobs=3, device="cuda")
    done = [Result(Case("bert", "kiln", 1, device="cuda"), "ok", accuracy="pass", eager_ms=2.0, compiled_ms=1.0,
                   speedup=2.0, compile_s=3.0)]
    cli.save_partial(done, 2, meta, args)
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["meta"]["finished"] == "1 of 2 cases" and len(data["results"]) == 1
    md = (tmp_path / "run.md").read_text()
    assert "PARTIAL: 1 of 2 cases" in md and "3 cases at once (compile times inflated" in md
    assert "calls timed one at a time on the GPU" in md
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json", "run.md"]  # (written whole, then renamed)


@pytest.mark.parametrize("jobs", [1, 2])
def test_unavailable_modes_need_no_subprocess_with_any_jobs(jobs):
    cases = [Case("mlp", "inductor-freeze", 1, train=True), Case("mlp", "eager", 1)]
    ran = []
    results = runner.run_cases(cases, 60.0, cold_cache=False, run_one=lambda c, *a: ran.append(c) or Result(c, "ok"),
                               jobs=jobs)
    assert [r.status for r in results] == ["n/a", "ok"] and ran == cases[1:]


def test_stopping_a_run_kills_running_cases_and_starts_no_more(tmp_path):
    """What `kiln bench` does on SIGTERM: every case's process group killed at once, none started after."""
    codes = []
    sleeper = threading.Thread(target=lambda: codes.append(
        runner.run_logged(["sleep", "60"], dict(os.environ), tmp_path / "sleep.log", timeout_s=60)))
    start = time.perf_counter()
    sleeper.start()
    time.sleep(0.5)
    runner.stop_running_cases()
    sleeper.join(10)
    assert codes == [-9] and time.perf_counter() - start < 10 and not runner._running
    try:
        results = runner._run_each(_cases(2), 60.0, False, None, lambda *a: pytest.fail("a case started"), 2, None)
        assert [r.status for r in results] == ["timeout", "timeout"] and "not started" in results[0].error
    finally:
        runner._stopped.clear()
    ok = runner.run_cases(_cases(1), 60.0, cold_cache=False, run_one=lambda c, *a: Result(c, "ok"))
    assert ok[0].status == "ok"  # a new run starts afresh


def test_sigterm_stops_the_cases_and_exits(monkeypatch):
    stopped = []
    monkeypatch.setattr(runner, "stop_running_cases", lambda: stopped.append(True))
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(SystemExit) as exit:
            cli._stop_on_sigterm(15, None)
        assert exit.value.code == 143 and stopped == [True]
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # timeout's second SIGTERM (to the group) ignored
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_case_log_name_is_safe_for_a_lease_to_return():
    case = Case("bert", "kiln-reduce-overhead", 2, against="inductor-reduce-overhead")
    assert runner.case_log_name(case) == "bert-kiln-reduce-overhead-vs-inductor-reduce-overhead-2t.log"
    assert runner.case_log_name(Case("a/b c", "eager", 1)) == "a_b_c-eager-1t.log"


def test_a_case_that_ends_without_a_result_keeps_what_it_had_measured(tmp_path):
    case = Case("bert", "kiln", 1, against="inductor", dtype="bfloat16")
    so_far = Result(case, "ok", compile_s=12.5, accuracy="pass", peer_compile_s=8.0, peer_accuracy="pass",
                    fp32_rel_err=3e-3, eager_fp32_rel_err=4e-3, peer_fp32_rel_err=5e-3)
    worker.write_result(str(tmp_path / "result.json.partial"), so_far)
    r = runner.unfinished(case, tmp_path / "result.json", "timeout", runner.STOPPED, 99.0)
    assert (r.status, r.error, r.wall_s, r.compile_s, r.peer_compile_s) == ("timeout", runner.STOPPED, 99.0, 12.5, 8.0)
    line = runner._outcome(r)
    assert line.startswith("TIMEOUT the run was stopped") and "compile 12.5 s, accuracy ok" in line
    assert "inductor compile 8.0 s" in line and "error vs float32 3.0e-03 (eager's 4.0e-03, inductor's 5.0e-03)" in line
    bare = runner.unfinished(case, tmp_path / "other.json", "crash", "killed by SIGSEGV", 5.0)
    assert (bare.status, bare.error, bare.compile_s) == ("crash", "killed by SIGSEGV", None)


def test_the_worker_saves_what_it_measured_after_each_compile(monkeypatch):
    saved = []
    r = worker.run_case(Case("mlp", "eager", 1, iters=1, warmup=0, against="eager"),
                        checkpoint=lambda so_far: saved.append((so_far.compile_s, so_far.peer_compile_s, so_far.eager_ms)))
    assert r.status == "ok" and len(saved) == 2
    assert saved[0][0] is not None and saved[0][1] is None and saved[1][1] is not None  # the mode's, then the peer's
    assert all(eager_ms is None for *_, eager_ms in saved)  # before the timing
