"""A fuzz case as data: its inputs, its statements and its outputs, printable as Python source.

A program is straight-line code over named values: each statement assigns one expression over
earlier names. Casts name the float dtypes through the globals `F32` and `BF16`, so the same code
object runs again with both bound to float64 to give the arbiter's result (`with_float64`).
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field, replace

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int64": torch.int64, "bool": torch.bool}
GLOBALS = {"torch": torch, "F32": torch.float32, "BF16": torch.bfloat16}


@dataclass(frozen=True)
class InputSpec:
    """One input tensor: shape, dtype, memory layout and the seed of its values.

    `layout` is "contiguous", "transposed" (the last two dims swapped from a contiguous tensor) or
    "strided" (every other element of the last dim). Index inputs have values in [low, high)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    layout: str
    seed: int
    low: int | None = None
    high: int | None = None

    def call(self) -> str:
        bounds = f", {self.low}, {self.high}" if self.high is not None else ""
        return f"make_input({self.shape!r}, {self.dtype!r}, {self.layout!r}, {self.seed}{bounds})"


@dataclass(frozen=True)
class Stmt:
    out: str
    expr: str
    uses: tuple[str, ...]


@dataclass
class Program:
    inputs: list[InputSpec]
    stmts: list[Stmt]
    outputs: list[str]
    door: str = "kiln"  # "kiln": kiln.compile; "dynamo": torch.compile(backend="kiln")
    label: str = ""  # "seed S case K"
    notes: dict = field(default_factory=dict)

    def source(self) -> str:
        args = ", ".join(i.name for i in self.inputs)
        body = [f"    {s.out} = {s.expr}" for s in self.stmts]
        ret = ", ".join(self.outputs)
        return "\n".join([f"def fn({args}):", *body, f"    return ({ret},)"]) + "\n"

    def function(self) -> types.FunctionType:
        namespace = dict(GLOBALS)
        exec(compile(self.source(), f"<fuzz {self.label}>", "exec"), namespace)
        return namespace["fn"]

    def make_inputs(self) -> list[torch.Tensor]:
        return [make_input(i.shape, i.dtype, i.layout, i.seed, i.low, i.high) for i in self.inputs]

    def without_dead_code(self) -> "Program":
        live, kept = set(self.outputs), []
        for s in reversed(self.stmts):
            if s.out in live:
                kept.append(s)
                live.update(s.uses)
        return replace(self, inputs=[i for i in self.inputs if i.name in live], stmts=kept[::-1])


def with_float64(fn: types.FunctionType) -> types.FunctionType:
    """`fn` with its casts to float32 and bfloat16 made casts to float64 (the arbiter's run)."""
    namespace = {**fn.__globals__, "F32": torch.float64, "BF16": torch.float64}
    return types.FunctionType(fn.__code__, namespace, fn.__name__)


def upcast(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.is_floating_point() else t


def make_input(shape, dtype, layout, seed, low=None, high=None):
    """A reproducible input tensor; non-contiguous layouts are views of a larger or swapped base."""
    g = torch.Generator().manual_seed(seed)
    full = list(shape)
    if layout == "transposed":
        full[-1], full[-2] = full[-2], full[-1]
    elif layout == "strided":
        full[-1] = 2 * full[-1]
    if dtype == "bool":
        t = torch.rand(full, generator=g) < 0.5
    elif dtype == "int64":
        t = torch.randint(-4 if high is None else low, 5 if high is None else high, full, generator=g)
    else:
        t = torch.randn(full, generator=g).to(getattr(torch, dtype))
    if layout == "transposed":
        t = t.transpose(-1, -2)
    elif layout == "strided":
        t = t[..., ::2]
    return t
