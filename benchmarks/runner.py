"""Runs benchmark cases, each in its own subprocess with a time limit, so a crash or a hang is
recorded and the suite goes on; `jobs` of them at a time (`kiln bench --jobs`), whose GPU timings
take turns under one lock (`timing_lock.py`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator, TextIO

from kiln import config, logs
from benchmarks import timing_lock
from benchmarks.modes import MODES
from benchmarks.results import Case, Result


def _tail(path: Path, lines: int = 1) -> str:
    text = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return "\n".join(text[-lines:])


def _child_env(threads: int, cache_root: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    # The malloc setting this run states in its header (run_metadata's keep_freed_mb), in every
    # case's process whatever its mode: the worker applies it before anything runs (worker.py).
    env["KILN_KEEP_FREED_MB"] = str(config.runtime.keep_freed_mb)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(Path(__file__).parents[2]), env.get("PYTHONPATH")] if p)
    if cache_root is not None:
        # A cold cache per case: compile time is what a first-ever compilation costs.
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_root / "inductor")
        env["KILN_CACHE_DIR"] = str(cache_root / "kiln")
        env["TRITON_CACHE_DIR"] = str(cache_root / "triton")
    return env


# The cases' processes now running, and whether the run was stopped (`stop_running_cases`).
_running: set[subprocess.Popen] = set()
_running_lock = threading.Lock()
_stopped = threading.Event()
STOPPED = "the run was stopped (SIGTERM) before this case ended"


def stop_running_cases() -> None:
    """Kill every running case's whole process group and start no more: what `kiln bench` does on
    SIGTERM (a lease's time limit, `timeout`), since each case runs in a session of its own that
    would otherwise outlive the run, holding the GPU."""
    _stopped.set()
    with _running_lock:
        procs = list(_running)
    for proc in procs:
        _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_logged(cmd: list[str], env: dict[str, str], log_path: Path, timeout_s: float) -> int | None:
    """Run `cmd` in a session of its own, its output into `log_path`; its exit code, or None when it
    passed `timeout_s`. Its whole process group is killed at the end (compile workers it started
    must not outlive it), or at once by `stop_running_cases`."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        with _running_lock:
            _running.add(proc)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        finally:
            _kill_group(proc)
            proc.wait()
            with _running_lock:
                _running.discard(proc)


def run_in_subprocess(case: Case, timeout_s: float, cold_cache: bool = True, log_dir: Path | None = None) -> Result:
    """Run one case in a fresh interpreter; kill its whole process group if it passes `timeout_s`.
    With `log_dir`, the case's output (tracebacks, warnings) is kept there as `case_log_name(case)`."""
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        tmpdir = Path(tmp)
        result_path, log_path = tmpdir / "result.json", tmpdir / "stderr.log"
        env = _child_env(case.threads, tmpdir / "cache" if cold_cache else None)
        cmd = [sys.executable, "-m", "benchmarks.worker", json.dumps(asdict(case)), str(result_path)]
        logs.log("bench", "%s: %s", case.label, " ".join(cmd))
        start = time.perf_counter()
        returncode = run_logged(cmd, env, log_path, timeout_s)
        if log_dir is not None:
            shutil.copyfile(log_path, log_dir / case_log_name(case))
        wall_s = time.perf_counter() - start
        if _stopped.is_set() and not result_path.exists():
            return unfinished(case, result_path, "timeout", STOPPED, wall_s)
        if returncode is None:
            return unfinished(case, result_path, "timeout", f"no result after {timeout_s:.0f} s", timeout_s)
        if result_path.exists():
            return Result.from_json(json.loads(result_path.read_text()))
        why = f"exit code {returncode}" if returncode >= 0 else f"killed by {signal.Signals(-returncode).name}"
        last = _tail(log_path)
        return unfinished(case, result_path, "crash", f"{why}: {last}" if last else why, wall_s)


def unfinished(case: Case, result_path: Path, status: str, why: str, wall_s: float) -> Result:
    """The Result of a case that ended without one: `status` and `why`, and what the worker had
    measured until then (RESULT_PATH.partial: compile times, accuracy verdicts), if anything."""
    partial = Path(f"{result_path}.partial")
    if not partial.exists():
        return Result(case, status, error=why, wall_s=wall_s)
    result = Result.from_json(json.loads(partial.read_text()))
    result.status, result.error, result.wall_s = status, why, wall_s
    return result


def case_log_name(case: Case) -> str:
    """A case's log file name: model, mode, peer, threads (letters, digits, '.', '_', '-' only)."""
    name = "-".join([case.model, case.mode, *([f"vs-{case.against}"] if case.against else []), f"{case.threads}t"])
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) + ".log"


