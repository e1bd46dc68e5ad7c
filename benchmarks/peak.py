"""The machine's measured peak: float32 GFLOP/s from a large GEMM and GB/s from a large copy, at a
given thread count. The gemm suite (`kiln bench --suite gemm`) and `kiln profile` state each
GEMM's and kernel's speed as a fraction of it, a roofline without a datasheet.

    from benchmarks.peak import machine_peak
    peak = machine_peak(threads=2)      # Peak(gflops=331.0, gbps=18.2, cpu='Intel(R) Xeon(R) ...', threads=2)

Measuring takes a few seconds, so a result is measured once and kept in kiln's cache directory
(`<cache dir>/peak/`, a small JSON file written atomically, kiln/disk_cache.py) under a key made of
the CPU model, its speed flags, the torch version and the thread count: a new torch (a new MKL) or
another CPU measures again. The GEMM figure is the better of two libraries, `torch.mm` (MKL on x86) and
oneDNN's packed linear: MKL's dispatch on AMD CPUs reaches 80 % of what the machine can do (178
against oneDNN's 210 GFLOP/s on a 2-core AMD EPYC with AVX-512), and a roof one library happens
to miss would let every other GEMM show more than 100 %. kiln's own GEMM is not a candidate: the
peak is what it is judged against. On a shared machine a neighbour can take half the cores mid-measure and
halve the "peak" for good; so a measurement during which other processes used more than a tenth of
the CPUs is tried again, and never cached if that persists.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from dataclasses import asdict, dataclass

import torch

from kiln import disk_cache
from benchmarks.machine import OthersClock, cpu_flags, cpu_generation, cpu_model

# Bump when the measurement changes, so old figures are not read as new ones.
_METHOD = 3  # 3: the best of torch.mm and oneDNN's packed linear
_GEMM_SIZE = 2048  # n of the first n x n x n float32 GEMM timed
_GEMM_MAX_SIZE = 8192
# A GEMM call shorter than this leaves threads idle at its edges (many cores): double n and
# measure again, keeping the best.
_GEMM_MIN_CALL_S = 0.05
_COPY_BYTES = 256 << 20  # each of source and destination: far beyond any CPU's last-level cache per core
_RUNS = 5  # best of this many calls (after one warm-up): the peak is what the machine can do
# When other processes took more than this share of the machine's CPUs during a measurement, the
# figure is partly the neighbours' leftovers, not the machine's peak.
_MAX_OTHERS_SHARE = 0.1
_ATTEMPTS = 3  # measurements tried before a contended figure is used, uncached

_MEMORY: dict[str, "Peak"] = {}


@dataclass(frozen=True)
class Peak:
    """float32 GFLOP/s of the best large library GEMM and GB/s of the best large copy (bytes read plus
    bytes written), measured on `cpu` with `threads` torch threads; and the bfloat16 GEMM's
    GFLOP/s (AMX or avx512_bf16 make it several times the float32 figure)."""

    gflops: float
    gbps: float
    cpu: str
    threads: int
    bf16_gflops: float | None = None


def best_seconds(run, runs: int = _RUNS) -> float:
    """The fastest of `runs` timed calls of `run`, after one untimed call."""
    run()  # warm-up: page faults, library dispatch, thread pool start
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def _library_gemms(a: torch.Tensor, b: torch.Tensor) -> list:
    """Calls computing a @ b through each GEMM library torch carries: torch.mm, and oneDNN's linear
    over a weight packed once (where torch was built with oneDNN)."""
    out = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype)
    calls = [lambda: torch.mm(a, b, out=out)]
    if torch.backends.mkldnn.is_available():
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous(), a.shape[0])
            linear = torch.ops.mkldnn._linear_pointwise
            linear(a, packed, None, "none", [], "")
            calls.append(lambda: linear(a, packed, None, "none", [], ""))
        except RuntimeError:  # a dtype this build's oneDNN does not pack
            pass
    return calls


def _gemm_gflops(dtype: torch.dtype = torch.float32) -> float:
    """Best GFLOP/s of the libraries' GEMMs at n = 2048, or larger while a call is too short to
    keep every thread busy."""
    best, n = 0.0, _GEMM_SIZE
    while True:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        seconds = min(best_seconds(call) for call in _library_gemms(a, b))
        best = max(best, 2 * n**3 / seconds / 1e9)
        if seconds >= _GEMM_MIN_CALL_S or n >= _GEMM_MAX_SIZE:
            return best
        n *= 2


def _copy_gbps() -> float:
    """Best GB/s of a 256 MB float32 copy_, counting the bytes read and the bytes written."""
    src = torch.randn(_COPY_BYTES // 4)
    dst = torch.empty_like(src)
    seconds = best_seconds(lambda: dst.copy_(src))
    return 2 * _COPY_BYTES / seconds / 1e9


def peak_key(threads: int) -> str:
    """The cache key of the peak at `threads` threads on this machine and torch."""
    text = json.dumps([_METHOD, cpu_model(), cpu_generation(), list(cpu_flags()), torch.__version__, threads])
    return hashlib.sha256(text.encode()).hexdigest()


def _load(path) -> Peak | None:
    data = disk_cache.read(path)
    if data is None:
        return None
    try:
        return Peak(**json.loads(data))
    except (ValueError, TypeError):
        return None


def _measure(threads: int) -> tuple[Peak, bool]:
    """The peak, and whether every figure was measured with the cores to itself; tried again
    (keeping each figure's best) while another process took part of them."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    best: Peak | None = None
    try:
        for attempt in range(_ATTEMPTS):
            if attempt:
                time.sleep(1.0)  # let the neighbour's burst pass
            clock = OthersClock()
            with torch.no_grad():
                peak = Peak(gflops=_gemm_gflops(), gbps=_copy_gbps(), cpu=cpu_model(), threads=threads,
                            bf16_gflops=_gemm_gflops(torch.bfloat16))
            best = peak if best is None else Peak(
                max(best.gflops, peak.gflops), max(best.gbps, peak.gbps), peak.cpu, threads,
                max(best.bf16_gflops or 0.0, peak.bf16_gflops or 0.0) or None)
            others = clock.share()
            if others is None or others <= _MAX_OTHERS_SHARE:
                return best, True
    finally:
        torch.set_num_threads(before)
    return best, False


def machine_peak(threads: int | None = None) -> Peak:
    """This machine's peak at `threads` torch threads (default: torch's current count), measured
    on the first call ever for this CPU, torch and thread count, then read from the cache.

    Example::

        peak = machine_peak(2)
        print(f"{250.0 / peak.gflops:.0%} of peak")   # a kernel measured at 250 GFLOP/s
    """
    threads = threads or torch.get_num_threads()
    key = peak_key(threads)
    if key in _MEMORY:
        return _MEMORY[key]
    path = disk_cache.entry("peak", key, ".json")
    peak = _load(path)
    if peak is None:
        # One process measures while others sharing the cache wait: two measuring at once would
        # each see half the machine and record it as the peak.
        with disk_cache.locked(path):
            peak = _load(path)
            if peak is None:
                peak, alone = _measure(threads)
                if alone:
                    disk_cache.write(path, json.dumps(asdict(peak), indent=1).encode())
                else:
                    warnings.warn(f"kiln: the machine's peak at {threads} thread{'s' if threads > 1 else ''} was measured while other processes "
                                  f"used its cores ({peak.gflops:.0f} GFLOP/s, likely low); not cached, measured again "
                                  "by the next process", stacklevel=2)
    _MEMORY[key] = peak
    return peak


def clear_memory() -> None:
    """Forget this process's peaks (tests: make the next call read the disk)."""
    _MEMORY.clear()
