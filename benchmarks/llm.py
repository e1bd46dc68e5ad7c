"""The llm suite: `kiln bench --suite llm` times text generation — greedy `generate()` with a static
KV cache — of HuggingFace decoders (benchmarks/llm_modes.py) compiled several ways, in this process,
against the machine's memory roofline (benchmarks/roofline.py).

What is timed: each mode's copy of the model has a clock (`StepClock`, forward pre- and post-hooks)
that records when each of its calls starts and ends; `generate` runs as the mode's users write it
(`kiln.compile(model).generate(...)`; `model.forward = torch.compile(model.forward)` then
`model.generate(...)`). One `generate(max_new_tokens=N)` calls the model N times: the
prompt's forward (prefill), then N - 1 decode steps of one token per sequence. Prefill time is the
first call's; decode time per token is (end of the last call - end of the first) / (N - 1): the
decode steps with what `generate` does between them (the greedy pick, the stopping check), which a
user's tokens per second includes.

Per (threads, model, batch): every mode's copy is built and warmed up (`warmup` generate calls:
compilation), then `rounds` rounds, each one generate call per mode, the modes interleaved in an
order rotated each round (timings between processes vary up to 40 % on shared VMs; within one
process every mode sees the same machine); the median per mode. The tokens of each mode are
compared with eager's.
"""

from __future__ import annotations

import copy
import gc
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, TextIO

import torch
from torch import nn

from benchmarks.llm_modes import LLM_MODELS, LLM_MODES, LlmMode, NotAvailable
from benchmarks.machine import OthersClock
from benchmarks.roofline import (ROUND_PROBE_PASSES, StepBytes, decode_step_bytes, linear_names, probe_ready,
                                 probes_agree, read_bandwidth)
from benchmarks.rounds import rotated
from kiln.native import libkiln


@dataclass(frozen=True)
class LlmSettings:
    """What one run of the suite measures."""

    models: tuple[str, ...]
    modes: tuple[str, ...]
    batches: tuple[int, ...] = (1, 4)
    threads: tuple[int, ...] = (1,)
    prompt_len: int = 128
    new_tokens: int = 128
    rounds: int = 3
    warmup: int = 1
    kv_cache: str = "static"  # HF's StaticCache, or "dynamic" (DynamicCache: generate()'s default)

    @property
    def cache_len(self) -> float:
        """The KV cache's length averaged over the decode steps: step k of N - 1 attends over
        prompt + k positions."""
        return self.prompt_len + self.new_tokens / 2