def unavailable_reason(mode: str, train: bool) -> str | None:
    return MODES[mode].unavailable_reason(train)


class Progress:
    """One line per finished case; on a terminal, a ticking line for the case that is running."""

    def __init__(self, total: int, stream: TextIO = sys.stderr) -> None:
        self.total, self.done, self.stream = total, 0, stream
        self.live = stream.isatty()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def start(self, case: Case) -> None:
        if not self.live:
            return
        self._stop.clear()
        begin = time.perf_counter()

        def tick() -> None:
            while not self._stop.wait(1.0):
                line = f"[{self.done + 1}/{self.total}] {case.label} … {time.perf_counter() - begin:.0f} s"
                self.stream.write("\r\033[K" + line)
                self.stream.flush()

        self._ticker = threading.Thread(target=tick, daemon=True)
        self._ticker.start()

    def finish(self, result: Result) -> None:
        if self._ticker is not None:
            self._stop.set()
            self._ticker.join()
            self.stream.write("\r\033[K")
        self.done += 1
        self.stream.write(f"[{self.done}/{self.total}] {result.case.label}: {_outcome(result)}\n")
        self.stream.flush()


def _outcome(result: Result) -> str:
    if result.status == "n/a":
        return f"not available ({result.error})"
    if result.status != "ok":
        measured = f" (before it: {_measured(result)})" if result.compile_s is not None else ""
        return f"{result.status.upper()} {result.error or ''}".strip() + measured
    return f"{result.speedup:.2f}x, {_measured(result)}"


def _measured(result: Result) -> str:
    """Compile time and accuracy, the peer's, and the errors against float32 where measured."""
    accuracy = "accuracy ok" if result.accuracy == "pass" else f"ACCURACY FAIL ({result.accuracy_detail})"
    parts = [f"compile {result.compile_s:.1f} s", accuracy]
    against = result.case.against
    if result.peer_error:
        parts.append(f"{against} FAILED: {result.peer_error}")
    elif result.versus_peer:
        wrong = "" if result.peer_accuracy == "pass" else ", its accuracy FAILED"
        parts.append(f"{result.versus_peer:.2f}x {against}'s time in this process{wrong}")
    elif result.peer_compile_s is not None:
        parts.append(f"{against} compile {result.peer_compile_s:.1f} s, accuracy {result.peer_accuracy}")
    if result.fp32_rel_err is not None:
        peer = f", {against}'s {result.peer_fp32_rel_err:.1e}" if result.peer_fp32_rel_err is not None else ""
        parts.append(f"error vs float32 {result.fp32_rel_err:.1e} (eager's {result.eager_fp32_rel_err:.1e}{peer})")
    return ", ".join(parts)


def _build_kiln_runtime(folder: str) -> None:
    """Build kiln's runtime and CPython extension into `folder` in a subprocess, and say how long it took."""
    start = time.perf_counter()
    code = "from kiln.native import libkiln, python_door; python_door.build_in_background(); libkiln.library(); python_door.module()"
    subprocess.run([sys.executable, "-c", code], env={**os.environ, "KILN_RUNTIME_CACHE_DIR": folder}, check=True)
    print(f"kiln's runtime and CPython extension built once for this run in {time.perf_counter() - start:.1f} s "
          "(a machine's first compile pays this once; it is in no case's compile time)", flush=True)


