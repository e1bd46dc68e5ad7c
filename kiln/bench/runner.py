"""Runs benchmark cases, each in its own subprocess with a time limit, so a crash or a hang is
recorded and the suite goes on."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator, TextIO

from kiln import logs
from kiln.bench.modes import MODES
from kiln.bench.results import Case, Result


def _tail(path: Path, lines: int = 1) -> str:
    text = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return "\n".join(text[-lines:])


def _child_env(threads: int, cache_root: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(Path(__file__).parents[2]), env.get("PYTHONPATH")] if p)
    if cache_root is not None:
        # A cold cache per case: compile time is what a first-ever compilation costs.
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_root / "inductor")
        env["KILN_CACHE_DIR"] = str(cache_root / "kiln")
        env["TRITON_CACHE_DIR"] = str(cache_root / "triton")
    return env


def run_in_subprocess(case: Case, timeout_s: float, cold_cache: bool = True) -> Result:
    """Run one case in a fresh interpreter; kill its whole process group if it passes `timeout_s`."""
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        tmpdir = Path(tmp)
        result_path, log_path = tmpdir / "result.json", tmpdir / "stderr.log"
        env = _child_env(case.threads, tmpdir / "cache" if cold_cache else None)
        cmd = [sys.executable, "-m", "kiln.bench.worker", json.dumps(asdict(case)), str(result_path)]
        logs.log("bench", "%s: %s", case.label, " ".join(cmd))
        start = time.perf_counter()
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                returncode = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return Result(case, "timeout", error=f"no result after {timeout_s:.0f} s", wall_s=timeout_s)
            finally:
                # Compile workers the case started must not outlive it.
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if result_path.exists():
            return Result.from_json(json.loads(result_path.read_text()))
        why = f"exit code {returncode}" if returncode >= 0 else f"killed by {signal.Signals(-returncode).name}"
        last = _tail(log_path)
        return Result(case, "crash", error=f"{why}: {last}" if last else why, wall_s=time.perf_counter() - start)


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
        return f"{result.status.upper()} {result.error or ''}".strip()
    accuracy = "accuracy ok" if result.accuracy == "pass" else f"ACCURACY FAIL ({result.accuracy_detail})"
    peer = ""
    if result.peer_error:
        peer = f", {result.case.against} FAILED: {result.peer_error}"
    elif result.versus_peer:
        wrong = "" if result.peer_accuracy == "pass" else ", its accuracy FAILED"
        peer = f", {result.versus_peer:.2f}x {result.case.against}'s time in this process{wrong}"
    return f"{result.speedup:.2f}x, compile {result.compile_s:.1f} s, {accuracy}{peer}"


def _build_kiln_runtime(folder: str) -> None:
    """Build kiln's runtime and CPython extension into `folder` in a subprocess, and say how long it took."""
    start = time.perf_counter()
    code = "from kiln.native import python_door, runtime; python_door.build_in_background(); runtime.library(); python_door.module()"
    subprocess.run([sys.executable, "-c", code], env={**os.environ, "KILN_RUNTIME_CACHE_DIR": folder}, check=True)
    print(f"kiln's runtime and CPython extension built once for this run in {time.perf_counter() - start:.1f} s "
          "(a machine's first compile pays this once; it is in no case's compile time)", flush=True)


def run_cases(
    cases: list[Case],
    timeout_s: float,
    cold_cache: bool = True,
    progress: Progress | None = None,
    run_one: Callable[[Case, float, bool], Result] = run_in_subprocess,
) -> list[Result]:
    """Run every case in order; modes that are not available are recorded without a subprocess.

    With cold caches, kiln's own libraries (its runtime and CPython extension: they depend only on
    the machine, compiler, torch and Python, and a machine builds them once, on its first compile)
    are built here first, timed and said, into a folder every case shares: a case's compile time
    is its graphs', as Inductor's is, not a once-per-machine build repeated per case."""
    with _shared_kiln_runtime(cold_cache and any(c.mode.startswith("kiln") for c in cases)):
        return _run_each(cases, timeout_s, cold_cache, progress, run_one)


@contextlib.contextmanager
def _shared_kiln_runtime(wanted: bool) -> Iterator[None]:
    if not wanted or os.environ.get("KILN_RUNTIME_CACHE_DIR"):
        yield
        return
    with tempfile.TemporaryDirectory(prefix="kiln-bench-runtime-") as shared:
        os.environ["KILN_RUNTIME_CACHE_DIR"] = shared
        try:
            _build_kiln_runtime(shared)
            yield
        finally:
            del os.environ["KILN_RUNTIME_CACHE_DIR"]


def _run_each(cases: list[Case], timeout_s: float, cold_cache: bool, progress: Progress | None,
              run_one: Callable[[Case, float, bool], Result]) -> list[Result]:
    results = []
    reasons: dict[tuple[str, bool], str | None] = {}
    for case in cases:
        key = (case.mode, case.train)
        if key not in reasons:
            reasons[key] = unavailable_reason(case.mode, case.train)
        if progress:
            progress.start(case)
        if reasons[key] is not None:
            result = Result(case, "n/a", error=reasons[key])
        else:
            result = run_one(case, timeout_s, cold_cache)
        if progress:
            progress.finish(result)
        results.append(result)
    return results
