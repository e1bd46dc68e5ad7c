"""How a torch-level graph fails under kiln: a compile error, or outputs beyond tolerance.

    failure = how_it_fails(gm, inputs, rtol=1e-3, atol=1e-3)
    # Failure(kind="compile", message="RuntimeError: planted"), or kind="accuracy", or None

A graph is compiled by kiln's real pipeline, the AOT layer over the backend driver, for inference
(`run_with_kiln`). It fails to compile when that, or its first call, raises; the message is the
exception's type and the first line of its text. It fails accuracy when an output differs from the
reference beyond `atol + rtol * |reference|`, and eager's own output at the graph's precision does
not: the reference is eager in float64 (floating inputs and constants widened) when the graph runs
so, else eager as it is. A difference that eager shares is the precision of the graph's dtype, not
kiln's error.

The functions in CARRIED are copied verbatim into every repro.py (kiln/debug/repro.py), so that
the minifier and the repro decide "still fails" with the same code: they use only `copy`, `torch`,
`pytree` (torch.utils._pytree), `aot` (kiln.aot) and `Backend` (kiln.backend), imported the same
way in both.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import fx
from torch.utils import _pytree as pytree

from kiln import aot
from kiln.backend import Backend

KINDS = ("compile", "accuracy")


@dataclass(frozen=True)
class Failure:
    """One way a graph fails: its kind and what was said.

    `message` is the exception's type and first line for a compile failure, the first output out of
    tolerance for an accuracy failure. Two failures are the same when the kinds match and, for a
    compile failure, the exception type and first line match too: an accuracy failure's numbers
    change as the graph shrinks.

    Example::

        Failure("compile", "RuntimeError: planted").same_as(Failure("compile", "RuntimeError: planted"))  # True
    """

    kind: str
    message: str

    def same_as(self, other: Failure | None) -> bool:
        if other is None or other.kind != self.kind:
            return False
        return self.kind == "accuracy" or other.message == self.message


def compile_failure(error: BaseException) -> Failure:
    """The Failure an exception raised by compiling or running a graph stands for."""
    lines = str(error).strip().splitlines()
    return Failure("compile", f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__)


def how_it_fails(gm: fx.GraphModule, inputs: Sequence[Any], rtol: float, atol: float) -> Failure | None:
    """How `gm` fails under kiln on `inputs` (module docstring), or None when it does not.

    Example::

        how_it_fails(fx.symbolic_trace(f), [torch.randn(4, 4)], rtol=1e-3, atol=1e-3)
    """
    try:
        actual = run_with_kiln(gm, inputs)
    except Exception as error:  # noqa: BLE001 - any error of kiln's is the failure being looked for
        return compile_failure(error)
    mismatch = accuracy_error(gm, inputs, actual, rtol, atol)
    return Failure("accuracy", mismatch) if mismatch is not None else None


# --- carried into every repro.py ---------------------------------------------------------------


def run_with_kiln(gm, inputs):
    """The flat outputs of `gm` on `inputs`, compiled for inference by kiln's AOT layer and backend."""
    with torch.no_grad():
        return pytree.tree_leaves(aot.compile(gm, list(inputs), Backend())(*inputs))


def eager_outputs(gm, inputs, dtype=None):
    """The flat outputs of `gm` run eagerly; with `dtype`, floating inputs and constants cast to it
    first (a copy of `gm`: its own constants stay as they are)."""
    if dtype is not None:
        gm = copy.deepcopy(gm).to(dtype)
        inputs = [x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
    with torch.no_grad():
        # forward, not gm(...): fx's call prints the graph's failing line to stderr before the
        # exception, and a graph that cannot run widened raises here by design.
        return pytree.tree_leaves(gm.forward(*inputs))


def within(actual, expected, rtol, atol):
    """Whether `actual` matches `expected` in shape and, as float64, within `atol + rtol * |expected|`
    (NaN where expected has NaN)."""
    if not isinstance(actual, torch.Tensor):
        return actual == expected
    if actual.shape != expected.shape:
        return False
    return torch.allclose(actual.double(), expected.double(), rtol=rtol, atol=atol, equal_nan=True)


def accuracy_error(gm, inputs, actual, rtol, atol):
    """What is wrong with kiln's outputs `actual` of `gm`, or None when nothing is: the first output
    beyond tolerance of the reference (eager in float64 when `gm` runs so, else eager) that eager's own
    output is within, as eager's own imprecision is not kiln's error."""
    eager = eager_outputs(gm, inputs)
    try:
        reference = eager_outputs(gm, inputs, torch.float64)
    except Exception:  # noqa: BLE001 - a graph that fixes its own dtypes may not run widened
        reference = eager
    if len(actual) != len(eager):
        return f"kiln gives {len(actual)} outputs, eager {len(eager)}"
    for i, (got, own, ref) in enumerate(zip(actual, eager, reference)):
        if within(got, ref, rtol, atol) or not within(own, ref, rtol, atol):
            continue
        if not isinstance(got, torch.Tensor) or got.shape != ref.shape:
            return f"output {i}: kiln gives {got!r:.80}, eager {own!r:.80}"
        error = (got.double() - ref.double()).abs().nan_to_num(float("inf"))
        where = tuple(int(k) for k in torch.unravel_index(error.argmax(), error.shape))
        return (f"output {i}: max abs error {error.max().item():.3g} at {where} (kiln {got[where].item():.6g}, "
                f"reference {ref[where].item():.6g}) beyond rtol={rtol}, atol={atol}")
    return None


def random_tensor(size, stride, dtype, device, seed):
    """A tensor of this size, stride, dtype and device with values from `seed`: normal for floating
    dtypes, 0 or 1 for bool, 0..7 for integers."""
    generator = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point or dtype.is_complex:
        values = torch.randn(size, generator=generator).to(dtype)
    else:
        values = torch.randint(0, 2 if dtype == torch.bool else 8, size, generator=generator).to(dtype)
    return torch.empty_strided(size, stride, dtype=dtype, device=device).copy_(values)


CARRIED = (run_with_kiln, eager_outputs, within, accuracy_error, random_tensor)
