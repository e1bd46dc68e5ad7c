"""`kiln bench --dtype`, `--batch` and mixed-precision training (`--train --autocast`): what the
worker runs, and each case's error against a float32 eager run."""

import json
import subprocess
import sys

import pytest
import torch

from benchmarks import modes, worker
from benchmarks.accuracy import relative_error
from benchmarks.results import Case, Result


@pytest.fixture(autouse=True)
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _spy_mode(monkeypatch, name, seen, offset=0.0):
    """A mode that runs the model as it is (plus `offset`), noting what each call got."""

    def compile(model):
        def run(**inputs):
            weight = next(model.parameters())
            seen.append({"x": (tuple(inputs["x"].shape), inputs["x"].dtype), "weights": weight.dtype,
                         "autocast": torch.is_autocast_enabled("cpu"), "grad": torch.is_grad_enabled()})
            return model(**inputs) + offset
        return run

    monkeypatch.setitem(modes.MODES, name, modes.Mode(name, "spy", compile, lambda train: None, lambda: {}))


def test_relative_error_is_the_worst_outputs_largest_difference_over_its_largest_value():
    ref = [torch.tensor([1.0, -4.0]), torch.tensor([10.0, 0.0]), torch.tensor([3, 4])]
    out = [torch.tensor([1.5, -4.0], dtype=torch.bfloat16), torch.tensor([10.0, 1.0]), torch.tensor([0, 0])]
    assert relative_error(out, ref) == pytest.approx(max(0.5 / 4, 1.0 / 10))  # integer outputs left out
    assert relative_error(ref, ref) == 0.0
    assert relative_error([torch.tensor([float("nan"), 1.0])], [torch.tensor([2.0, 1.0])]) == float("inf")
    assert relative_error([torch.ones(2)], [torch.zeros(2)]) == 0.0  # a gradient no loss reached: no scale
    assert relative_error([torch.ones(2)], [torch.ones(3)]) is None and relative_error([], ref) is None


def test_a_training_steps_gradients_count_as_one_output():
    loss, grads = torch.tensor(2.0), [torch.tensor([4.0, -8.0]), torch.tensor([1e-9, 0.0])]  # a key bias's: ~0
    amp = [torch.tensor(2.01), torch.tensor([4.0, -8.04]), torch.tensor([1e-5, 0.0])]
    assert relative_error(amp, [loss, *grads]) == pytest.approx((1e-5 - 1e-9) / 1e-9, rel=1e-3)  # alone: noise / noise
    assert relative_error(amp, [loss, *grads], pooled_from=1) == pytest.approx(max(0.01 / 2, 0.04 / 8))


def test_batch_repeats_the_inputs_along_dim_0_and_dtype_casts_only_floating_ones():
    inputs = {"ids": torch.tensor([[1, 2, 3]]), "mask": torch.ones(1, 3, dtype=torch.int64), "x": torch.randn(1, 2, 4)}
    out = worker.batched(inputs, 3)
    assert out["ids"].tolist() == [[1, 2, 3]] * 3 and out["x"].shape == (3, 2, 4) and torch.equal(out["x"][2], inputs["x"][0])
    assert worker.batched(inputs, 1) is inputs
    cast = worker._cast_floats(inputs, "bfloat16")
    assert cast["x"].dtype == torch.bfloat16 and cast["mask"].dtype == torch.int64 and cast["ids"] is inputs["ids"]


