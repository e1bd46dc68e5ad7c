"""The CPU a benchmark ran on: its model name, the flags that decide which GEMM code wins, and its
core count; and the GPU, for a run on `--device cuda`. Every run's JSON records them
(`benchmarks.report.run_metadata`), and the machine's measured peak is cached under them
(`benchmarks.peak`).
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import time

# The vector and matrix extensions that decide which GEMM library (or kiln's own kernel) wins on a
# CPU: x86's FMA, AVX2, AVX-512 with its bfloat16 and VNNI dot products, AMX tiles; aarch64's
# NEON (asimd), SVE and bfloat16 instructions.
SPEED_FLAGS = ("fma", "avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "asimd", "sve", "bf16")


def _cpuinfo() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read().splitlines()
    except OSError:
        return []


def _field(lines: list[str], *names: str) -> str | None:
    """The value of the first line `name<spaces>: value` among `lines`."""
    for line in lines:
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in names and value.strip():
            return value.strip()
    return None


def _lscpu() -> list[str]:
    # aarch64 kernels print no "model name" in /proc/cpuinfo; lscpu decodes the part number
    # ("Neoverse-V1"), which is what a reader needs to know a Graviton from an Ampere.
    if shutil.which("lscpu") is None:
        return []
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, env={**os.environ, "LC_ALL": "C"})
    except (OSError, subprocess.SubprocessError):
        return []
    return out.stdout.splitlines()


@functools.cache
def cpu_model() -> str:
    """The CPU's model name, e.g. "Intel(R) Xeon(R) Processor" or "Neoverse-V1"."""
    return (_field(_cpuinfo(), "model name") or _field(_lscpu(), "model name")
            or platform.processor() or platform.machine() or "unknown CPU")


@functools.cache
def cpu_generation() -> str | None:
    """x86's family, model and stepping numbers, e.g. "family 26, model 2, stepping 1" (None elsewhere).
    Clouds hide the generation behind one name ("AMD EPYC" is Zen 3, 4 or 5; "Intel(R) Xeon(R)
    Processor" several Xeons), and it decides which kernel wins: the numbers tell them apart."""
    lines = _cpuinfo()
    numbers = [(name, _field(lines, name)) for name in ("cpu family", "model", "stepping")]
    if any(value is None for _, value in numbers):
        return None
    return ", ".join(f"{name.removeprefix('cpu ')} {value}" for name, value in numbers)


@functools.cache
def cpu_flags() -> tuple[str, ...]:
    """The CPU's flags among `SPEED_FLAGS`, in that order (empty where /proc/cpuinfo is unreadable)."""
    text = _field(_cpuinfo(), "flags", "features") or _field(_lscpu(), "flags") or ""
    flags = set(text.split())
    return tuple(flag for flag in SPEED_FLAGS if flag in flags)


def gpu_model() -> str:
    """The name of the current CUDA device, e.g. "NVIDIA H100 80GB HBM3" (call only where CUDA is available)."""
    import torch

    return torch.cuda.get_device_name()


def cpu_cores() -> int:
    """Logical CPUs this process may run on (a container's limit, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# /proc/stat counts in ticks of 10 ms per CPU: a shorter interval reads as noise.
_MIN_INTERVAL_S = 0.1


def busy_cpu_seconds() -> float | None:
    """CPU seconds every process on the machine has used since boot (all CPUs' non-idle time, from
    /proc/stat); None where it cannot be read. Minus this process's own CPU time over an interval,
    it says how much of the machine its neighbours took meanwhile (`OthersClock`)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal ...; idle and iowait are time no one ran.
    ticks = [int(v) for v in fields[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


class OthersClock:
    """The share of the machine's CPUs other processes used while this one ran an interval:

        clock = OthersClock()
        ...                          # the timed work
        clock.share()                # 0.0 on a quiet machine; 0.5: half the cores went to others

    (None where /proc/stat cannot be read, or the interval was under 0.1 s.) Used to flag timings
    taken on shared cores."""

    def __init__(self) -> None:
        self._busy, self._own, self._wall = busy_cpu_seconds(), time.process_time(), time.perf_counter()

    def share(self) -> float | None:
        busy = busy_cpu_seconds()
        if busy is None or self._busy is None:
            return None
        wall = time.perf_counter() - self._wall
        if wall < _MIN_INTERVAL_S:
            return None
        others = (busy - self._busy) - (time.process_time() - self._own)
        return min(1.0, max(0.0, others / (wall * (os.cpu_count() or 1))))
