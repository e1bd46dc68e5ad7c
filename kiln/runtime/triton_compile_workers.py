"""A GPU graph's Triton kernels compiled in worker processes, into Triton's on-disk cache.

Triton's compiler spends much of a kernel's compile in Python (its front end walks the kernel's
AST and builds the IR while holding the GIL), so threads compile one kernel at a time whatever
the machine's cores; a model's first call waited for its kernels one after another. Worker
processes compile in parallel: each imports the graph's kernel module for Triton's compiler, runs
the same `warmup` calls the launches will make (kiln/codegen/triton/kernel.py `_warmup`), and
Triton writes each binary into its cache (`TRITON_CACHE_DIR`, kiln's cache by default). The
parent's own warm-ups (`triton_kernels.precompile`) then find every binary there: the cache key is
made from the kernel's source, its arguments' specialization, the compile options and the target,
and no GPU: a worker needs none. It tells Triton the parent's GPU (`CompileOnlyDriver`: the
target's compute capability, device 0, no launches), so the key is the one the parent computes.

The workers are `python -m kiln.runtime.triton_compile_workers` processes, started once per
process at its first GPU graph and kept: a plain subprocess, not `multiprocessing`, whose spawn
would run the user's `__main__` script again in each worker. They read tasks as JSON lines on
stdin and answer each with one line; they exit when the parent closes their stdin (or exits).
Anything going wrong here is logged and costs only time: the parent's warm-ups compile what the
workers did not.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kiln import config, logs


class CompileOnlyDriver:
    """Triton's driver as far as compiling needs it: a CUDA target of the given compute
    capability, current device 0, a stream that is never used. Nothing is launched."""

    def __init__(self, capability: int, warp_size: int = 32) -> None:
        self.capability, self.warp_size, self.device = capability, warp_size, 0

    @staticmethod
    def is_active() -> bool:
        return True

    def get_current_device(self) -> int:
        return self.device

    def set_current_device(self, device: int) -> None:
        self.device = device

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", self.capability, self.warp_size)

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")


class CompileWorkers:
    """`count` worker processes and the threads that feed them tasks."""

    def __init__(self, count: int) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                             os.environ.get("PYTHONPATH", "")])}
        env.pop("TRITON_INTERPRET", None)
        command = [sys.executable, "-m", "kiln.runtime.triton_compile_workers"]
        # (stderr dropped: Triton's warnings would repeat once per worker; errors come back as answers)
        self.processes = [subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                           env=env, text=True, bufsize=1) for _ in range(count)]
        self.lock = threading.Lock()  # one batch of tasks at a time

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.processes)

    def run(self, tasks: list[dict[str, Any]]) -> list[str]:
        """Each task on some worker; the errors of those that failed (empty: all compiled)."""
        pending: queue.Queue = queue.Queue()
        for task in tasks:
            pending.put(task)
        errors: list[str] = []

        def feed(process: subprocess.Popen) -> None:
            while True:
                try:
                    task = pending.get_nowait()
                except queue.Empty:
                    return
                try:
                    process.stdin.write(json.dumps(task) + "\n")
                    process.stdin.flush()
                    answer = json.loads(process.stdout.readline() or '{"error": "the worker exited"}')
                except (OSError, ValueError) as error:
                    answer = {"error": f"{type(error).__name__}: {error}"}
                if answer.get("error"):
                    errors.append(f"{task['function']}: {answer['error']}")
                    if process.poll() is not None:
                        return

        with self.lock:
            threads = [threading.Thread(target=feed, args=(p,), daemon=True) for p in self.processes]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        return errors

    def close(self) -> None:
        for process in self.processes:
            if process.stdin:
                process.stdin.close()
        for process in self.processes:
            process.wait(timeout=30)


_WORKERS: CompileWorkers | None = None
_STARTING = threading.Lock()


def workers(count: int) -> CompileWorkers:
    """This process's workers, started at the first call (their imports take seconds, so the
    backend asks for them as soon as a GPU graph arrives, before the AOT layer) or again if one
    died."""
    global _WORKERS
    with _STARTING:
        if _WORKERS is None or not _WORKERS.alive():
            _WORKERS = CompileWorkers(max(1, count))
            # This process's own warm-ups look the workers' binaries up by the same key: its
            # part computed meanwhile (hashing releases the GIL).
            threading.Thread(target=_import_compiler, daemon=True).start()
        return _WORKERS


def compile_module(path: Path, functions: list[str], capability: int, count: int) -> list[str]:
    """Every named warm-up function of the kernel module at `path` run by the workers, for a GPU
    of compute `capability`, into Triton's cache; the errors (empty: all compiled)."""
    if not functions:
        return []
    started = time.perf_counter()
    tasks = [{"path": str(path), "function": name, "capability": capability, "kiln_cache": config.cache.dir,
              "triton_cache": os.environ.get("TRITON_CACHE_DIR", "")} for name in functions]
    errors = workers(count).run(tasks)
    logs.log("triton", "%d kernel warm-ups compiled in worker processes in %.2f s (%d failed)", len(functions),
             time.perf_counter() - started, len(errors))
    return errors


# -- the worker's side ---------------------------------------------------------------------------
_MODULES: dict[str, Any] = {}  # the kernel modules this worker has imported, by path


def _compile(task: dict[str, Any]) -> None:
    from triton.runtime import driver

    from kiln.runtime.triton_kernels import load_module

    if task["triton_cache"]:
        os.environ["TRITON_CACHE_DIR"] = task["triton_cache"]
    module = _MODULES.get(task["path"])
    if module is None:
        with config.patch({"cache.dir": task["kiln_cache"]}):
            module = _MODULES[task["path"]] = load_module(Path(task["path"]).read_text(), "cpu", interpret=False)
    before = driver._active
    driver.set_active(CompileOnlyDriver(task["capability"]))
    try:
        getattr(module, task["function"])()
    finally:
        driver._active = before


def _import_compiler() -> None:
    """What every task's compile needs, imported before the first task arrives (the parent
    starts the workers as soon as a GPU graph is on its way: kiln/backend/backends.py), so the
    first kernel's compile does not also pay for them (in a worker, and in the parent, whose
    warm-ups then load the binaries). Most of that is Triton's `triton_key`, a
    hash of its own sources and library that every compile's cache key includes, computed once
    per process: 0.34 of the 0.45 s a first compile took beyond the others on a 2-core Xeon."""
    try:
        import triton.compiler.compiler  # noqa: F401
        from triton.backends.nvidia import compiler  # noqa: F401

        import kiln.runtime.triton_kernels  # noqa: F401

        try:
            from triton.runtime.cache import triton_key  # Triton 3.3 and later
        except ImportError:
            from triton.compiler.compiler import triton_key
        triton_key()
    except Exception:  # noqa: BLE001 - a task that needs what failed reports it
        pass


def serve() -> None:
    """A worker's loop: one JSON task per line on stdin, one JSON answer per line on stdout."""
    _import_compiler()
    for line in sys.stdin:
        try:
            _compile(json.loads(line))
            answer = {}
        except Exception as error:  # noqa: BLE001 - reported to the parent, which compiles it itself
            answer = {"error": f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    serve()
