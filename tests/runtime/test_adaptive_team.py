"""The team of threads kiln's parallel regions ask for (src/kiln_team.cpp, runtime.adaptive_team):
OpenMP's count, less a thread for each IN_A_ROW busy checks in a row (the calling thread waiting
for a core), one given back after a hold that doubles with each busy try. The policy replayed over
made-up checks; the runtime narrowing beside real busy processes; a compiled graph's kernels and
kiln's GEMM asking the runtime; the setting off leaving OpenMP's count."""

import ctypes
import os
import subprocess
import sys
import time

import pytest
import torch

import kiln
from kiln import config
from kiln.externs import native_ops
from kiln.native import libkiln

MS = 1_000_000  # ns
CHECK, HOLD, LONGEST = 20 * MS, 250 * MS, 4000 * MS  # (kiln_team.cpp's constants)
IN_A_ROW = 3  # busy checks that take a thread off (BUSY_CHECKS)


@pytest.fixture
def runtime():
    lib = libkiln.library()
    yield lib
    lib.kiln_set_adaptive_team(0)  # (forgets any cut this test made)
    libkiln.apply_settings()


def _replay(runtime, checks: list[tuple[int, bool]], full: int) -> list[int]:
    n = len(checks)
    now = (ctypes.c_int64 * n)(*[t for t, _ in checks])
    busy = (ctypes.c_int32 * n)(*[int(b) for _, b in checks])
    cuts = (ctypes.c_int32 * n)()
    runtime.kiln_team_replay(ctypes.c_int64(n), now, busy, ctypes.c_int32(full), cuts)
    return list(cuts)


def _every_check(busy: list[bool], start: int = 0) -> list[tuple[int, bool]]:
    return [(start + i * CHECK, b) for i, b in enumerate(busy)]


def test_quiet_checks_and_single_blips_leave_the_team_whole(runtime):
    assert _replay(runtime, _every_check([False] * 50), full=2) == [0] * 50
    # Busy checks fewer than IN_A_ROW in a row (a daemon woke) are not enough; IN_A_ROW are.
    blips = ([True] * (IN_A_ROW - 1) + [False]) * 4
    assert _replay(runtime, _every_check(blips), full=2) == [0] * len(blips)
    assert _replay(runtime, _every_check([False] + [True] * IN_A_ROW), full=2) == [0] * IN_A_ROW + [1]


def test_the_cut_stops_at_one_thread_and_follows_a_smaller_count(runtime):
    checks = 4 * IN_A_ROW
    cuts = _replay(runtime, _every_check([True] * checks), full=4)
    assert cuts == [min(3, (i + 1) // IN_A_ROW) for i in range(checks)]  # a thread per IN_A_ROW, one left
    assert _replay(runtime, _every_check([True] * checks), full=1) == [0] * checks  # nothing to take from one


def _narrowed() -> tuple[list[tuple[int, bool]], list[int], int]:
    """(checks, cuts, time of the last): busy checks in a row that cut one thread."""
    return _every_check([True] * IN_A_ROW), [0] * (IN_A_ROW - 1) + [1], (IN_A_ROW - 1) * CHECK


def test_a_narrowed_team_tries_a_thread_again_after_a_hold_that_doubles_while_busy(runtime):
    checks, expected, t = _narrowed()

    def check(at: int, busy: bool, cut: int) -> None:
        checks.append((at, busy))
        expected.append(cut)

    # Quiet checks before the hold has passed keep the cut; the first after it gives a thread back.
    check(t + HOLD - CHECK, False, 1)
    check(t + HOLD, False, 0)  # the try
    check(t + HOLD + CHECK, True, 1)  # busy at once: taken back, the hold doubled
    t = t + HOLD + CHECK
    check(t + 2 * HOLD - CHECK, False, 1)
    check(t + 2 * HOLD, False, 0)  # tried after twice the hold
    check(t + 2 * HOLD + CHECK, True, 1)
    t = t + 2 * HOLD + CHECK
    check(t + 4 * HOLD, False, 0)
    check(t + 4 * HOLD + CHECK, False, 0)  # the try held: the hold back to its first length
    t = t + 4 * HOLD + CHECK
    for i in range(1, IN_A_ROW + 1):
        check(t + i * CHECK, True, int(i == IN_A_ROW))
    t += IN_A_ROW * CHECK
    check(t + HOLD, False, 0)
    assert _replay(runtime, checks, full=2) == expected


def test_the_hold_grows_no_longer_than_its_limit(runtime):
    checks, _, t = _narrowed()
    hold = HOLD
    for _ in range(8):  # every try busy
        t += hold
        checks += [(t, False), (t + CHECK, True)]
        t += CHECK
        hold = min(2 * hold, LONGEST)
    assert hold == LONGEST
    checks += [(t + LONGEST - CHECK, False), (t + LONGEST, False)]
    assert _replay(runtime, checks, full=2)[-2:] == [1, 0]


def _can_read_run_delay() -> bool:
    try:
        with open("/proc/thread-self/schedstat") as f:
            return len(f.read().split()) >= 2
    except OSError:
        return False


def _regions(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x * 2 + 1) * x  # one generated kernel with a parallel region


@pytest.fixture
def two_threads_or_more():
    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))  # (a team that can narrow)
    yield
    torch.set_num_threads(threads)


