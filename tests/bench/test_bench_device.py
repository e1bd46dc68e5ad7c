"""`kiln bench --device`: checked and recorded on this CPU-only machine; CUDA itself is stood in for
(availability, device name, synchronize), never used."""

import json

import pytest
import torch
import torch._inductor.config as inductor_config

import kiln
import kiln.api
import benchmarks.runner
from benchmarks import worker
from benchmarks.modes import MODES
from benchmarks.report import markdown_report
from benchmarks.results import Case, Result
from kiln.cli import main

GPU = "NVIDIA Stand-in 80GB"


@pytest.fixture
def ran(monkeypatch):
    """The cases `kiln bench` would run, each recorded as not available instead of running."""
    cases = []

    def record(todo, *args, **kwargs):
        cases.extend(todo)
        return [Result(c, "n/a", error="not run by this test") for c in todo]

    monkeypatch.setattr(benchmarks.runner, "run_cases", record)
    return cases


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *device: GPU)


def _bench(tmp_path, *argv) -> dict:
    out = tmp_path / "run.json"
    assert main(["bench", "--models", "mlp", "--modes", "eager", "--json", str(out), *argv]) == 0
    return json.loads(out.read_text())


def _error(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exit:
        main(["bench", "--models", "mlp", *argv])
    assert exit.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv", [[], ["--device", "cpu"]])
def test_cpu_is_the_default_and_is_recorded(tmp_path, ran, argv):
    data = _bench(tmp_path, *argv)
    assert [c.device for c in ran] == ["cpu"]
    assert data["results"][0]["device"] == "cpu" and data["meta"]["device"] == "cpu"
    assert "gpu" not in data["meta"]


def test_cuda_cases_and_the_gpu_reach_the_json_and_markdown(tmp_path, ran, fake_gpu):
    data = _bench(tmp_path, "--device", "cuda", "--threads", "1,2", "--markdown", str(tmp_path / "run.md"))
    assert [(c.threads, c.device) for c in ran] == [(1, "cuda"), (2, "cuda")]  # threads handled as on cpu
    assert [r["device"] for r in data["results"]] == ["cuda", "cuda"]
    assert data["meta"]["device"] == "cuda" and data["meta"]["gpu"] == GPU
    md = (tmp_path / "run.md").read_text()
    assert " · device cuda · " in md and f" · {GPU} · " in md
    assert Result.from_json(data["results"][0]).case == ran[0]


def test_cuda_without_a_gpu_is_refused_before_anything_runs(capsys, monkeypatch, ran):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # so the test holds on a GPU machine too
    assert "--device cuda: no CUDA device is available" in _error(capsys, "--device", "cuda")
    assert ran == []


def test_other_devices_are_refused(capsys, ran):
    err = _error(capsys, "--device", "tpu")
    assert "invalid choice: 'tpu'" in err and "'cuda'" in err
    assert ran == []


def test_profile_is_refused_on_cuda(capsys, ran, fake_gpu):
    assert "--profile measures kernels on the CPU only" in _error(capsys, "--device", "cuda", "--profile")
    assert ran == []


def test_runs_saved_before_the_device_field_read_as_cpu():
    data = Result(Case("mlp", "eager", 1), "ok").to_json()
    del data["device"]
    assert Result.from_json(data).case.device == "cpu"
    assert Case("mlp", "kiln", 1, device="cuda").label == "mlp · kiln · 1 thread · cuda"
    assert Case("mlp", "kiln", 1).label == "mlp · kiln · 1 thread"


def test_the_header_names_the_device_where_the_run_recorded_one():
    meta = dict(task="inference", suite="unit", threads=[1], iters=5, warmup=1, cache="cold", torch="2.x",
                cpu="cpu", cores=2, date="today")
    assert " device " not in markdown_report([], meta)  # a run saved before the field
    assert "suite unit · device cpu · threads 1" in markdown_report([], {**meta, "device": "cpu"})
    assert markdown_report([], {**meta, "device": "cuda", "gpu": GPU}).splitlines()[2].endswith(
        f"cpu (2 cores) · {GPU} · today")


# ---- the reduce-overhead modes ----

def test_reduce_overhead_modes_are_listed(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    help_text = capsys.readouterr().out
    for name in ("inductor-reduce-overhead", "kiln-reduce-overhead"):
        assert name in MODES and f"  {name} " in help_text and "reduce-overhead" in MODES[name].help


def test_inductor_reduce_overhead_hands_torch_compile_its_mode(monkeypatch):
    seen = {}

    def fake_compile(model, **kwargs):
        seen.update(kwargs, freezing=inductor_config.freezing)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    with inductor_config.patch(freezing=False):
        MODES["inductor-reduce-overhead"].compile(torch.nn.Linear(2, 2))
    assert seen == {"backend": "inductor", "mode": "reduce-overhead", "freezing": False}
    assert MODES["inductor-reduce-overhead"].unavailable_reason(True) is None


def test_kiln_reduce_overhead_hands_kiln_compile_its_mode(monkeypatch):
    seen = []
    monkeypatch.setattr(kiln, "compile", lambda model, **kwargs: seen.append(kwargs) or model)
    MODES["kiln-reduce-overhead"].compile(torch.nn.Linear(2, 2))
    MODES["kiln"].compile(torch.nn.Linear(2, 2))
    assert seen == [{"backend": "kiln", "mode": "reduce-overhead"}, {"backend": "kiln"}]  # plain kiln: no mode


def test_kiln_reduce_overhead_is_available_once_kiln_compile_accepts_it(monkeypatch):
    reason = MODES["kiln-reduce-overhead"].unavailable_reason
    monkeypatch.setattr(kiln.api, "MODES", (None, "default", "reduce-overhead"))
    assert reason(False) is None
    monkeypatch.setattr(kiln.api, "MODES", (None, "default"))
    assert reason(False) == "kiln.compile does not accept mode='reduce-overhead' yet"


# ---- the worker on cuda: synchronized timing, autocast on the case's device ----

class FakeEvent:
    """torch.cuda.Event on a CPU: records what the worker does with it; 2 ms between any two."""

    def __init__(self, log, enable_timing=False):
        assert enable_timing
        self.log = log

    def record(self, stream=None):
        assert stream is None  # the current stream, where the timed call's kernels (and graph replays) go
        self.log.append("record")

    def synchronize(self):
        self.log.append("wait")

    def elapsed_time(self, end):
        return 2.0


def test_cuda_calls_are_timed_by_events_around_each_call(monkeypatch):
    events = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *device: events.append("sync"))
    monkeypatch.setattr(torch.cuda, "Event", lambda **kwargs: FakeEvent(events, **kwargs))
    medians = worker._time_interleaved([lambda: events.append("eager"), lambda: events.append("compiled")],
                                       Case("mlp", "eager", 1, iters=2, warmup=1, device="cuda"))
    assert medians == [2.0, 2.0]  # the events' milliseconds, not the CPU's clock
    timed = events[2:]  # after the warm-up pair
    assert events[:2] == ["eager", "compiled"]
    one = lambda call: ["sync", "record", call, "record", "wait"]  # noqa: E731  (start, call, end, wait for end)
    assert timed == one("eager") + one("compiled") + one("compiled") + one("eager")


def test_cpu_timing_never_synchronizes(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *device: pytest.fail("synchronized on cpu"))
    monkeypatch.setattr(torch.cuda, "Event", lambda **kwargs: pytest.fail("a CUDA event on cpu"))
    worker._time_interleaved([lambda: None, lambda: None], Case("mlp", "eager", 1, iters=2, warmup=1))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_autocast_runs_on_the_cases_device(monkeypatch, device):
    seen = []

    class FakeAutocast:
        def __init__(self, device_type, dtype):
            seen.append((device_type, dtype))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch, "autocast", FakeAutocast)
    case = Case("mlp", "eager", 1, autocast="bfloat16", device=device)
    step = worker._make_step(case, None, lambda **inputs: inputs["x"] + 1, {"x": torch.zeros(2)})
    assert step()[0].tolist() == [1.0, 1.0]
    assert seen == [(device, torch.bfloat16)]
    # The float64 reference runs on the CPU whatever the case's device.
    worker._make_step(case, None, lambda **inputs: inputs["x"], {"x": torch.zeros(2)}, device="cpu")()
    assert seen[-1] == ("cpu", torch.bfloat16)


def test_all_modes_has_the_cuda_graph_modes_on_a_gpu_only(ran, fake_gpu):
    for device in ("cpu", "cuda"):
        ran.clear()
        assert main(["bench", "--models", "mlp", "--modes", "all", "--device", device]) == 0
        graphed = {c.mode for c in ran if c.mode.endswith("-reduce-overhead")}
        assert graphed == (set() if device == "cpu" else {"kiln-reduce-overhead", "inductor-reduce-overhead"})
