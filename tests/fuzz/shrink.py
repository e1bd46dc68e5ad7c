"""Shrink a failing case and write it as a standalone repro file.

Shrinking keeps a candidate only if it still fails the same way (`_same`), in this order:
regenerate the case with smaller dimensions (the same seed draws the same ops, over sizes of at
most 2 or 4); keep one failing output (dead statements go with the others); cut statements one by
one, each replaced by a fresh input of its shape and dtype (so what remains is well typed by
construction); make every input contiguous. A check costs a compile, so the budget is counted.
"""

from __future__ import annotations

import inspect
import tempfile
import textwrap
from dataclasses import replace
from pathlib import Path

import torch

from tests.fuzz import check as check_mod
from tests.fuzz.check import Outcome, check, judge
from tests.fuzz.generate import generate
from tests.fuzz.worker import SIGNAL_KIND, isolated_check
from tests.fuzz.program import GLOBALS, InputSpec, Program, make_input

BUDGET = 80  # checks, i.e. compiles, per failure


def _same(a: Outcome, b: Outcome) -> bool:
    if a.status != b.status:
        return False
    if a.status == "fallback":
        return a.fallbacks[:1] and b.fallbacks[:1] and a.fallbacks[0][:40] == b.fallbacks[0][:40]
    return a.kind == b.kind


class Shrinker:
    def __init__(self, prog: Program, outcome: Outcome, seed: int, case: int, budget: int = BUDGET,
                 cache_dir: str | None = None) -> None:
        self.best, self.outcome, self.budget = prog, outcome, budget
        self.cache_dir = cache_dir
        self.seed, self.case = seed, case
        self.tries = 0

    def accept(self, cand: Program) -> bool:
        if self.tries >= self.budget:
            return False
        self.tries += 1
        if self.outcome.kind == SIGNAL_KIND:  # the case kills its process: check it in a child
            got = isolated_check(cand, self.cache_dir or tempfile.mkdtemp(prefix="kiln-fuzz-cache-"))
        else:
            got = check(cand)
        if _same(got, self.outcome):
            self.best, self.outcome = cand, got
            return True
        return False

    def run(self) -> Program:
        for max_dim in (2, 4):
            cand = generate(self.seed, self.case, max_dim)
            if len(cand.stmts) <= len(self.best.stmts) and self.accept(cand):
                break
        if len(self.best.outputs) > 1:
            for i in self.outcome.failing or range(len(self.best.outputs)):
                if i < len(self.best.outputs):
                    if self.accept(replace(self.best, outputs=[self.best.outputs[i]]).without_dead_code()):
                        break
        progress = True
        while progress and self.tries < self.budget:
            progress = False
            for stmt in list(self.best.stmts):
                if stmt not in self.best.stmts or len(self.best.stmts) <= 1:
                    continue
                cand = _cut(self.best, stmt)
                if cand is not None and self.accept(cand):
                    progress = True
        for spec in self.best.inputs:
            if spec.layout != "contiguous":
                inputs = [replace(i, layout="contiguous") if i is spec else i for i in self.best.inputs]
                self.accept(replace(self.best, inputs=inputs))
        return self.best


def _cut(prog: Program, stmt) -> Program | None:
    """`prog` with `stmt`'s value made a new input of the same shape and dtype (values alike in range);
    an output is dropped instead, since returning an input tests nothing."""
    if stmt.out in prog.outputs:
        if len(prog.outputs) == 1:
            return None
        return replace(prog, outputs=[o for o in prog.outputs if o != stmt.out]).without_dead_code()
    values = eager_values(prog)
    t = values[stmt.out]
    dtype = str(t.dtype).removeprefix("torch.")
    low = high = None
    if dtype == "int64" and t.numel():
        low, high = int(t.min()), int(t.max()) + 1
    spec = InputSpec(f"c{stmt.out[1:]}", tuple(t.shape), dtype, "contiguous", hash(stmt.expr) & 0xFFFFFFF, low, high)
    stmts = [s for s in prog.stmts if s is not stmt]
    renamed = [replace(s, expr=_rename(s.expr, stmt.out, spec.name),
                       uses=tuple(spec.name if u == stmt.out else u for u in s.uses)) for s in stmts]
    outputs = [spec.name if o == stmt.out else o for o in prog.outputs]
    return replace(prog, inputs=prog.inputs + [spec], stmts=renamed, outputs=outputs).without_dead_code()