@dataclass
class LlmResult:
    """One (threads, model, batch, mode): medians over the rounds, or why there are none."""

    model: str
    batch: int
    mode: str
    threads: int
    status: str  # "ok", "n/a" (the mode's API is missing) or "error"
    note: str | None = None  # why n/a, or the error's first line and the phase it happened in
    prefill_s: float | None = None  # median time of the prompt's forward
    decode_s: float | None = None  # median time per decode step (one token per sequence)
    forward_s: float | None = None  # a step's forward alone (decode_s less generate's loop), median of the rounds
    first_s: float | None = None  # the first generate call's wall time, compilation included
    step_bytes: StepBytes | None = None  # what a decode step reads, this mode's weights
    tokens_equal: bool | None = None  # the new tokens are eager's (every round)
    agreement: float | None = None  # the fraction of new tokens equal to eager's (worst round)
    exact: bool = True  # the mode must give eager's tokens (float32); else its agreement is reported
    others_cpu: float | None = None  # share of the CPUs other processes used during the rounds
    fallbacks: list[str] = field(default_factory=list)  # graphs of the mode kiln could not compile (ran eagerly): why
    compiled_in_rounds: int = 0  # graphs kiln or Dynamo compiled during the mode's timed calls (their times include it)
    team_narrowings: int = 0  # threads kiln's team took off during the mode's timed calls: the cores were busy (kiln_team.cpp)
    prompt_len: int = 0
    new_tokens: int = 0
    decode_rounds_s: list[float] = field(default_factory=list)  # each round's time per decode step
    probes_gbps: list[float] = field(default_factory=list)  # the bandwidth probed just before each round's call
    probes_after_gbps: list[float] = field(default_factory=list)  # and just after it

    def _brackets(self) -> list[tuple[float, float, float]] | None:
        """Each round's (step seconds, probe before, probe after); the after-probe is the before one
        where the run has none (results written before they were taken)."""
        n = len(self.decode_rounds_s)
        if self.step_bytes is None or len(self.probes_gbps) != n or not n:
            return None
        after = self.probes_after_gbps if len(self.probes_after_gbps) == n else self.probes_gbps
        return list(zip(self.decode_rounds_s, self.probes_gbps, after))

    def bracketed_rounds(self) -> list[bool] | None:
        """Per round, whether its two probes agree (within BRACKET_AGREEMENT): the machine read
        alike before and after the call, so the call likely ran at that bandwidth."""
        brackets = self._brackets()
        if brackets is None:
            return None
        return [probes_agree(before, after) for _, before, after in brackets]

    def _counted(self) -> list[tuple[float, float]] | None:
        """(fraction, bandwidth) of the rounds `roofline` counts: those whose probes agree, else all."""
        brackets = self._brackets()
        if brackets is None:
            return None
        means = [(step, (before + after) / 2) for step, before, after in brackets]
        rounds = [(self.step_bytes.total / step / 1e9 / mean, mean) for step, mean in means]
        return [r for r, ok in zip(rounds, self.bracketed_rounds()) if ok] or rounds

    @property
    def roofline(self) -> float | None:
        """The fraction of the machine's bandwidth the decode steps read at: each round's bytes per
        second over the mean of the bandwidth probed just before and just after that round's call,
        the median of the rounds whose two probes agree (of every round where none do). On a
        shared VM the machine moves between states of ~34 and ~62 GB/s for seconds at a time (a
        2-core AMD EPYC: its two vCPUs read at one core's speed, then at two); a call between
        probes of both states ran in either. Without probes paired with the rounds: None."""
        counted = self._counted()
        return None if counted is None else statistics.median(f for f, _ in counted)

    @property
    def roofline_bandwidth(self) -> float | None:
        """The bandwidth `roofline` is taken over: the median probe mean of the rounds it counts."""
        counted = self._counted()
        return None if counted is None else statistics.median(gbps for _, gbps in counted)

    @property
    def prefill_tokens_per_s(self) -> float | None:
        return None if self.prefill_s is None else self.batch * self.prompt_len / self.prefill_s

    @property
    def decode_tokens_per_s(self) -> float | None:
        return None if self.decode_s is None else self.batch / self.decode_s

    @property
    def gbps(self) -> float | None:
        """Bytes a decode step must read over its time."""
        if self.decode_s is None or self.step_bytes is None:
            return None
        return self.step_bytes.total / self.decode_s / 1e9

    def to_json(self) -> dict[str, Any]:
        # The rates are derived, written for readers of the JSON, ignored when read back.
        data = {**asdict(self), "step_bytes": self.step_bytes.to_json() if self.step_bytes else None}
        return {**data, "prefill_tokens_per_s": self.prefill_tokens_per_s,
                "decode_tokens_per_s": self.decode_tokens_per_s, "gbps": self.gbps, "roofline": self.roofline}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "LlmResult":
        known = {f for f in cls.__dataclass_fields__ if f != "step_bytes"}
        step = data.get("step_bytes")
        step = StepBytes(**{k: v for k, v in step.items() if k != "total"}) if step else None
        return cls(step_bytes=step, **{k: v for k, v in data.items() if k in known})


