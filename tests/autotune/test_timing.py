"""Interleaved timing: candidates run in rotating rounds, so a burst of noise hits all of them
alike; close calls are measured again; ties go to the earlier candidate. Timed with a fake clock
that each candidate advances by its own duration (and a burst of noise by more), so the tests are
exact, plus one with real sleeps."""

import time

import pytest

from kiln.autotune import timing
from kiln.autotune.choose import fastest


class FakeClock:
    """A clock that only candidates move: each call adds its duration, plus `noise(call number)`."""

    def __init__(self, noise=lambda call: 0.0):
        self.now, self.calls, self.noise = 0.0, [], noise

    def __call__(self):
        return self.now

    def candidate(self, name, seconds):
        def run():
            self.now += seconds + self.noise(len(self.calls))
            self.calls.append(name)
        return run


@pytest.fixture
def clock(monkeypatch):
    def install(noise=lambda call: 0.0):
        fake = FakeClock(noise)
        monkeypatch.setattr(timing, "_clock", fake)
        return fake
    return install


def test_rounds_rotate_through_the_candidates(clock):
    fake = clock()
    runs = {n: fake.candidate(n, t) for n, t in (("a", 0.010), ("b", 0.020), ("c", 0.040))}
    seconds, report = timing.interleaved_seconds(runs, budget_s=0.5, min_rounds=3, max_rounds=4)
    assert fake.calls[:3] == ["a", "b", "c"]  # the warm-ups, in order
    assert fake.calls[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert seconds == pytest.approx({"a": 0.010, "b": 0.020, "c": 0.040}) and report.rounds == 4 and not report.remeasured


def test_the_budget_stops_the_rounds(clock):
    fake = clock()
    runs = {n: fake.candidate(n, 0.125) for n in "ab"}
    _, report = timing.interleaved_seconds(runs, budget_s=1.0, min_rounds=2, max_rounds=50)
    assert report.rounds == 4  # 4 rounds of 2 x 0.125 s spend the 1 s budget


def test_a_burst_of_noise_does_not_pick_the_slower_candidate(clock):
    # The burst covers calls 3-19: the first third of a 15-round measurement. Timed one after the
    # other, all of "fast"'s runs would fall in it and "slow" would win; interleaved, the burst
    # lands on every candidate's first rounds alike and the medians see past it.
    fake = clock(noise=lambda call: 5.0 if 3 <= call < 20 else 0.0)
    runs = {"fast": fake.candidate("fast", 1.0), "slow": fake.candidate("slow", 1.1), "slower": fake.candidate("slower", 1.2)}
    seconds, report = timing.interleaved_seconds(runs, budget_s=1e9, max_rounds=15)
    assert report.rounds == 15
    assert seconds == pytest.approx({"fast": 1.0, "slow": 1.1, "slower": 1.2})
    assert fastest(seconds) == "fast"


def test_a_close_call_is_measured_again_by_the_two_alone(clock):
    fake = clock()
    runs = {"a": fake.candidate("a", 1.0), "b": fake.candidate("b", 2.0), "c": fake.candidate("c", 0.98)}
    seconds, report = timing.interleaved_seconds(runs, budget_s=10.0, min_rounds=3, max_rounds=15)
    assert report.remeasured == ["a", "c"] and report.extra_rounds >= 3
    after = fake.calls[3 + 3 * report.rounds:]
    assert set(after) == {"a", "c"} and len(after) == 2 * report.extra_rounds
    assert seconds == pytest.approx({"a": 1.0, "b": 2.0, "c": 0.98})
    assert fastest(seconds) == "a"  # within 3%: the earlier candidate keeps it


def test_a_clear_winner_is_not_measured_again(clock):
    fake = clock()
    runs = {"a": fake.candidate("a", 1.0), "b": fake.candidate("b", 0.5)}
    seconds, report = timing.interleaved_seconds(runs, budget_s=10.0)
    assert not report.remeasured and report.extra_rounds == 0 and fastest(seconds) == "b"


def test_a_tie_goes_to_the_first_candidate(clock):
    fake = clock()
    runs = {"first": fake.candidate("first", 1.0), "second": fake.candidate("second", 1.0)}
    seconds, _ = timing.interleaved_seconds(runs, budget_s=10.0)
    assert fastest(seconds) == "first"
    assert fastest(dict(reversed(seconds.items()))) == "second"


def test_a_candidate_that_raises_is_out(clock):
    fake = clock()

    def unsupported():
        raise RuntimeError("this library has no such dtype")

    seconds, _ = timing.interleaved_seconds({"a": unsupported, "b": fake.candidate("b", 1.0)}, budget_s=10.0)
    assert seconds == {"a": float("inf"), "b": 1.0}


def test_the_clearly_faster_sleeper_wins():
    def sleeper(seconds):
        return lambda: time.sleep(seconds)

    runs = {"slow": sleeper(0.004), "fast": sleeper(0.001), "slower": sleeper(0.006)}
    seconds, _ = timing.interleaved_seconds(runs, budget_s=0.05)
    assert fastest(seconds) == "fast"
    assert seconds["fast"] < seconds["slow"] < seconds["slower"]


def test_a_timer_of_the_gpus_time_decides_not_the_hosts(clock):
    # Many cheap launches (slow on the host) against one launch of a slower kernel: the GPU's
    # times decide, as kiln's choice between a product template and cuBLAS must on a GPU.
    fake = clock()
    gpu_time = {}

    def candidate(name, host_s, gpu_s):
        run = fake.candidate(name, host_s)
        gpu_time[run] = gpu_s
        return run

    runs = {"template": candidate("template", 1e-3, 5e-5), "library+epilogue": candidate("library+epilogue", 3e-3, 4e-5)}
    assert fastest(timing.interleaved_seconds(runs, budget_s=0.01)[0]) == "template"  # the host's clock
    seconds, _ = timing.interleaved_seconds(runs, budget_s=0.01, timer=lambda run: (run(), gpu_time[run])[1])
    assert seconds == {"template": 5e-5, "library+epilogue": 4e-5} and fastest(seconds) == "library+epilogue"


def test_gpu_seconds_queues_every_launch_before_its_start_event(monkeypatch):
    # A stand-in torch.cuda that logs the order of what reaches the stream: the spin kernel comes
    # before the start event, and it lasts longer than the host took to launch the run.
    import torch

    stream = []

    class Event:
        def __init__(self, enable_timing):
            assert enable_timing

        def record(self):
            self.at = len(stream)
            stream.append("record")

        def synchronize(self):
            stream.append("wait")

        def elapsed_time(self, end):
            return 0.25  # ms

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: stream.append("synchronize"))
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: stream.append(("sleep", cycles)))

    def run():
        time.sleep(0.002)  # the host's launches
        stream.append("kernels")

    assert timing.gpu_seconds(run) == 0.25e-3
    assert stream[:2] == ["kernels", "synchronize"]  # first: the launch time measured, alone
    sleep, start, kernels, end, wait = stream[2:]
    assert (start, kernels, end, wait) == ("record", "kernels", "record", "wait")
    assert sleep[0] == "sleep" and sleep[1] >= 2 * 0.002 * timing._GPU_CYCLES_PER_S  # held past the launches
