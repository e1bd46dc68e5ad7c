"""Runs one benchmark case inside its own process: `python -m kiln.bench.worker CASE_JSON RESULT_PATH`.

Builds the model twice from the same seed (an eager copy and one to compile), checks the compiled
result against eager with the tolerance rule of `accuracy.py`, then times eager and compiled calls
interleaved in this same process, so both see the same machine state.

On `--device cuda` both copies and the inputs live on the GPU, every timed call is bracketed by
`torch.cuda.synchronize()` (a CUDA call returns before its kernels finish), and outputs are compared
on the CPU, where the float64 reference runs.
"""

from __future__ import annotations

import contextlib
import copy
import json
import resource
import statistics
import sys
import time
import traceback
from typing import Any, Callable

import torch
from torch import nn

from kiln.bench.accuracy import Verdict, compare, flatten_tensors
from kiln.bench.models import MODELS
from kiln.bench.modes import MODES, Mode
from kiln.bench.results import Case, Result


class PhaseError(Exception):
    def __init__(self, phase: str, error: BaseException) -> None:
        super().__init__(str(error))
        self.phase, self.error = phase, error


def _phase(name: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - every failure is recorded, the suite goes on
        raise PhaseError(name, e) from e


def _loss(output: Any) -> torch.Tensor:
    floats = [t for t in flatten_tensors(output) if t.is_floating_point() and t.requires_grad]
    return sum(t.float().mean() for t in floats)


class InferenceStep:
    """One forward call without autograd, under `device`'s autocast to `autocast` (a dtype name) if given."""

    def __init__(self, model: Callable, inputs: dict[str, torch.Tensor], autocast: str | None = None,
                 device: str = "cpu") -> None:
        self.model, self.inputs, self.device = model, inputs, device
        self.autocast = getattr(torch, autocast) if autocast else None

    def __call__(self) -> list[torch.Tensor]:
        cast = torch.autocast(self.device, dtype=self.autocast) if self.autocast is not None else contextlib.nullcontext()
        with torch.no_grad(), cast:
            return flatten_tensors(self.model(**self.inputs))


class TrainStep:
    """Forward, loss, backward and an SGD step; returns the loss and every parameter's gradient."""

    def __init__(self, model: Callable, params: nn.Module, inputs: dict[str, torch.Tensor]) -> None:
        self.model, self.params, self.inputs = model, params, inputs
        self.optimizer = torch.optim.SGD(params.parameters(), lr=1e-4)

    def gradients(self) -> list[torch.Tensor]:
        """Loss and gradients of one step, without updating the weights (for the accuracy check)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = _loss(self.model(**self.inputs))
        loss.backward()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params.parameters()]
        return [loss.detach()] + grads

    def __call__(self) -> None:
        self.gradients()
        self.optimizer.step()


def _double(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}


def _on(device: str, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in inputs.items()}


def _cpu(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    # Copied out at once: a CUDA-graph replay (mode reduce-overhead) overwrites its last outputs.
    return [t.detach().cpu() for t in tensors]


def _synchronizer(device: str) -> Callable[[], None]:
    """What waits for the device's queued kernels: a CUDA call returns before they finish."""
    return torch.cuda.synchronize if device == "cuda" else lambda: None


def _make_step(case: Case, model: nn.Module, runner: Callable, inputs: dict[str, torch.Tensor], device: str | None = None):
    # Under autocast the float64 reference stays float64: autocast casts float32 only.
    if case.train:
        return TrainStep(runner, model, inputs)
    return InferenceStep(runner, inputs, case.autocast, device or case.device)


def _first_outputs(case: Case, step) -> list[torch.Tensor]:
    return step.gradients() if case.train else step()


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def _time_interleaved(calls: list[Callable], case: Case) -> list[float]:
    """Median ms of each call, timed in rounds: every round calls each once, its order rotated so
    that none always runs first, or always on caches another one warmed."""
    sync = _synchronizer(case.device)
    for _ in range(case.warmup):
        for fn in calls:
            fn()
    samples: list[list[float]] = [[] for _ in calls]
    for i in range(case.iters):
        shift = i % len(calls)
        for k in list(range(shift, len(calls))) + list(range(shift)):
            sync()  # no kernel of the previous call may finish inside this one's time
            start = time.perf_counter()
            calls[k]()
            sync()
            samples[k].append(time.perf_counter() - start)
    return [_median_ms(s) for s in samples]


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def run_case(case: Case) -> Result:
    """Measure one case in this process. Failures become a Result with status "error", never a raise."""
    result = Result(case=case, status="ok")
    start = time.perf_counter()
    torch.set_num_threads(case.threads)
    try:
        _measure(case, result)
    except PhaseError as e:
        result.status, result.phase = "error", e.phase
        result.error = _first_line(e.error)
        traceback.print_exception(e.error, file=sys.stderr)
    result.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result.wall_s = time.perf_counter() - start
    return result


def _measure(case: Case, result: Result) -> None:
    spec, mode = MODELS[case.model], MODES[case.mode]
    eager_model = _phase("build", lambda: spec.build(case.train).to(case.device))
    compiled_model = copy.deepcopy(eager_model)
    cpu_inputs = _phase("build", spec.make_inputs)
    inputs = _phase("build", lambda: _on(case.device, cpu_inputs))
    torch.manual_seed(0)

    eager = _make_step(case, eager_model, eager_model, inputs)
    reference = _phase("reference", lambda: _cpu(_first_outputs(case, eager)))

    def fp64_reference() -> list[torch.Tensor]:
        # On the CPU whatever the device: one float64 truth for every run, and no third copy in GPU memory.
        model64 = copy.deepcopy(eager_model).cpu().double()
        return _first_outputs(case, _make_step(case, model64, model64, _double(cpu_inputs), device="cpu"))

    compiled, outputs, result.compile_s = _phase("compile", lambda: _compile_and_run(case, mode, compiled_model, inputs))

    verdict: Verdict = _phase("accuracy", lambda: compare(outputs, reference, fp64_reference))
    result.accuracy = "pass" if verdict.passed else "fail"
    result.accuracy_rule, result.accuracy_detail = verdict.rule, verdict.detail or None
    result.max_abs_err = verdict.max_abs_err

    stats = mode.stats()  # before a peer compiles: Dynamo's counters would count its graphs too
    result.graphs, result.graph_breaks = stats.get("graphs"), stats.get("graph_breaks")
    result.fallbacks = stats.get("fallbacks")
    calls = [eager, compiled]
    if case.against:
        try:
            calls.append(_compile_peer(case, eager_model, inputs, reference, fp64_reference, result))
        except Exception as e:  # noqa: BLE001 - the peer's failure is recorded; the case's own mode is still timed
            result.peer_error = _first_line(e)
            traceback.print_exception(e, file=sys.stderr)
    times = _phase("timing", lambda: _time_interleaved(calls, case))
    result.eager_ms, result.compiled_ms = times[:2]
    result.peer_ms = times[2] if len(times) > 2 else None
    result.speedup = result.eager_ms / result.compiled_ms
    if case.profile:
        from kiln.bench.profile import profile_step

        result.kernel_profile = _phase("profile", lambda: profile_step(compiled, case.iters, case.warmup))


def _compile_and_run(case: Case, mode: Mode, model: nn.Module, inputs: dict[str, torch.Tensor]):
    """The step of `model` compiled by `mode`, its first call's outputs (on the CPU), and the
    seconds compiling and that call took: a first-ever compile when the caches are cold."""
    sync = _synchronizer(case.device)
    sync()
    t0 = time.perf_counter()
    step = _make_step(case, model, mode.compile(model), inputs)
    outputs = _first_outputs(case, step)
    sync()
    seconds = time.perf_counter() - t0
    return step, _cpu(outputs), seconds


def _compile_peer(case: Case, eager_model: nn.Module, inputs: dict[str, torch.Tensor], reference: list[torch.Tensor],
                  fp64_reference: Callable[[], list[torch.Tensor]], result: Result) -> Callable:
    """A third copy of the model compiled by the peer mode `case.against`, checked under the same
    accuracy rule; its calls are then timed in the same rounds as eager's and the case's own, so
    the two compiled calls see one process's machine (a cloud VM's speed drifts between processes
    by 10-30 %, more than the margins being measured)."""
    step, outputs, result.peer_compile_s = _compile_and_run(case, MODES[case.against], copy.deepcopy(eager_model), inputs)
    result.peer_accuracy = "pass" if compare(outputs, reference, fp64_reference).passed else "fail"
    return step


def main(argv: list[str]) -> int:
    case = Case(**json.loads(argv[0]))
    result = run_case(case)
    with open(argv[1], "w") as f:
        json.dump(result.to_json(), f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