@dataclass
class LlmRun:
    """What the llm suite measured: its results, and the machine's read bandwidth (GB/s) at each
    thread count — the best of its probes (`bandwidth_probes`: every reading), with the share of
    the CPUs other processes used while the first was measured (a busy neighbour lowers it, and
    raises every roofline fraction)."""

    settings: LlmSettings
    results: list[LlmResult] = field(default_factory=list)
    bandwidth: dict[int, float] = field(default_factory=dict)
    bandwidth_others: dict[int, float | None] = field(default_factory=dict)
    bandwidth_probes: dict[int, list[float]] = field(default_factory=dict)

    def probed(self, threads: int, gbps: float) -> None:
        """A reading of the bandwidth at `threads`: kept, and the best so far is the roofline's."""
        self.bandwidth_probes.setdefault(threads, []).append(gbps)
        self.bandwidth[threads] = max(self.bandwidth.get(threads, 0.0), gbps)

    def to_json(self) -> dict[str, Any]:
        return {"settings": asdict(self.settings), "results": [r.to_json() for r in self.results],
                "bandwidth_gbps": {str(t): gbps for t, gbps in self.bandwidth.items()},
                "bandwidth_others_cpu": {str(t): share for t, share in self.bandwidth_others.items()},
                "bandwidth_probes_gbps": {str(t): probes for t, probes in self.bandwidth_probes.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "LlmRun":
        settings = LlmSettings(**{k: tuple(v) if isinstance(v, list) else v for k, v in data["settings"].items()})
        return cls(settings, [LlmResult.from_json(r) for r in data["results"]],
                   {int(t): gbps for t, gbps in data["bandwidth_gbps"].items()},
                   {int(t): share for t, share in data.get("bandwidth_others_cpu", {}).items()},
                   {int(t): probes for t, probes in data.get("bandwidth_probes_gbps", {}).items()})


class StepClock:
    """The start and end (perf_counter) of each call of a model, by its forward pre- and post-hooks
    (outside whatever forward the mode installed, kiln's included: `generate` calls the module):

        clock = StepClock.install(model)
        model.generate(...)
        clock.calls          # [(start, end), ...]: the prefill, then each decode step
    """

    def __init__(self) -> None:
        self.calls: list[tuple[float, float]] = []
        self._start = 0.0

    @classmethod
    def install(cls, model: nn.Module) -> "StepClock":
        clock = cls()

        def start(module: nn.Module, args: Any) -> None:
            clock._start = time.perf_counter()

        def end(module: nn.Module, args: Any, out: Any) -> None:
            clock.calls.append((clock._start, time.perf_counter()))

        model.register_forward_pre_hook(start)
        model.register_forward_hook(end)
        return clock

    def prefill_and_step(self) -> tuple[float, float]:
        """Seconds of the first call, and per call after it from the end of the first to the end of the last."""
        (start, first_end), last_end = self.calls[0], self.calls[-1][1]
        return first_end - start, (last_end - first_end) / (len(self.calls) - 1)

    def forward(self) -> float:
        """The mean seconds of a decode step's forward alone (the calls after the first), without
        `generate`'s own work between them (logits processing, the next inputs, the mask): a mean,
        as `prefill_and_step`'s time per step is, so that it is never above it."""
        return statistics.fmean(end - start for start, end in self.calls[1:])


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"[:300]


@dataclass
class _Runner:
    """One mode's model copy (`generator`: what the mode calls `generate` on), its clock, and the
    samples of its rounds."""

    mode: LlmMode
    generator: nn.Module
    clock: StepClock
    result: LlmResult
    prefill: list[float] = field(default_factory=list)
    decode: list[float] = field(default_factory=list)
    forward: list[float] = field(default_factory=list)

    def generate(self, prompt: torch.Tensor, options: dict[str, Any]) -> torch.Tensor:
        self.clock.calls.clear()
        with torch.no_grad(), self.mode.context():
            return self.generator.generate(prompt, attention_mask=torch.ones_like(prompt), **options)


KV_CACHES = ("static", "dynamic")


def generate_options(new_tokens: int, kv_cache: str = "static") -> dict[str, Any]:
    """Greedy, exactly `new_tokens` tokens, a static KV cache (or, `kv_cache` "dynamic", HF's
    default DynamicCache, which grows by `torch.cat`), and none of HF's own compilation.

    Exactly: no end-of-sequence token, rather than `min_new_tokens`, whose logits processor (and
    the EOS stopping criterion) call `torch.isin` three times a step, 0.47 ms a token on 2 cores,
    a tenth of an int4 decode step of llama-160m, the same in every mode."""
    if kv_cache not in KV_CACHES:
        raise ValueError(f"kv_cache must be one of {', '.join(KV_CACHES)} (got {kv_cache!r})")
    cache = {"cache_implementation": "static"} if kv_cache == "static" else {}
    return dict(max_new_tokens=new_tokens, eos_token_id=None, do_sample=False, **cache, disable_compile=True,
                pad_token_id=0)


def _prepare(mode: LlmMode, base: nn.Module, result: LlmResult, batch: int, settings: LlmSettings) -> _Runner | None:
    """The mode's copy of `base` as the mode runs it, clocked; None (the result says why) when it cannot run."""
    names = linear_names(base)
    # By the mode's rule, from the float32 model: shown for a mode that is not available too (what it would read).
    result.step_bytes = decode_step_bytes(base, mode.weights, batch, settings.cache_len)
    why = mode.unavailable_reason()
    if why:
        result.status, result.note = "n/a", why
        return None
    try:
        model = copy.deepcopy(base)
        generator = mode.prepare(model)
    except NotAvailable as e:
        result.status, result.note = "n/a", str(e)
        return None
    except Exception as e:  # noqa: BLE001 - the suite goes on with the other modes
        result.status, result.note = "error", f"prepare: {_first_line(e)}"
        return None
    if mode.quantizes:
        result.step_bytes = decode_step_bytes(model, mode.weights, batch, settings.cache_len, names, from_tensors=True)
    return _Runner(mode, generator, StepClock.install(model), result)


def _check_tokens(runner: _Runner, tokens: torch.Tensor, reference: torch.Tensor, prompt_len: int) -> None:
    new, expected = tokens[:, prompt_len:], reference[:, prompt_len:]
    same = new.shape == expected.shape and torch.equal(new, expected)
    agreement = (new == expected).float().mean().item() if new.shape == expected.shape else 0.0
    r = runner.result
    r.tokens_equal = same if r.tokens_equal is None else (r.tokens_equal and same)
    r.agreement = agreement if r.agreement is None else min(r.agreement, agreement)


def _run(runner: _Runner, prompt: torch.Tensor, options: dict[str, Any], phase: str) -> torch.Tensor | None:
    try:
        return runner.generate(prompt, options)
    except Exception as e:  # noqa: BLE001
        runner.result.status, runner.result.note = "error", f"{phase}: {_first_line(e)}"
        return None


def _warm_up(runners: list[_Runner], prompt: torch.Tensor, options: dict[str, Any], warmup: int) -> torch.Tensor | None:
    """`warmup` generate calls of each mode (the first compiles); those that fail leave `runners`.
    Eager's tokens, where eager is among them."""
    from kiln.runtime.fallback import FALLBACKS

    reference = None
    for runner in list(runners):
        start, fell = time.perf_counter(), len(FALLBACKS)
        for i in range(warmup):
            tokens = _run(runner, prompt, options, "warm-up")
            if tokens is None:
                runners.remove(runner)
                break
            if i == 0:
                runner.result.first_s = time.perf_counter() - start
            if runner.mode.name == "eager":
                reference = tokens
        # A graph kiln failed to compile runs eagerly: its figures are eager's, said beside them.
        runner.result.fallbacks = [f.reason for f in FALLBACKS[fell:]]
    return reference


class CompileCount:
    """Graphs compiled in this process so far, kiln's (each compiled entry of its capture) and
    Dynamo's (each frame it converted), while it is installed: a timed call that compiled is told
    beside its figures. (kiln's first capture once made every function Dynamo had compiled before
    compile again, inside the first timed round: Inductor's figures then held its compile time.)"""

    def __init__(self) -> None:
        self.kiln = 0

    def __enter__(self) -> "CompileCount":
        from kiln.capture.cache import OBSERVERS

        OBSERVERS.append(self._observe)
        return self

    def __exit__(self, *exc: Any) -> None:
        from kiln.capture.cache import OBSERVERS

        OBSERVERS.remove(self._observe)

    def _observe(self, event: str, cache: Any, payload: Any) -> None:
        if event == "entry":
            self.kiln += 1

    def total(self) -> int:
        from torch._dynamo.utils import counters

        return self.kiln + int(counters["frames"]["total"])


def _rounds(runners: list[_Runner], prompt: torch.Tensor, options: dict[str, Any], reference: torch.Tensor,
            rounds: int, probe: Callable[[], float] | None = None) -> float | None:
    """The timed rounds, one generate call per mode each, `probe()` (the machine's bandwidth, GB/s)
    before the first call and after each (a call's probes: the one before it and the one after);
    the share of the CPUs others used meanwhile. A call that compiled a graph is counted in its
    result (`compiled_in_rounds`)."""
    with CompileCount() as compiles:
        clock = OthersClock()
        gbps = probe() if probe is not None else None
        for r in range(rounds):
            for runner in rotated(runners, r):
                before, narrowed = compiles.total(), libkiln.team_narrowings()
                tokens = _run(runner, prompt, options, f"round {r + 1}")
                runner.result.compiled_in_rounds += compiles.total() - before
                runner.result.team_narrowings += libkiln.team_narrowings() - narrowed
                after = probe() if probe is not None else None
                if tokens is None:
                    runners.remove(runner)
                    gbps = after
                    continue
                prefill, step = runner.clock.prefill_and_step()
                runner.prefill.append(prefill)
                runner.decode.append(step)
                runner.forward.append(runner.clock.forward())
                if gbps is not None:
                    runner.result.probes_gbps.append(gbps)
                    runner.result.probes_after_gbps.append(after)
                gbps = after
                _check_tokens(runner, tokens, reference, prompt.shape[1])
        return clock.share()


def measure_group(base: nn.Module, model: str, batch: int, threads: int, modes: list[LlmMode],
                  settings: LlmSettings, probe: Callable[[], float] | None = None) -> list[LlmResult]:
    """Every mode on its own copy of `base` at `batch` sequences of `settings.prompt_len` tokens:
    warm-ups, then the interleaved rounds (`probe()`, the bandwidth in GB/s, before each call); the medians."""
    results = [LlmResult(model, batch, m.name, threads, "ok", exact=m.exact, prompt_len=settings.prompt_len,
                         new_tokens=settings.new_tokens) for m in modes]
    import torch._dynamo

    torch._dynamo.reset()  # (each group's Inductor copy starts with Dynamo's recompile limit untouched)
    prompt = torch.randint(0, base.config.vocab_size, (batch, settings.prompt_len),
                           generator=torch.Generator().manual_seed(1))
    options = generate_options(settings.new_tokens, settings.kv_cache)
    runners = [r for r in (_prepare(m, base, res, batch, settings) for m, res in zip(modes, results)) if r]
    reference = _warm_up(runners, prompt, options, settings.warmup)
    if reference is None:  # (no eager mode in the run, or it failed)
        with torch.no_grad():
            reference = base.generate(prompt, attention_mask=torch.ones_like(prompt), **options)
    others = _rounds(runners, prompt, options, reference, settings.rounds, probe)
    for runner in runners:
        runner.result.prefill_s = statistics.median(runner.prefill)
        runner.result.decode_s = statistics.median(runner.decode)
        runner.result.decode_rounds_s = list(runner.decode)
        runner.result.forward_s = statistics.median(runner.forward)
        runner.result.others_cpu = others
    del runners
    gc.collect()  # (the copies' weights, before the next group's)
    return results


def run_llm_suite(settings: LlmSettings, progress: TextIO | None = sys.stderr,
                  on_group: Callable[[LlmRun], None] | None = None) -> LlmRun:
    """Every model at every batch and thread count through every mode; with the machine's read
    bandwidth at each thread count, the best of a probe before the first group and those between the
    timed calls (each call's roofline is of the probes before and after it: LlmResult.roofline).
    `on_group(run)` after each (model, batch): the run so far."""
    run = LlmRun(settings)
    modes = [LLM_MODES[name] for name in settings.modes]
    before = torch.get_num_threads()
    try:
        for threads in settings.threads:
            # The probes' buffer is made and their C++ built before the clock starts (probe_ready).
            buffer = probe_ready()
            clock = OthersClock()
            run.probed(threads, read_bandwidth(threads, buffer=buffer))
            run.bandwidth_others[threads] = clock.share()
            _say(progress, f"read bandwidth at {_threads(threads)}: {run.bandwidth[threads]:.1f} GB/s")
            torch.set_num_threads(threads)
            # Probed again between the calls of a round: on a shared VM the machine's bandwidth moves
            # (the same probe read 35 and 65 GB/s within the hour on a 2-core AMD EPYC, and kiln's
            # float32 decode once read 118 % of a probe taken before its group). Each call's GB/s is
            # taken over the probes just before and after it (LlmResult.roofline), and the best of
            # every probe is the run's bandwidth.

            def probe(threads: int = threads, buffer: torch.Tensor = buffer) -> float:
                gbps = read_bandwidth(threads, passes=ROUND_PROBE_PASSES, buffer=buffer)
                run.probed(threads, gbps)
                return gbps

            for name in settings.models:
                base = LLM_MODELS[name].build()
                for batch in settings.batches:
                    group = measure_group(base, name, batch, threads, modes, settings, probe)
                    run.results += group
                    for r in group:
                        _say(progress, f"{name} · batch {batch} · {r.mode} · {_threads(threads)}: "
                                       f"{_verdict(r, run.bandwidth[threads])}")
                    if on_group is not None:
                        on_group(run)
                del base
                gc.collect()
            del buffer, probe
    finally:
        torch.set_num_threads(before)
    return run


def _threads(n: int) -> str:
    return f"{n} thread{'s' if n > 1 else ''}"


def _say(progress: TextIO | None, line: str) -> None:
    if progress is not None:
        progress.write(line + "\n")
        progress.flush()


def roofline_of(r: LlmResult, bandwidth: float | None) -> float | None:
    """r's fraction of the roofline: paired with its rounds' probes where it has them, else of `bandwidth`."""
    if r.roofline is not None:
        return r.roofline
    return r.gbps / bandwidth if r.gbps is not None and bandwidth else None


def _verdict(r: LlmResult, bandwidth: float) -> str:
    if r.status != "ok":
        return f"{'not available' if r.status == 'n/a' else 'error'}: {r.note}"
    tokens = ("eager's tokens" if r.tokens_equal else f"tokens differ from eager's ({r.agreement:.0%} agree)") \
        if r.exact else f"{r.agreement:.0%} of eager's tokens"
    fell = f"; {fallen(r)}" if r.fallbacks else ""
    fell += f"; {compiled_while_timed(r)}" if r.compiled_in_rounds else ""
    return (f"decode {r.decode_s * 1e3:.2f} ms/token ({r.decode_tokens_per_s:.1f} tok/s, "
            f"{roofline_of(r, bandwidth):.0%} of the roofline), prefill {r.prefill_tokens_per_s:.0f} tok/s, {tokens}{fell}")


def fallen(r: LlmResult) -> str:
    """The graphs of r's mode that kiln could not compile, in a phrase."""
    return f"{len(r.fallbacks)} graph(s) ran eagerly, kiln could not compile them: {r.fallbacks[0]}"


def compiled_while_timed(r: LlmResult) -> str:
    """The graphs r's mode compiled during its timed calls, in a phrase."""
    return f"compiled {r.compiled_in_rounds} graph(s) during the timed rounds: its times include compiling"