def test_a_bfloat16_batch_2_case_casts_model_and_inputs_and_states_its_error_against_float32(monkeypatch):
    seen = []
    _spy_mode(monkeypatch, "spy", seen)
    _spy_mode(monkeypatch, "peer", seen, offset=0.25)  # a peer further from float32
    r = worker.run_case(Case("mlp", "spy", 1, iters=2, warmup=0, dtype="bfloat16", batch=2, against="peer"))
    assert r.status == "ok" and r.accuracy == "pass", r.error
    # The unit model's inputs are [8, 64]: batch 2 repeats them to [16, 64].
    assert seen[0] == {"x": ((16, 64), torch.bfloat16), "weights": torch.bfloat16, "autocast": False, "grad": False}
    assert 0 < r.eager_fp32_rel_err < 0.02 and 0 < r.fp32_rel_err < 0.02  # bfloat16's rounding, no more
    assert r.fp32_rel_err == pytest.approx(r.eager_fp32_rel_err)  # the spy runs eager's very model
    assert r.peer_accuracy == "fail" and r.peer_fp32_rel_err > 5 * r.fp32_rel_err
    assert r.timing_wait_s is None  # no GPU lock on the CPU
    back = Result.from_json(json.loads(json.dumps(r.to_json())))
    assert back.case == r.case and back.peer_fp32_rel_err == r.peer_fp32_rel_err


def test_a_float32_case_has_no_float32_figure():
    r = worker.run_case(Case("mlp", "eager", 1, iters=1, warmup=0, batch=3))
    assert r.status == "ok" and r.fp32_rel_err is None and r.eager_fp32_rel_err is None


def test_mixed_precision_training_autocasts_the_forward_of_float32_weights(monkeypatch):
    seen = []
    _spy_mode(monkeypatch, "spy", seen)
    r = worker.run_case(Case("mlp", "spy", 1, train=True, iters=2, warmup=0, autocast="bfloat16", batch=2))
    assert r.status == "ok" and r.accuracy == "pass", r.error
    assert all(s == {"x": ((16, 64), torch.float32), "weights": torch.float32, "autocast": True, "grad": True}
               for s in seen)
    # The loss and every gradient (float32) against a float32 step without autocast.
    assert 0 < r.fp32_rel_err < 0.05 and r.fp32_rel_err == pytest.approx(r.eager_fp32_rel_err)


def test_the_float32_figure_and_float64_arbiter_judge_a_wrong_bfloat16_run(monkeypatch):
    _spy_mode(monkeypatch, "wrong", [], offset=0.5)
    r = worker.run_case(Case("mlp", "wrong", 1, iters=1, warmup=0, dtype="bfloat16"))
    assert r.accuracy == "fail" and r.accuracy_rule == "fp64" and r.fp32_rel_err > 10 * r.eager_fp32_rel_err


def test_bench_runs_bfloat16_batch_2_cases_two_at_a_time_end_to_end(tmp_path):
    """eager and kiln on the CPU, in two subprocesses at once: both results and the new fields come back."""
    cmd = [sys.executable, "-m", "kiln.cli", "bench", "--models", "mlp", "--modes", "eager,kiln", "--dtype", "bf16",
           "--batch", "2", "--jobs", "2", "--iters", "3", "--warmup", "1", "--timeout", "600",
           "--json", str(tmp_path / "run.json"), "--markdown", str(tmp_path / "run.md"), "--case-logs", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "run.json").read_text())
    assert "finished" not in data["meta"]  # the complete run, not a partial save
    assert (data["meta"]["dtype"], data["meta"]["batch"], data["meta"]["jobs"]) == ("bfloat16", 2, 2)
    by_mode = {r["mode"]: r for r in data["results"]}
    assert list(by_mode) == ["eager", "kiln"]
    for r in by_mode.values():
        assert r["status"] == "ok" and r["accuracy"] == "pass", r["error"]
        assert (r["dtype"], r["batch"]) == ("bfloat16", 2) and 0 < r["fp32_rel_err"] < 0.02
    assert by_mode["kiln"]["fallbacks"] == 0
    md = (tmp_path / "run.md").read_text()
    assert " · bfloat16 weights · batch 2 · " in md and "2 cases at once (compile times inflated" in md
    assert "| err vs fp32 |" in md
    assert "mlp · kiln · 1 thread · bfloat16 · batch 2:" in proc.stderr
    assert (tmp_path / "mlp-eager-1t.log").exists() and (tmp_path / "mlp-kiln-1t.log").exists()
