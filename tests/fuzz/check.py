"""Run one case through kiln and eager and judge it, with float64 as the arbiter.

The tolerance rule (`judge`, copied verbatim into every repro file):
- every output has eager's shape and dtype; integer and bool outputs equal eager's exactly (the
  generator feeds discrete ops only exact values, so no rounding can legitimately flip them);
- a float output is finite where eager's is, and its largest error against the float64 result
  is at most twice eager's own largest error in the case's dtype, plus 8 ulps of the dtype at the
  output's *scale*: the largest magnitude among the values it was computed from (a reduction's
  operand counted sqrt(n) times larger), since a different order of the same rounded operations
  (a fused kernel, another summation order) errs in proportion to the magnitudes it went through,
  even where eager happened to be exact. A float32 output computed from bfloat16 values also
  gets 4 bfloat16 ulps at the scale of those: kiln keeps a fused body's bfloat16 intermediates in
  float32 (docs/limits.md), so they differ from eager's rounded ones in the last bfloat16 bit.
"""

from __future__ import annotations

import math
import traceback
import warnings
from dataclasses import dataclass, field

import torch

import kiln
from kiln.capture import BREAKS
from kiln.runtime import fallback
from tests.fuzz.generate import FLOAT64
from tests.fuzz.program import GLOBALS, Program, upcast

ULPS = 8
LOW_PRECISION_ULPS = 4
EAGER_FACTOR = 2.0


@dataclass
class Outcome:
    status: str  # "pass", "fail", "fallback" (kiln ran some graph eagerly; results checked too), "discard"
    kind: str = ""  # a failure's kind: "crash", "mismatch", "mutated input"
    detail: str = ""
    failing: list[int] = field(default_factory=list)  # indices of failing outputs
    fallbacks: list[str] = field(default_factory=list)


def judge(actual, eager, truth, floor):
    """None if kiln's output `actual` is as good as `eager` against float64 `truth`, else why not;
    `floor` is the error allowed whatever eager's (see arbiter)."""
    if not isinstance(actual, torch.Tensor) or actual.shape != eager.shape or actual.dtype != eager.dtype:
        got = f"{actual.dtype}{list(actual.shape)}" if isinstance(actual, torch.Tensor) else type(actual).__name__
        return f"{got} where eager gives {eager.dtype}{list(eager.shape)}"
    if actual.numel() == 0:
        return None
    if not eager.is_floating_point():
        if torch.equal(actual, eager):
            return None
        at = tuple((actual != eager).nonzero()[0].tolist())
        return f"differs at {at}: {actual[at].item()} where eager gives {eager[at].item()} (exact dtype)"
    a, e, t = actual.double(), eager.double(), truth.double()
    if not torch.equal(torch.isfinite(a), torch.isfinite(e)):
        at = tuple((torch.isfinite(a) != torch.isfinite(e)).nonzero()[0].tolist())
        return f"non-finite pattern differs at {at}: {a[at].item()} where eager gives {e[at].item()}"
    finite = torch.isfinite(e) & torch.isfinite(t)
    if not finite.any():
        return None
    err_kiln = (a - t).abs()[finite]
    err_eager = (e - t).abs()[finite].max().item()
    tol = EAGER_FACTOR * err_eager + floor
    if err_kiln.max().item() <= tol:
        return None
    at = tuple(finite.nonzero()[err_kiln.argmax()].tolist())
    return (f"error {err_kiln.max().item():.3g} against float64 > tolerance {tol:.3g} (eager's error "
            f"{err_eager:.3g}, floor {floor:.3g}); at {at}: {a[at].item()!r}, eager {e[at].item()!r}, "
            f"float64 {t[at].item()!r}")


