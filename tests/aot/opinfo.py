"""Check one OpInfo sample through `torch.compile(backend="kiln_aot_eager")` against eager.

Shared by the OpInfo tests (a representative subset) and the full sweep (`python -m
tests.aot.sweep_opinfo`). A sample passes when kiln's backend really compiled a graph for it, no
graph fell back to eager, and outputs (and, for backward, gradients) match eager's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch._dynamo
from torch.utils import _pytree as pytree

from kiln.integrations.dynamo import kiln_aot_eager
from kiln.runtime import fallback


@dataclass
class Outcome:
    status: str  # pass, fail, fallback, not-exercised, eager-error
    detail: str = ""


class CountingBackend:
    """kiln_aot_eager that remembers the graphs Dynamo hands it (Dynamo and fallbacks reset)."""

    def __init__(self) -> None:
        self.graphs: list = []
        torch._dynamo.reset()
        fallback.reset()

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return kiln_aot_eager(gm, example_inputs)

    def verdict(self) -> Outcome | None:
        """A fallback or an unexercised run, which no comparison can pass; else None."""
        if fallback.FALLBACKS:
            return Outcome("fallback", str(fallback.FALLBACKS[0]))
        if not self.graphs:
            return Outcome("not-exercised", "Dynamo produced no graph")
        return None


def raised(error: Exception) -> Outcome:
    return Outcome("fail", f"raised {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")


def assert_outcomes(outcomes: list[Outcome]) -> None:
    """At least one sample ran through kiln and passed, and none failed or fell back."""
    ran = [o for o in outcomes if o.status != "eager-error"]
    assert ran, "no sample ran in eager"
    # A sample Dynamo never hands to a backend says nothing about kiln; at least one must run.
    assert any(o.status == "pass" for o in ran), ran
    assert all(o.status in ("pass", "not-exercised") for o in ran), [o for o in ran if o.status != "pass"]


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
    cotangents = [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in outs]
    return list(torch.autograd.grad(outs, wants, cotangents, allow_unused=True))


def _same_metadata(actual, expected) -> None:
    a, e = _float_outputs(actual), _float_outputs(expected)
    assert [(t.shape, t.dtype) for t in a] == [(t.shape, t.dtype) for t in e], "output shapes or dtypes differ"


def check_sample(op, sample, backward: bool, seed: int = 0) -> Outcome:
    tensors, rebuild = _split(sample)

    def fn(*ts):
        inp, args, kwargs = rebuild(list(ts))
        return op(inp, *args, **kwargs)

    eager_inputs = _fresh(tensors)
    try:
        torch.manual_seed(seed)
        expected = fn(*eager_inputs)
        expected_grads = _grads(expected, eager_inputs, seed) if backward else []
    except Exception as e:  # noqa: BLE001 - a sample eager rejects says nothing about kiln
        return Outcome("eager-error", f"{type(e).__name__}: {e}")

    backend = CountingBackend()
    inputs = _fresh(tensors)
    try:
        torch.manual_seed(seed)
        actual = torch.compile(fn, backend=backend)(*inputs)
        actual_grads = _grads(actual, inputs, seed) if backward else []
    except Exception as e:  # noqa: BLE001
        return raised(e)
    if (unjudged := backend.verdict()) is not None:
        return unjudged
    try:
        if is_random(op):  # values come from the random stream; only their form can be compared
            _same_metadata(actual, expected)
            return Outcome("pass")
        torch.testing.assert_close(actual, expected, equal_nan=True, atol=1e-4, rtol=1e-4)
        if backward:
            torch.testing.assert_close(actual_grads, expected_grads, equal_nan=True, atol=1e-4, rtol=1e-4)
    except AssertionError as e:
        return Outcome("fail", str(e).strip().splitlines()[0])
    return Outcome("pass")


def is_random(op) -> bool:
    """Ops whose values eager does not define (random streams, uninitialized memory): eager differs
    from itself, so only the outputs' shapes and dtypes are compared."""
    return (op.name in RANDOM_OPS or "dropout" in op.name or "empty" in op.name
            or op.name.startswith(("rand", "normal", "bernoulli")))


RANDOM_OPS = {"cauchy", "exponential", "geometric", "log_normal", "normal", "uniform", "multinomial", "randint_like",
              "rand_like", "randn_like", "bernoulli", "nn.functional.rrelu"}
