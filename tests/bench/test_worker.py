"""One case measured in-process: what the subprocess of kiln bench does, without the subprocess."""

import pytest
import torch

from benchmarks import models, modes, worker
from benchmarks.results import Case


@pytest.fixture(autouse=True)
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _mode(name, compile):
    return modes.Mode(name, "test mode", compile, lambda train: None, lambda: {"graphs": 7})


@pytest.mark.parametrize("train", [False, True])
def test_eager_case_is_measured(train):
    r = worker.run_case(Case("mlp", "eager", 1, train=train, iters=3, warmup=1))
    assert r.status == "ok" and r.accuracy == "pass" and r.accuracy_rule == "fp32"
    assert r.eager_ms > 0 and r.compiled_ms > 0 and r.speedup == pytest.approx(r.eager_ms / r.compiled_ms)
    assert r.compile_s >= 0 and r.peak_rss_mb > 10 and r.wall_s > 0


def test_an_autocast_case_runs_under_autocast_against_a_float64_reference(monkeypatch):
    seen = []

    def spy(model):
        def run(**inputs):
            seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
            return model(**inputs)
        return run

    monkeypatch.setitem(modes.MODES, "spy", _mode("spy", spy))
    r = worker.run_case(Case("mlp", "spy", 1, iters=2, warmup=0, autocast="bfloat16"))
    assert r.status == "ok" and r.accuracy == "pass"
    assert seen and all(s == (True, torch.bfloat16) for s in seen)


def test_wrong_results_fail_accuracy(monkeypatch):
    def off_by_one(model):
        return lambda **inputs: model(**inputs) + 1

    monkeypatch.setitem(modes.MODES, "wrong", _mode("wrong", off_by_one))
    r = worker.run_case(Case("mlp", "wrong", 1, iters=2, warmup=0))
    assert r.status == "ok" and r.accuracy == "fail" and r.accuracy_rule == "fp64"
    assert r.graphs == 7 and r.speedup is not None  # still timed, so the report can show "(wrong)"


def test_wrong_gradients_fail_accuracy_in_training(monkeypatch):
    def doubled_gradients(model):
        return lambda **inputs: model(**inputs) * 2 - model(**inputs).detach()  # same value, 2x grad

    monkeypatch.setitem(modes.MODES, "wrong", _mode("wrong", doubled_gradients))
    r = worker.run_case(Case("mlp", "wrong", 1, train=True, iters=2, warmup=0))
    assert r.accuracy == "fail"


@pytest.mark.parametrize("phase", ["build", "compile"])
def test_errors_are_recorded_with_their_phase(monkeypatch, phase):
    def boom(*args):
        raise RuntimeError(f"{phase} went wrong\nsecond line")

    if phase == "build":
        spec = models.MODELS["mlp"]
        monkeypatch.setitem(models.MODELS, "mlp", models.ModelSpec("mlp", ("unit",), "", boom, spec.make_inputs))
        case = Case("mlp", "eager", 1)
    else:
        monkeypatch.setitem(modes.MODES, "boom", _mode("boom", boom))
        case = Case("mlp", "boom", 1)
    r = worker.run_case(case)
    assert r.status == "error" and r.phase == phase
    assert r.error == f"RuntimeError: {phase} went wrong"


def test_a_peer_is_compiled_in_the_same_process_and_timed_in_the_same_rounds(monkeypatch):
    order = []

    def tagged(tag, offset=0):
        def compile(model):
            def run(**inputs):
                order.append(tag)
                return model(**inputs) + offset
            return run
        return compile

    monkeypatch.setitem(modes.MODES, "ours", _mode("ours", tagged("ours")))
    monkeypatch.setitem(modes.MODES, "peer", _mode("peer", tagged("peer", offset=1)))  # a wrong peer
    r = worker.run_case(Case("mlp", "ours", 1, iters=3, warmup=0, against="peer"))
    assert r.status == "ok" and r.accuracy == "pass" and r.peer_accuracy == "fail"
    assert r.peer_ms > 0 and r.peer_compile_s >= 0 and r.versus_peer == pytest.approx(r.compiled_ms / r.peer_ms)
    assert r.graphs == 7  # the case's own mode's counts, read before the peer compiled
    # After each one's first (accuracy) call, three rounds of eager, ours and the peer, rotated.
    assert order[2:] == ["ours", "peer", "ours", "peer", "peer", "ours"]


def test_rounds_rotate_which_call_goes_first():
    events = []
    calls = [lambda tag=tag: events.append(tag) for tag in "abc"]
    medians = worker._time_interleaved(calls, Case("mlp", "eager", 1, iters=3, warmup=1))
    assert len(medians) == 3 and all(m >= 0 for m in medians)
    assert events == list("abc") + list("abc") + list("bca") + list("cab")


def test_a_peer_that_fails_to_compile_is_recorded_and_the_case_still_timed(monkeypatch):
    def broken(model):
        raise RuntimeError("the peer broke\nmore")

    monkeypatch.setitem(modes.MODES, "peer", _mode("peer", broken))
    r = worker.run_case(Case("mlp", "eager", 1, iters=2, warmup=0, against="peer"))
    assert r.status == "ok" and r.compiled_ms > 0 and r.speedup is not None
    assert r.peer_error == "RuntimeError: the peer broke" and r.peer_ms is None and r.versus_peer is None
