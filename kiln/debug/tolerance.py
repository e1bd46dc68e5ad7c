"""When two results are the same within tolerance, and by how much they differ: the one rule
kiln.debug.bisect applies to a model's outputs and to each kernel's.

Every tensor is compared element by element. A floating-point element is within tolerance when

    |actual - expected| <= atol * scale + rtol * |expected|

where `scale` is the largest |expected| of that tensor (1 when it is all zeros): `atol` is
relative to the tensor's magnitude, so logits in the hundreds and probabilities below one are
held to the same number of significant digits. NaN matches NaN and an infinity the same
infinity. Integer and boolean tensors must be equal; so must sizes, dtypes and any non-tensor
output (a Python number, None).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree


@dataclass(frozen=True)
class Tolerance:
    rtol: float = 1e-3
    atol: float = 1e-3


@dataclass(frozen=True)
class Difference:
    """How far `actual` is from `expected`: `error` is the largest absolute difference, `ratio`
    that difference over what the tolerance allows there (within tolerance when at most 1), and
    `where` names the output (or buffer) it is in, with a note for mismatched sizes or dtypes."""

    error: float = 0.0
    ratio: float = 0.0
    where: str = ""

    @property
    def ok(self) -> bool:
        return self.ratio <= 1.0

    def __str__(self) -> str:
        if self.ratio == 0.0:
            return "0 (identical)"
        allowed = "inf" if math.isinf(self.ratio) else f"{self.ratio:.3g}"
        return f"{self.error:.3g} ({allowed} x tolerance) at {self.where}"


def _plain(value: Any, depth: int = 0) -> Any:
    """`value` with every mapping a dict and every sequence a tuple: a transformers ModelOutput
    (a mapping pytree may not know) flattens by its keys, and an object holding tensors (a
    transformers KV cache: its layers' keys and values) by its attributes, a few levels deep,
    so it is compared by what it holds, not by identity."""
    if isinstance(value, Mapping):
        return {key: _plain(item, depth) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return tuple(_plain(item, depth) for item in value)
    if depth < _OBJECT_DEPTH and _is_state_object(value):
        name = type(value).__name__
        return {f"{name}.{key}": _plain(item, depth + 1) for key, item in sorted(vars(value).items())}
    return value


_OBJECT_DEPTH = 4


def _is_state_object(value: Any) -> bool:
    """A plain object whose attributes are its result (not a tensor, function, class or module)."""
    return (hasattr(value, "__dict__") and not isinstance(value, (torch.Tensor, torch.nn.Module, type))
            and not callable(value) and type(value).__module__ != "builtins")


def output_leaves(value: Any) -> list[tuple[str, Any]]:
    """Every leaf of a (nested) output with its path, e.g. `[("[0]", t), ("['logits']", t2)]`
    (the path of an output that is one tensor is "")."""
    paths, _ = pytree.tree_flatten_with_path(_plain(value))
    return [(pytree.keystr(path), leaf) for path, leaf in paths]


def _tensor_difference(expected: torch.Tensor, actual: torch.Tensor, tolerance: Tolerance, where: str) -> Difference:
    if expected.shape != actual.shape or expected.dtype != actual.dtype:
        note = f"{where}: expected {expected.dtype}{list(expected.shape)}, got {actual.dtype}{list(actual.shape)}"
        return Difference(math.inf, math.inf, note)
    if expected.numel() == 0:
        return Difference()
    expected, actual = expected.detach().cpu(), actual.detach().cpu()
    if not (expected.is_floating_point() or expected.is_complex()):
        error = (expected.long() - actual.long()).abs().max().item() if expected.dtype != torch.bool \
            else float((expected != actual).any())
        return Difference(float(error), math.inf if error else 0.0, where)
    if expected.is_complex():  # real and imaginary parts compared as a trailing dim of two
        expected, actual = torch.view_as_real(expected), torch.view_as_real(actual)
    e, a = expected.double(), actual.double()
    same = (e == a) | (e.isnan() & a.isnan())  # equal infinities and NaNs
    diff = torch.where(same, torch.zeros_like(e), (a - e).abs().nan_to_num(math.inf))
    finite = e[e.isfinite()].abs()
    scale = finite.max().item() if finite.numel() and finite.max().item() > 0 else 1.0
    allowed = tolerance.atol * scale + tolerance.rtol * e.abs().nan_to_num(0.0, posinf=0.0, neginf=0.0)
    ratios = torch.where(diff == 0, torch.zeros_like(diff), diff / allowed)  # (0 / 0 where atol is 0)
    worst = int(ratios.argmax())
    index = list(torch.unravel_index(torch.tensor(worst), e.shape)) if e.dim() else []
    at = f"{where}{[int(i) for i in index]}" if index else where
    return Difference(diff.max().item(), ratios.reshape(-1)[worst].item(), at)  # (a strided output: no view)


def compare(expected: Any, actual: Any, tolerance: Tolerance = Tolerance(), name: str = "output") -> Difference:
    """The largest difference between two outputs of any nesting, by the module's rule; a
    difference in structure (another number of outputs, another type) is infinite.

    Example::

        compare(model(x), compiled(x)).ok  # True when every output is within tolerance
    """
    expected_leaves, actual_leaves = output_leaves(expected), output_leaves(actual)
    if [p for p, _ in expected_leaves] != [p for p, _ in actual_leaves]:
        return Difference(math.inf, math.inf, f"{name}: the outputs' structure differs from eager's")
    worst = Difference()
    for (path, e), (_, a) in zip(expected_leaves, actual_leaves):
        where = f"{name}{path}"
        if isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor):
            found = _tensor_difference(e, a, tolerance, where)
        elif isinstance(e, torch.Tensor) or isinstance(a, torch.Tensor) or e != a:
            found = Difference(math.inf, math.inf, f"{where}: expected {e!r}, got {a!r}")
        else:
            found = Difference()
        if found.ratio > worst.ratio:
            worst = found
    return worst