def test_the_team_narrows_beside_busy_processes_and_kernels_ask_for_it(runtime, two_threads_or_more):
    native_ops.load()
    kiln.reset()
    runtime.kiln_set_adaptive_team(1)
    compiled = kiln.compile(_regions)
    x = torch.randn(256, 1024)
    torch.testing.assert_close(compiled(x), _regions(x))
    asks = runtime.kiln_team_asks()
    compiled(x)
    assert runtime.kiln_team_asks() > asks  # the graph's kernel library found the runtime's team
    if not _can_read_run_delay():  # documented: no run delay to read, OpenMP's count
        assert runtime.kiln_team_threads() == torch.get_num_threads()
        return
    narrowings = runtime.kiln_team_narrowings()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        deadline = time.monotonic() + 10
        while runtime.kiln_team_narrowings() == narrowings and time.monotonic() < deadline:
            compiled(x)
        assert runtime.kiln_team_narrowings() > narrowings, "no narrowing in 10 s beside a busy process per core"
        torch.testing.assert_close(compiled(x), _regions(x))  # the same result on the narrowed team
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def test_the_setting_off_leaves_openmps_count(runtime, monkeypatch):
    monkeypatch.setattr(config.runtime, "adaptive_team", False)
    libkiln.apply_settings()
    assert runtime.kiln_team_cut() == 0
    assert runtime.kiln_team_threads() == torch.get_num_threads()


@torch.library.custom_op("kiln_team_test::threads_seen", mutates_args=())
def _threads_seen(x: torch.Tensor) -> torch.Tensor:
    # An operator kiln can only call through ATen: what OpenMP count (and so ATen's regions) it runs under.
    return torch.full_like(x, float(torch.get_num_threads()))


@_threads_seen.register_fake
def _(x):
    return torch.empty_like(x)


def _calls_aten(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.kiln_team_test.threads_seen(x * 2) + 1


def test_aten_calls_run_at_the_narrowed_team_and_the_count_comes_back(runtime, two_threads_or_more):
    native_ops.load()
    kiln.reset()
    runtime.kiln_set_adaptive_team(1)
    full = torch.get_num_threads()
    compiled = kiln.compile(_calls_aten)
    x = torch.randn(4, 8)
    assert compiled(x).eq(full + 1).all()  # (the team whole: OpenMP's count)
    runtime.kiln_team_force_cut(full - 1)
    assert runtime.kiln_team_threads() == 1
    assert compiled(x).eq(1 + 1).all()  # called through the C++ wrapper under the narrowed count
    assert torch.get_num_threads() == full  # and the caller's count back after the call
    runtime.kiln_set_adaptive_team(0)
    assert compiled(x).eq(full + 1).all()