def _rename(expr: str, old: str, new: str) -> str:
    import re
    return re.sub(rf"\b{old}\b", new, expr)


def eager_values(prog: Program) -> dict:
    env = {i.name: t for i, t in zip(prog.inputs, prog.make_inputs())}
    for s in prog.stmts:
        env[s.out] = eval(s.expr, GLOBALS, env)
    return env


def write_repro(prog: Program, outcome: Outcome, out_dir: Path, name: str, original: Program | None = None) -> Path:
    """A standalone file that reruns `prog` through kiln and asserts the tolerance rule."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.py"
    inputs = prog.make_inputs()
    _, floor = check_mod.arbiter(prog, inputs)
    compiled = 'torch.compile(fn, backend="kiln")' if prog.door == "dynamo" else "kiln.compile(fn)"
    shrunk = f" (shrunk from {len(original.stmts)} statements)" if original is not None else ""
    detail = textwrap.indent(outcome.detail.strip() or "\n".join(outcome.fallbacks), "    ")
    detail = detail.replace('"' * 3, "'" * 3).replace("\\", "/")  # safe inside the docstring
    make_inputs = ",\n        ".join(i.call() for i in prog.inputs)
    text = f'''"""Fuzz repro: {prog.label}, {len(prog.stmts)} statements{shrunk}; found by `python -m tests.fuzz`.

{outcome.status} ({outcome.kind or "; ".join(outcome.fallbacks)[:200]}):
{detail}

Run `python {path.name}`: it raises while the bug is there and prints "ok" once fixed.
"""

import types

import torch

import kiln
from kiln.runtime.fallback import FALLBACKS

F32, BF16 = torch.float32, torch.bfloat16
EAGER_FACTOR = {check_mod.EAGER_FACTOR}


{inspect.getsource(make_input)}

{inspect.getsource(judge)}

{prog.source()}

def main():
    inputs = [
        {make_inputs},
    ]
    expected = fn(*inputs)
    fn64 = types.FunctionType(fn.__code__, {{**globals(), "F32": torch.float64, "BF16": torch.float64}})
    truth = fn64(*[t.double() if t.is_floating_point() else t for t in inputs])
    floors = {[float(f"{floor[o]:.4g}") for o in prog.outputs]!r}  # errors allowed whatever eager's (tests/fuzz/check.py)
    actual = {compiled}(*inputs)
    assert not FALLBACKS, f"kiln ran a graph eagerly: {{FALLBACKS[0]}}\\n{{FALLBACKS[0].detail}}"
    for i, (a, e, t, f) in enumerate(zip(actual, expected, truth, floors)):
        why = judge(a, e, t, f)
        assert why is None, f"output {{i}}: {{why}}"
    print("ok")


if __name__ == "__main__":
    main()
'''
    path.write_text(text)
    return path


def shrink_and_write(prog: Program, outcome: Outcome, seed: int, case: int, out_dir: Path,
                     cache_dir: str | None = None) -> tuple[Path, Program]:
    # A check in a child process costs a few seconds more: a smaller budget for cases that crash one.
    budget = 30 if outcome.kind == SIGNAL_KIND else BUDGET
    shrinker = Shrinker(prog, outcome, seed, case, budget, cache_dir=cache_dir)
    small = shrinker.run()
    kind = "fallback_" if outcome.status == "fallback" else ""
    return write_repro(small, shrinker.outcome, out_dir, f"repro_{kind}{seed}_{case}", prog), small


__all__ = ["Shrinker", "shrink_and_write", "write_repro", "torch"]
