"""Runs one benchmark case inside its own process: `python -m benchmarks.worker CASE_JSON RESULT_PATH`.

Builds the model twice from the same seed (an eager copy and one to compile), checks the compiled
result against eager with the tolerance rule of `accuracy.py`, then times eager and compiled calls
interleaved in this same process, so both see the same machine state: glibc's malloc thresholds
included, which the case sets before anything runs where `runtime.keep_freed_mb` asks
(`Result.malloc` says what was done).

On `--device cuda` both copies and the inputs live on the GPU, every timed call is timed by CUDA
events recorded around it on the current stream (a CUDA call returns before its kernels finish),
the timing phase holds the run's GPU lock (`timing_lock.py`: cases run side by side with `--jobs`
take turns), and outputs are compared on the CPU, where the float64 reference runs.

A case that lowers precision (`Case.dtype`, `Case.autocast`) is also stated against a float32
eager run of the same weights before the cast, on the CPU: `accuracy.relative_error`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import os
import resource
import statistics
import sys
import time
import traceback
from typing import Any, Callable

import torch
from torch import nn

from kiln import compile_time, heap
from benchmarks import timing_lock
from benchmarks.accuracy import Verdict, compare, flatten_tensors, relative_error
from benchmarks.models import MODELS
from benchmarks.modes import MODES, Mode
from benchmarks.results import Case, Result
from benchmarks.rounds import rotated


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


def _autocast(device: str, dtype: str | None) -> contextlib.AbstractContextManager:
    """`device`'s autocast to `dtype` (a dtype name), or nothing when None."""
    return torch.autocast(device, dtype=getattr(torch, dtype)) if dtype else contextlib.nullcontext()


class InferenceStep:
    """One forward call without autograd, under `device`'s autocast to `autocast` (a dtype name) if given."""

    def __init__(self, model: Callable, inputs: dict[str, torch.Tensor], autocast: str | None = None,
                 device: str = "cpu") -> None:
        self.model, self.inputs, self.device, self.autocast = model, inputs, device, autocast

    def __call__(self) -> list[torch.Tensor]:
        with torch.no_grad(), _autocast(self.device, self.autocast):
            return flatten_tensors(self.model(**self.inputs))


class TrainStep:
    """Forward, loss, backward and an SGD step; returns the loss and every parameter's gradient.

    With `autocast` (a dtype name) the forward and the loss run under `device`'s autocast and the
    backward outside it, as automatic mixed precision trains: float32 weights and gradients."""

    def __init__(self, model: Callable, params: nn.Module, inputs: dict[str, torch.Tensor],
                 autocast: str | None = None, device: str = "cpu") -> None:
        self.model, self.params, self.inputs = model, params, inputs
        self.autocast, self.device = autocast, device
        self.optimizer = torch.optim.SGD(params.parameters(), lr=1e-4)

    def gradients(self) -> list[torch.Tensor]:
        """Loss and gradients of one step, without updating the weights (for the accuracy check)."""
        self.optimizer.zero_grad(set_to_none=True)
        with _autocast(self.device, self.autocast):
            loss = _loss(self.model(**self.inputs))
        loss.backward()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params.parameters()]
        return [loss.detach()] + grads

    def __call__(self) -> None:
        self.gradients()
        self.optimizer.step()


