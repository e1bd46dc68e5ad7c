"""The machine's peak is measured once per CPU, torch and thread count, then read from kiln's cache."""

import time

import pytest

import kiln
from benchmarks import peak


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """Stand-in measurements that count their calls (the real ones take seconds), and a private cache."""
    calls = []

    def gemm(dtype=peak.torch.float32):
        calls.append(("gemm", peak.torch.get_num_threads()))
        return 100.0 * peak.torch.get_num_threads() * (4 if dtype == peak.torch.bfloat16 else 1)

    monkeypatch.setattr(peak, "_gemm_gflops", gemm)
    monkeypatch.setattr(peak, "_copy_gbps", lambda: 10.0)
    peak.clear_memory()
    with kiln.config.patch({"cache.dir": str(tmp_path / "cache")}):
        yield calls
    peak.clear_memory()


def test_measured_once_then_cached_per_thread_count(counted):
    first = peak.machine_peak(1)
    assert first == peak.Peak(gflops=100.0, gbps=10.0, cpu=peak.cpu_model(), threads=1, bf16_gflops=400.0)
    assert peak.machine_peak(1) == first and len(counted) == 2  # float32 and bfloat16
    peak.clear_memory()  # a new process: read from disk, nothing measured
    assert peak.machine_peak(1) == first and len(counted) == 2
    # Another thread count is another question, measured at that count.
    assert peak.machine_peak(2).gflops == 200.0 and counted == [("gemm", 1)] * 2 + [("gemm", 2)] * 2
    assert peak.peak_key(1) != peak.peak_key(2)


def test_default_is_torchs_thread_count(counted):
    assert peak.machine_peak().threads == peak.torch.get_num_threads()


def test_a_torn_entry_is_measured_again(counted):
    peak.machine_peak(1)
    path = kiln.disk_cache.entry("peak", peak.peak_key(1), ".json")
    path.write_text("{torn")
    peak.clear_memory()
    assert peak.machine_peak(1).gflops == 100.0 and len(counted) == 4


def test_a_peak_measured_on_shared_cores_is_retried_and_not_cached(counted, monkeypatch):
    shares = iter([0.5, 0.5, 0.5, 0.0])  # three contended attempts, then a quiet one

    class Clock:
        def share(self):
            return next(shares)

    monkeypatch.setattr(peak, "OthersClock", Clock)
    monkeypatch.setattr(peak.time, "sleep", lambda s: None)
    with pytest.warns(UserWarning, match="not cached"):
        assert peak.machine_peak(1).gflops == 100.0
    assert len(counted) == 6  # float32 and bfloat16, three attempts
    peak.clear_memory()
    peak.machine_peak(1)  # the next process measures again; alone this time, so it is kept
    peak.clear_memory()
    peak.machine_peak(1)
    assert len(counted) == 8


def test_others_clock_reads_a_share_of_the_machine():
    from benchmarks.machine import OthersClock

    clock = OthersClock()
    assert clock.share() is None  # too short to read at /proc/stat's 10 ms ticks
    end = time.perf_counter() + 0.15
    while time.perf_counter() < end:  # this process's own work is not the others'
        pass
    share = clock.share()
    assert share is None or 0.0 <= share <= 1.0


def test_the_gemm_peak_is_the_best_library_and_each_computes_the_product():
    # MKL's dispatch on AMD CPUs reaches ~80 % of oneDNN's speed: a peak from torch.mm alone would
    # put every other GEMM above 100 %. Each library call must compute a @ b, or its time means nothing.
    a, b = peak.torch.randn(64, 48), peak.torch.randn(48, 32)
    calls = peak._library_gemms(a, b)
    assert len(calls) == (2 if peak.torch.backends.mkldnn.is_available() else 1)
    for call in calls:
        peak.torch.testing.assert_close(call(), a @ b, rtol=1e-4, atol=1e-4)