def run_cases(
    cases: list[Case],
    timeout_s: float,
    cold_cache: bool = True,
    progress: Progress | None = None,
    run_one: Callable[[Case, float, bool], Result] = run_in_subprocess,
    jobs: int = 1,
    on_result: Callable[[list[Result]], None] | None = None,
) -> list[Result]:
    """Run every case, `jobs` at a time, and return their results in the cases' order; modes that
    are not available are recorded without a subprocess. `on_result(finished)` is called after each
    case with the results so far, in the cases' order (to save a partial run).

    With cold caches, kiln's own libraries (its runtime and CPython extension: they depend only on
    the machine, compiler, torch and Python) come from `kiln prebuild`'s folder, as after a user's
    set-up; where it lacks them they are built here first, timed and said, into a folder every case
    shares: a case's compile time is its graphs', as Inductor's is, never a once-per-install build.

    CUDA cases time their calls under one lock (`bench.timing_lock`: the caller's, else a file made
    for the run), so cases run side by side never time on the GPU at once."""
    _stopped.clear()
    with _shared_kiln_runtime(cold_cache and any(c.mode.startswith("kiln") for c in cases)), \
            _shared_timing_lock(any(c.device == "cuda" for c in cases)):
        return _run_each(cases, timeout_s, cold_cache, progress, run_one, jobs, on_result)


@contextlib.contextmanager
def _shared_timing_lock(wanted: bool) -> Iterator[None]:
    """The GPU timing lock of a run: the caller's (`bench.timing_lock`), else a file made for the
    run; in the environment the cases' processes inherit."""
    if not wanted:
        yield
        return
    with contextlib.ExitStack() as stack:
        path = timing_lock.configured()
        if path is None:
            path = str(Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kiln-bench-lock-"))) / "gpu-timing.lock")
        before = os.environ.get(timing_lock.ENV)
        os.environ[timing_lock.ENV] = path
        try:
            yield
        finally:
            if before is None:
                del os.environ[timing_lock.ENV]
            else:
                os.environ[timing_lock.ENV] = before


@contextlib.contextmanager
def _shared_kiln_runtime(wanted: bool) -> Iterator[None]:
    if not wanted or os.environ.get("KILN_RUNTIME_CACHE_DIR"):
        yield
        return
    from kiln.native import prebuild

    if not prebuild.missing():  # the set-up's `kiln prebuild` built them, as a user's set-up does
        yield
        return
    print("kiln's own libraries are not prebuilt here (`kiln prebuild`, which `make setup` runs): ", end="")
    with tempfile.TemporaryDirectory(prefix="kiln-bench-runtime-") as shared:
        os.environ["KILN_RUNTIME_CACHE_DIR"] = shared
        try:
            _build_kiln_runtime(shared)
            yield
        finally:
            del os.environ["KILN_RUNTIME_CACHE_DIR"]


def _run_each(cases: list[Case], timeout_s: float, cold_cache: bool, progress: Progress | None,
              run_one: Callable[[Case, float, bool], Result], jobs: int,
              on_result: Callable[[list[Result]], None] | None) -> list[Result]:
    # Asked here, one after another: a mode's reason may import kiln or Dynamo, not for threads to race over.
    reasons = {key: unavailable_reason(*key) for key in dict.fromkeys((c.mode, c.train) for c in cases)}
    finished: dict[int, Result] = {}
    reporting = threading.Lock()

    def run(index: int) -> Result:
        case = cases[index]
        if progress and jobs == 1:  # (the ticking line follows one case at a time)
            progress.start(case)
        reason = reasons[(case.mode, case.train)]
        if reason is not None:
            result = Result(case, "n/a", error=reason)
        elif _stopped.is_set():
            result = Result(case, "timeout", error="not started: " + STOPPED.split(" before")[0])
        else:
            result = run_one(case, timeout_s, cold_cache)
        with reporting:
            finished[index] = result
            if progress:
                progress.finish(result)
            if on_result:
                on_result([finished[i] for i in sorted(finished)])
        return result

    if jobs == 1:
        return [run(i) for i in range(len(cases))]
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="kiln-bench-case") as pool:
        return list(pool.map(run, range(len(cases))))
