"""Check one OpInfo sample through `torch.compile(backend=...)` against eager.

Shared by the OpInfo tests (representative subsets) and the sweeps (`python -m tests.aot.sweep_opinfo`
for kiln_aot_eager, `python -m tests.ops.sweep_opinfo` for kiln beside Inductor). A sample passes
when the backend really compiled a graph for it, no graph fell back to eager, and outputs (and, for
backward, gradients) match eager's.

Backends: "kiln_aot_eager" and "kiln" (kiln's own), or any name Dynamo knows ("inductor", the peer
the kiln sweep measures against). For "kiln" the lowered `Program`s are kept, so a caller can tell
an op kiln generated code for from one it called as an ATen extern. `door="kiln.compile"` captures
with kiln's own bytecode capture (`kiln.compile(fn, backend=...)`) instead of Dynamo; the same
rules hold (a graph compiled, no backend fallback, values match).

Tolerances (`tolerance=`): "1e-4" (atol = rtol = 1e-4, what the CI subsets use) or "float32"
(torch.testing's defaults for the output dtype: rtol 1.3e-6 and atol 1e-5 for float32, exact for
integers; what OpInfo's own tests use where an op declares no override).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch._dynamo
from torch.utils import _pytree as pytree

import kiln
from kiln.backend import Backend, kiln_aot_eager
from kiln.capture.break_records import BREAKS
from kiln.backend.backends import with_aot
from kiln.runtime import fallback


UNOBSERVED = "<a compiled graph whose Program the test could not see>"
DOORS = ("torch.compile", "kiln.compile")
TOLERANCES = {"1e-4": dict(atol=1e-4, rtol=1e-4), "float32": {}}  # {}: torch.testing's defaults per dtype


@dataclass
class Outcome:
    status: str  # pass, fail, fallback, not-exercised, eager-error
    detail: str = ""
    externs: tuple[str, ...] = ()  # backend "kiln": the ATen ops its Programs call as externs
    kernels: int = 0  # backend "kiln": generated C++ kernels


class CountingBackend:
    """A backend that remembers the graphs Dynamo hands it (Dynamo and fallbacks reset) and, for
    "kiln", every lowered Program.

    "kiln" is rebuilt from `with_aot` around the backend driver, exactly as `kiln.backend.kiln`
    builds it (fallbacks recorded the same way), with each Program the driver lowers kept on the
    side (the driver's `observe` hook).
    """

    def __init__(self, backend: str = "kiln_aot_eager") -> None:
        self.backend = backend
        self.graphs: list = []
        self.programs: list = []
        self.unobserved = 0
        torch._dynamo.reset()
        fallback.reset()

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        if self.backend == "kiln_aot_eager":
            return kiln_aot_eager(gm, example_inputs)
        if self.backend == "kiln":
            return with_aot("kiln", gm, example_inputs, self._compile_cpp)
        return torch._dynamo.lookup_backend(self.backend)(gm, example_inputs)

    def _compile_cpp(self, gm, example_inputs):
        compiled = Backend(observe=lambda graph: self.programs.append(graph.program))(gm, example_inputs)
        if isinstance(compiled, torch.fx.GraphModule):
            self.unobserved += 1  # ran through ATen (data-dependent sizes): no Program to see
        return compiled

    def record(self, outcome: Outcome) -> Outcome:
        """`outcome` with the externs and kernel count of the Programs compiled so far (a graph
        whose Program could not be seen counts as the extern `UNOBSERVED`)."""
        outcome.externs = tuple(str(step.op) for p in self.programs for step in p.externs) + (UNOBSERVED,) * self.unobserved
        outcome.kernels = sum(len(p.kernels) for p in self.programs)
        return outcome

    def verdict(self) -> Outcome | None:
        """A fallback or an unexercised run, which no comparison can pass; else None."""
        if fallback.FALLBACKS:
            return Outcome("fallback", str(fallback.FALLBACKS[0]))
        if not self.graphs:
            return Outcome("not-exercised", "no graph reached the backend")
        return None


def raised(error: Exception) -> Outcome:
    return Outcome("fail", f"raised {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")


def assert_outcomes(outcomes: list[Outcome]) -> None:
    """At least one sample ran through the backend and passed, and none failed or fell back."""
    ran = [o for o in outcomes if o.status != "eager-error"]
    assert ran, "no sample ran in eager"
    # A sample Dynamo never hands to a backend says nothing about kiln; at least one must run.
    assert any(o.status == "pass" for o in ran), ran
    assert all(o.status in ("pass", "not-exercised") for o in ran), [o for o in ran if o.status != "pass"]


def op_status(outcomes: list[Outcome]) -> tuple[str, str]:
    """One op's status over its samples, and the first failing sample's detail.

    pass: every sample that ran in eager passed (or never reached the backend, as long as one did);
    fail wins over fallback; eager-error when eager rejected every sample.
    """
    checked = [o for o in outcomes if o.status != "eager-error"]
    statuses = {o.status for o in checked}
    if not checked:
        status = "eager-error"
    elif statuses <= {"pass", "not-exercised"}:
        status = "pass" if "pass" in statuses else "not-exercised"
    elif statuses & {"fail", "fallback"} == {"fallback"}:
        status = "fallback"
    else:
        status = "fail"
    shown = ("not-exercised",) if status == "not-exercised" else ("fail", "fallback")  # why nothing ran, or what failed
    detail = next((o.detail for o in checked if o.status in shown and o.detail), "")
    return status, detail


def _split(sample) -> tuple[list[torch.Tensor], callable]:
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

    def rebuild(tensors):
        filled = list(leaves)
        for i, t in zip(positions, tensors):
            filled[i] = t
        return pytree.tree_unflatten(filled, spec)

    return [leaves[i] for i in positions], rebuild


def _fresh(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]


def _float_outputs(out) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _grads(out, inputs: list[torch.Tensor], seed: int) -> list[torch.Tensor | None]:
    outs = [t for t in _float_outputs(out) if t.requires_grad]
    wants = [t for t in inputs if t.requires_grad]
    if not outs or not wants:
        return []
    gen = torch.Generator().manual_seed(seed)
    cotangents = [torch.randn(t.shape, generator=gen, dtype=t.dtype).to(t.device) for t in outs]
    return list(torch.autograd.grad(outs, wants, cotangents, allow_unused=True))


def _same_metadata(actual, expected) -> None:
    a, e = _float_outputs(actual), _float_outputs(expected)
    assert [(t.shape, t.dtype) for t in a] == [(t.shape, t.dtype) for t in e], "output shapes or dtypes differ"


def _compile(fn, counting: CountingBackend, door: str, breaks: list, dynamic: bool | None = None):
    """`fn` compiled through `door` with `counting` as its backend (`dynamic` passed on: True makes
    every input size symbolic); kiln's capture reports the frames it ran eagerly into `breaks`."""
    if door == "torch.compile":
        return torch.compile(fn, backend=counting, dynamic=dynamic)
    if door != "kiln.compile":
        raise ValueError(f"door must be one of {DOORS}, got {door!r}")
    kiln.reset()
    compiled = kiln.compile(fn, backend=counting, dynamic=dynamic)

    def run(*args):
        BREAKS.clear()
        try:
            return compiled(*args)
        finally:
            # Graph breaks and frames run eagerly, callees' frames included (a frame of torch's
            # own the capture could not take shows here, not in the backend's fallbacks).
            breaks.extend(r for r in BREAKS if not r.resumed)

    return run


def check_sample(op, sample, backward: bool, seed: int = 0, backend: str = "kiln_aot_eager",
                 door: str = "torch.compile", tolerance: str = "1e-4", dynamic: bool | None = None) -> Outcome:
    tol = TOLERANCES[tolerance]
    tensors, rebuild = _split(sample)

    def fn(*ts):
        inp, args, kwargs = rebuild(list(ts))
        return op(inp, *args, **kwargs)

    eager_inputs = _fresh(tensors)
    try:
        torch.manual_seed(seed)
        expected = fn(*eager_inputs)
        expected_grads = _grads(expected, eager_inputs, seed) if backward else []
    except Exception as e:  # noqa: BLE001 - a sample eager rejects says nothing about the backend
        return Outcome("eager-error", f"{type(e).__name__}: {e}")

    counting = CountingBackend(backend)
    breaks: list = []  # kiln.compile: frames kiln's capture ran eagerly
    inputs = _fresh(tensors)
    try:
        torch.manual_seed(seed)
        actual = _compile(fn, counting, door, breaks, dynamic)(*inputs)
        actual_grads = _grads(actual, inputs, seed) if backward else []
    except Exception as e:  # noqa: BLE001
        return counting.record(raised(e))
    if (unjudged := counting.verdict()) is not None:
        if unjudged.status == "not-exercised" and breaks:
            unjudged.detail = f"kiln's capture ran the frame eagerly: {breaks[0]}".splitlines()[0]
        return counting.record(unjudged)
    try:
        if is_random(op):  # values come from the random stream; only their form can be compared
            _same_metadata(actual, expected)
            return counting.record(Outcome("pass"))
        torch.testing.assert_close(actual, expected, equal_nan=True, **tol)
        if backward:
            torch.testing.assert_close(actual_grads, expected_grads, equal_nan=True, **tol)
    except AssertionError as e:
        return counting.record(Outcome("fail", _mismatch(e)))
    return counting.record(Outcome("pass"))


def _mismatch(error: AssertionError) -> str:
    """assert_close's message in one line: what differed and the greatest differences, so a
    summary tells a rounding miss from a wrong value."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    kept = [lines[0]] + [line for line in lines[1:] if line.startswith(("Greatest", "Mismatched", "The failure"))]
    return " ".join(kept)


def op_id(op) -> str:
    """An OpInfo entry's name with its variant: `div.floor_rounding`, `max.binary`, `add`."""
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def is_random(op) -> bool:
    """Ops whose values eager does not define (random streams, uninitialized memory): eager differs
    from itself, so only the outputs' shapes and dtypes are compared."""
    return (op.name in RANDOM_OPS or "dropout" in op.name or "empty" in op.name
            or op.name.startswith(("rand", "normal", "bernoulli")))


RANDOM_OPS = {"cauchy", "exponential", "geometric", "log_normal", "normal", "uniform", "multinomial", "randint_like",
              "rand_like", "randn_like", "bernoulli", "nn.functional.rrelu"}