def _double(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return _cast_floats(inputs, "float64")


def _cast_floats(inputs: dict[str, torch.Tensor], dtype: str | None) -> dict[str, torch.Tensor]:
    """Floating inputs cast to `dtype` (a dtype name; None: as they are); integer ones (token ids,
    attention masks) untouched."""
    if dtype is None:
        return inputs
    return {k: v.to(getattr(torch, dtype)) if v.is_floating_point() else v for k, v in inputs.items()}


def batched(inputs: dict[str, torch.Tensor], batch: int) -> dict[str, torch.Tensor]:
    """The model's inputs repeated `batch` times along dim 0 (its batch-1 inputs become batch `batch`)."""
    if batch == 1:
        return inputs
    return {k: v.repeat(batch, *[1] * (v.dim() - 1)) for k, v in inputs.items()}


def _on(device: str, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in inputs.items()}


def _cpu(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    # Copied out at once: a CUDA-graph replay (mode reduce-overhead) overwrites its last outputs.
    return [t.detach().cpu() for t in tensors]


def _synchronizer(device: str) -> Callable[[], None]:
    """What waits for the device's queued kernels: a CUDA call returns before they finish."""
    return torch.cuda.synchronize if device == "cuda" else lambda: None


def _cpu_seconds(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def cuda_seconds(call: Callable[[], Any]) -> float:
    """The GPU's time from before the call's first kernel to after its last: CUDA events recorded on
    the current stream around it (where a CUDA graph replays too), the end waited for. Gaps where
    the GPU waited for the host's launches count, as they do for a caller."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _clock(device: str) -> Callable[[Callable[[], Any]], float]:
    """How one call is timed, in seconds: CUDA events on a GPU, the CPU's clock elsewhere."""
    return cuda_seconds if device == "cuda" else _cpu_seconds


def _make_step(case: Case, model: nn.Module, runner: Callable, inputs: dict[str, torch.Tensor], device: str | None = None):
    # Under autocast the float64 reference stays float64: autocast casts float32 only.
    if case.train:
        return TrainStep(runner, model, inputs, case.autocast, device or case.device)
    return InferenceStep(runner, inputs, case.autocast, device or case.device)


def _first_outputs(case: Case, step) -> list[torch.Tensor]:
    return step.gradients() if case.train else step()


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def _time_interleaved(calls: list[Callable], case: Case) -> list[float]:
    """Median ms of each call, timed in rounds: every round calls each once, its order rotated so
    that none always runs first, or always on caches another one warmed."""
    sync, seconds = _synchronizer(case.device), _clock(case.device)
    for _ in range(case.warmup):
        for fn in calls:
            fn()
    samples: list[list[float]] = [[] for _ in calls]
    for i in range(case.iters):
        for k in rotated(list(range(len(calls))), i):
            sync()  # no kernel of the previous call may finish inside this one's time
            samples[k].append(seconds(calls[k]))
    return [_median_ms(s) for s in samples]


def _timing_lock(case: Case) -> contextlib.AbstractContextManager[float]:
    """The run's GPU lock for a CUDA case's timing phase (none on the CPU, or outside a run)."""
    return timing_lock.held(timing_lock.configured() if case.device == "cuda" else None)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def run_case(case: Case, checkpoint: Callable[[Result], None] = lambda result: None) -> Result:
    """Measure one case in this process. Failures become a Result with status "error", never a raise.
    `checkpoint(result)` is given what is measured so far after each compile (and its accuracy):
    a case killed before its timing ends still tells its compile times and verdicts."""
    result = Result(case=case, status="ok")
    start = time.perf_counter()
    torch.set_num_threads(case.threads)
    # glibc's malloc thresholds are the whole process's: set here, before anything runs, where
    # runtime.keep_freed_mb asks (kiln/heap.py), they apply to eager's calls, the mode's
    # and the peer's alike, and to every mode's cases, not only to those kiln compiles in.
    heap.keep_freed_memory()
    result.malloc = heap.describe()
    try:
        _measure(case, result, checkpoint)
    except PhaseError as e:
        result.status, result.phase = "error", e.phase
        result.error = _first_line(e.error)
        traceback.print_exception(e.error, file=sys.stderr)
    result.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result.wall_s = time.perf_counter() - start
    return result


def _fp32_outputs(case: Case, model: nn.Module, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Eager float32's outputs, on the CPU, of a copy of `model` (float32, on the CPU): no cast, no
    autocast. A float32 truth that is the same on every device (a GPU's float32 convolutions take
    TF32 by default), that the peer's figure shares, and that keeps no copy in GPU memory."""
    plain = dataclasses.replace(case, dtype=None, autocast=None, device="cpu")
    model32 = copy.deepcopy(model)
    return _first_outputs(plain, _make_step(plain, model32, model32, inputs))


def _error_vs_fp32(case: Case, outputs: list[torch.Tensor], fp32: list[torch.Tensor] | None) -> float | None:
    """`accuracy.relative_error` of a step's outputs against float32's (None without a float32 run);
    a training step's gradients (after its loss) taken as one output."""
    return relative_error(outputs, fp32, pooled_from=1 if case.train else None) if fp32 is not None else None


def _placed(model: nn.Module, case: Case) -> nn.Module:
    """`model` moved to the case's device and cast to its dtype (floating weights and buffers)."""
    model = model.to(case.device)
    return model.to(getattr(torch, case.dtype)) if case.dtype else model


def _measure(case: Case, result: Result, checkpoint: Callable[[Result], None]) -> None:
    spec, mode = MODELS[case.model], MODES[case.mode]
    built = _phase("build", lambda: spec.build(case.train))
    inputs32 = _phase("build", lambda: batched(spec.make_inputs(), case.batch))
    fp32 = _phase("reference", lambda: _fp32_outputs(case, built, inputs32)) if case.lowers_precision else None
    eager_model = _phase("build", lambda: _placed(built, case))
    compiled_model = copy.deepcopy(eager_model)
    cpu_inputs = _cast_floats(inputs32, case.dtype)
    inputs = _phase("build", lambda: _on(case.device, cpu_inputs))
    torch.manual_seed(0)

    eager = _make_step(case, eager_model, eager_model, inputs)
    reference = _phase("reference", lambda: _cpu(_first_outputs(case, eager)))
    result.eager_fp32_rel_err = _error_vs_fp32(case, reference, fp32)

    @functools.cache  # the case's mode and the peer are judged against one float64 run
    def fp64_reference() -> list[torch.Tensor]:
        # On the CPU whatever the device: one float64 truth for every run, and no third copy in GPU memory.
        model64 = copy.deepcopy(eager_model).cpu().double()
        return _first_outputs(case, _make_step(case, model64, model64, _double(cpu_inputs), device="cpu"))

    with compile_time.recording() as trees:
        compiled, outputs, result.compile_s = _phase("compile", lambda: _compile_and_run(case, mode, compiled_model, inputs))
    result.compile_parts = _compile_parts(trees, result.compile_s)

    verdict: Verdict = _phase("accuracy", lambda: compare(outputs, reference, fp64_reference))
    result.accuracy = "pass" if verdict.passed else "fail"
    result.accuracy_rule, result.accuracy_detail = verdict.rule, verdict.detail or None
    result.max_abs_err = verdict.max_abs_err
    result.fp32_rel_err = _error_vs_fp32(case, outputs, fp32)

    stats = mode.stats()  # before a peer compiles: Dynamo's counters would count its graphs too
    result.graphs, result.graph_breaks = stats.get("graphs"), stats.get("graph_breaks")
    result.fallbacks = stats.get("fallbacks")
    checkpoint(result)
    calls = [eager, compiled]
    if case.against:
        try:
            calls.append(_compile_peer(case, eager_model, inputs, reference, fp64_reference, fp32, result))
        except Exception as e:  # noqa: BLE001 - the peer's failure is recorded; the case's own mode is still timed
            result.peer_error = _first_line(e)
            traceback.print_exception(e, file=sys.stderr)
        checkpoint(result)
    with _timing_lock(case) as result.timing_wait_s:
        times = _phase("timing", lambda: _time_interleaved(calls, case))
    result.eager_ms, result.compiled_ms = times[:2]
    result.peer_ms = times[2] if len(times) > 2 else None
    result.speedup = result.eager_ms / result.compiled_ms
    if case.device == "cuda":
        from benchmarks.launch_count import count_per_call

        result.launches, result.waits = _phase("launch count", lambda: count_per_call(compiled))
        if len(calls) > 2:
            result.peer_launches, result.peer_waits = _phase("launch count", lambda: count_per_call(calls[2]))
    if case.profile:
        from benchmarks.profile import profile_step

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


def _compile_parts(trees: list[compile_time.Stage], compile_s: float) -> dict[str, float] | None:
    """The first call's seconds by part of kiln's compilation (compile_time.PARTS), and "other":
    the rest of the call (running it, and Dynamo's capture under the Dynamo door). None for a mode
    that compiled nothing of kiln's."""
    if not trees:
        return None
    parts = compile_time.by_part(trees)
    return {**parts, "other": max(compile_s - sum(parts.values()), 0.0)}


def _compile_peer(case: Case, eager_model: nn.Module, inputs: dict[str, torch.Tensor], reference: list[torch.Tensor],
                  fp64_reference: Callable[[], list[torch.Tensor]], fp32: list[torch.Tensor] | None,
                  result: Result) -> Callable:
    """A third copy of the model compiled by the peer mode `case.against`, checked under the same
    accuracy rule; its calls are then timed in the same rounds as eager's and the case's own, so
    the two compiled calls see one process's machine (a cloud VM's speed drifts between processes
    by 10-30 %, more than the margins being measured)."""
    step, outputs, result.peer_compile_s = _compile_and_run(case, MODES[case.against], copy.deepcopy(eager_model), inputs)
    result.peer_accuracy = "pass" if compare(outputs, reference, fp64_reference).passed else "fail"
    result.peer_fp32_rel_err = _error_vs_fp32(case, outputs, fp32)
    return step


def write_result(path: str, result: Result) -> None:
    """`result` as JSON at `path`, written beside it and renamed over it: never read half-written."""
    with open(f"{path}.writing", "w") as f:
        json.dump(result.to_json(), f)
    os.replace(f"{path}.writing", path)


def main(argv: list[str]) -> int:
    """`CASE_JSON RESULT_PATH`: the result at RESULT_PATH, and what was measured so far at
    RESULT_PATH.partial while the case runs."""
    case, path = Case(**json.loads(argv[0])), argv[1]
    result = run_case(case, checkpoint=lambda so_far: write_result(f"{path}.partial", so_far))
    write_result(path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