def arbiter(prog: Program, inputs: list[torch.Tensor]) -> tuple[dict, dict]:
    """The float64 value of every name, and the tolerance floor (module docstring) of each."""
    env = {i.name: upcast(t) for i, t in zip(prog.inputs, inputs)}
    eager = {i.name: t for i, t in zip(prog.inputs, inputs)}  # for the dtypes
    scale = {name: _maxabs(t) for name, t in env.items()}  # the magnitudes a value is computed from
    low = {name: scale[name] if t.dtype == torch.bfloat16 else 0.0 for name, t in eager.items()}  # bfloat16 ones
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for s in prog.stmts:
            env[s.out] = t = eval(s.expr, FLOAT64, env)
            eager[s.out] = eval(s.expr, GLOBALS, eager)
            growth = [math.sqrt(max(1.0, env[u].numel() / max(t.numel(), 1))) for u in s.uses]
            scale[s.out] = max([_maxabs(t)] + [scale[u] * g for u, g in zip(s.uses, growth)])
            own = _maxabs(t) if eager[s.out].dtype == torch.bfloat16 else 0.0
            low[s.out] = max([own] + [low[u] * g for u, g in zip(s.uses, growth)])
    floor = {}
    for name, t in eager.items():
        floor[name] = 0.0
        if t.is_floating_point():
            floor[name] = (ULPS * torch.finfo(t.dtype).eps * scale[name]
                           + LOW_PRECISION_ULPS * torch.finfo(torch.bfloat16).eps * low[name])
    return env, floor


def _maxabs(t: torch.Tensor) -> float:
    if t.numel() == 0:
        return 0.0
    v = t.double().abs()
    v = v[torch.isfinite(v)]
    return v.max().item() if v.numel() else 0.0


def compile_fn(fn, door: str):
    if door == "dynamo":
        return torch.compile(fn, backend="kiln")
    return kiln.compile(fn)


def check(prog: Program) -> Outcome:
    """Compile `prog` through its door, run it twice, and judge every output of both calls."""
    fn = prog.function()
    inputs = prog.make_inputs()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            eager = fn(*inputs)
        truth_env, floor = arbiter(prog, inputs)
    except Exception as e:  # not a kiln problem: the case is not a legal program
        return Outcome("discard", detail=f"eager raised {type(e).__name__}: {e}")
    _reset(prog.door)
    try:
        compiled = compile_fn(fn, prog.door)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runs = [compiled(*inputs), compiled(*inputs)]
    except Exception as e:
        tail = "".join(traceback.format_exception(e)[-4:])
        return Outcome("fail", "crash", f"{type(e).__name__}: {e}\n{tail}", list(range(len(prog.outputs))),
                       _fallbacks())
    finally:
        fallbacks = _fallbacks()
        fallback_detail = "\n".join(f.detail for f in fallback.FALLBACKS[:1])
        _reset(prog.door)
    problems, failing = [], []
    for call, actual in enumerate(runs):
        for i, name in enumerate(prog.outputs):
            why = judge(actual[i], eager[i], truth_env[name], floor[name])
            if why is not None:
                problems.append(f"call {call + 1}, output {i} ({name}): {why}")
                failing.append(i)
    fresh = prog.make_inputs()
    for spec, before, after in zip(prog.inputs, fresh, inputs):
        if not torch.equal(before, after):
            problems.append(f"input {spec.name} was modified")
    if problems:
        kind = "mismatch" if failing else "mutated input"
        return Outcome("fail", kind, "\n".join(problems), sorted(set(failing)), fallbacks)
    if fallbacks:
        return Outcome("fallback", detail=fallback_detail, fallbacks=fallbacks)
    return Outcome("pass")


def _fallbacks() -> list[str]:
    return [f.reason for f in fallback.FALLBACKS] + [f"capture {b.kind}: {b.explanation}" for b in BREAKS]


def _reset(door: str) -> None:
    kiln.reset()
    fallback.reset()
    if door == "dynamo":
        import torch._dynamo  # tests may import Dynamo; kiln itself does not
        torch._dynamo.reset()
