"""Random well-typed programs, one per (seed, case index).

The value model is the values themselves: the generator runs every statement eagerly as it
proposes it (in the case's dtypes and, for the arbiter, in float64) and keeps it only if eager
accepts it and its result is finite and small; so shapes, dtypes and legality are read off real
tensors, and a case never holds a statement that eager rejects.

Integer and bool results are compared exactly, so they may only be computed from *exact* float
values: inputs and what exact ops (views, indexing, abs, max, where, ...) make of them. A float
computed with rounding (a sum, an exp) never feeds a comparison, an argmax or a cast to an
integer, where kiln's legitimately different rounding would flip a discrete result.
"""

from __future__ import annotations

import math
import random
import warnings
from dataclasses import dataclass

import torch

from tests.fuzz.ops import OPS
from tests.fuzz.program import GLOBALS, InputSpec, Program, Stmt, make_input, upcast

MAX_NUMEL = 6000
DYNAMO_SHARE = 0.125  # of the cases go through torch.compile(backend="kiln")
LAYOUTS = ("contiguous",) * 6 + ("transposed", "strided")
FLOAT64 = {**GLOBALS, "F32": torch.float64, "BF16": torch.float64}


@dataclass
class Val:
    name: str
    t: torch.Tensor  # eager, in the case's dtypes
    t64: torch.Tensor  # the arbiter's run
    exact: bool  # a float computed without rounding (always True for ints and bools)
    leaf: bool = False  # of a size that depends on data (x[mask]): an output only, never an operand

    @property
    def is_float(self) -> bool:
        return self.t.is_floating_point()

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.t.shape)


class Generator:
    """Builds one Program; op functions (ops.py) call its helpers to choose operands."""

    def __init__(self, seed: int, case: int, max_dim: int = 8) -> None:
        self.rng = random.Random(f"kiln-fuzz/{seed}/{case}")
        self.seed, self.case, self.max_dim = seed, case, max_dim
        self.inputs: list[InputSpec] = []
        self.stmts: list[Stmt] = []
        self.vals: list[Val] = []
        self.counts: dict[str, int] = {}

    # -- shapes and inputs -------------------------------------------------------------------
    def size(self) -> int:
        r = self.rng.random()
        if r < 0.05:
            return 0
        if r < 0.25:
            return 1
        if r < 0.3 and self.max_dim >= 8:
            return self.rng.choice([17, 33, 64])
        return self.rng.randint(2, max(2, self.max_dim))

    def shape(self, rank: int | None = None) -> tuple[int, ...]:
        rank = self.rng.choice([0, 1, 1, 2, 2, 2, 3, 3, 4]) if rank is None else rank
        shape = [self.size() for _ in range(rank)]
        while math.prod(shape) > MAX_NUMEL // 4:  # room for the ops to grow it
            shape[shape.index(max(shape))] //= 2
        return tuple(shape)

    def partner_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts against `shape`."""
        out = [1 if self.rng.random() < 0.3 else s for s in shape]
        if out and self.rng.random() < 0.2:
            out = out[self.rng.randint(1, len(out)):]
        elif self.rng.random() < 0.1:
            out = [self.rng.choice([1, 2])] + out
        return tuple(out)

    def new_input(self, shape, dtype: str, low: int | None = None, high: int | None = None, layout=None) -> Val:
        shape = tuple(shape)
        if layout is None:
            layout = self.rng.choice(LAYOUTS) if high is None else "contiguous"
        if layout == "transposed" and len(shape) < 2 or layout == "strided" and not shape:
            layout = "contiguous"
        spec = InputSpec(f"x{len(self.inputs)}", shape, dtype, layout, self.rng.randrange(1 << 30), low, high)
        t = make_input(spec.shape, spec.dtype, spec.layout, spec.seed, low, high)
        self.inputs.append(spec)
        val = Val(spec.name, t, upcast(t), True)
        self.vals.append(val)
        return val

    def index(self, shape, bound: int, negative: bool = False) -> Val:
        """An int64 index input with values in [0, bound) (or [-bound, bound))."""
        return self.new_input(shape, "int64", -bound if negative else 0, max(bound, 1))

    # -- choosing operands --------------------------------------------------------------------
    def pick(self, ok=lambda v: True) -> Val | None:
        """A value satisfying `ok`, most often one of the latest (so chains grow deep)."""
        cands = [v for v in self.vals if not v.leaf and ok(v)]
        if not cands:
            return None
        if self.rng.random() < 0.6:
            return cands[-1 - min(len(cands) - 1, int(self.rng.expovariate(1.0)))]
        return self.rng.choice(cands)

    def float_val(self) -> Val | None:
        return self.pick(lambda v: v.is_float)

    def exact_val(self) -> Val | None:
        return self.pick(lambda v: v.exact)

    def partner(self, x: Val, dtype: str | None = None) -> Val:
        """A second operand broadcasting against x: an earlier value or a new input."""
        def fits(v):
            try:
                return v is not x and torch.broadcast_shapes(v.shape, x.shape) == x.shape
            except RuntimeError:
                return False
        if dtype is None and self.rng.random() < 0.5:
            found = self.pick(fits)
            if found is not None:
                return found
        if dtype is None:
            dtype = dtype_name(x.t) if self.rng.random() < 0.75 else self.rng.choice(list(_DTYPE_NAMES.values()))
        return self.new_input(self.partner_shape(x.shape), dtype)

    def dim(self, v: Val) -> int:
        n = max(v.t.dim(), 1)
        return self.rng.randrange(-n, n)

    def dims(self, v: Val):
        """None (every dim), one dim, or a tuple of distinct dims."""
        n = v.t.dim()
        r = self.rng.random()
        if r < 0.15 or n == 0:
            return None
        if r < 0.75 or n == 1:
            return self.dim(v)
        return tuple(sorted(self.rng.sample(range(n), self.rng.randint(2, n))))

    # -- statements ---------------------------------------------------------------------------
    def try_stmt(self, expr: str, uses: list[Val], keeps_exact: bool) -> Val | None:
        """Run `expr` eagerly; keep it as a statement if eager accepts it and it is well behaved."""
        env = {v.name: v.t for v in uses}
        env64 = {v.name: v.t64 for v in uses}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t = eval(expr, GLOBALS, env)
                t64 = eval(expr, FLOAT64, env64)
        except Exception:
            return None
        if not isinstance(t, torch.Tensor) or not isinstance(t64, torch.Tensor) or t.shape != t64.shape:
            return None
        if t.numel() > MAX_NUMEL or t.dtype not in _DTYPE_NAMES:
            return None
        if t.is_floating_point():
            if not (torch.isfinite(t).all() and torch.isfinite(t64).all()):
                return None
            exact = keeps_exact and all(u.exact for u in uses) and torch.equal(t.double(), t64)
        else:
            if not torch.equal(t, t64):  # a discrete result the arbiter disagrees with: not exact after all
                return None
            exact = True
        val = Val(f"v{len(self.stmts)}", t, t64, exact)
        self.stmts.append(Stmt(val.name, expr, tuple(u.name for u in uses)))
        self.vals.append(val)
        return val

    def step(self) -> bool:
        """Add one random op; False if the chosen op could not be applied (inputs it made are undone)."""
        name, fn, _, _ = self.rng.choices(OPS, weights=[w for _, _, w, _ in OPS])[0]
        n_inputs, n_vals = len(self.inputs), len(self.vals)
        try:
            made = fn(self)
        except (IndexError, ValueError):  # an op meeting a shape it has no choice for (an empty range)
            made = None
        if made is None:
            del self.inputs[n_inputs:]
            del self.vals[n_vals:]
            return False
        self.counts[name] = self.counts.get(name, 0) + 1
        return True

    def program(self) -> Program:
        for _ in range(self.rng.randint(1, 3)):
            self.new_input(self.shape(), self.rng.choice(["float32"] * 4 + ["bfloat16", "int64", "bool"]))
        target = self.rng.randint(4, 12)
        for _ in range(target * 6):
            if len(self.stmts) >= target:
                break
            self.step()
        used = {u for s in self.stmts for u in s.uses}
        outputs = [s.out for s in self.stmts if s.out not in used] or [self.stmts[-1].out]
        door = "dynamo" if self.rng.random() < DYNAMO_SHARE else "kiln"
        prog = Program(self.inputs, self.stmts, outputs, door, f"seed {self.seed} case {self.case}",
                       {"ops": dict(self.counts)})
        return prog.without_dead_code()


_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.int64: "int64", torch.bool: "bool"}


def dtype_name(t: torch.Tensor) -> str:
    return _DTYPE_NAMES[t.dtype]


def generate(seed: int, case: int, max_dim: int = 8) -> Program:
    """The program of case `case` under `seed`: the same pair always gives the same program."""
    gen = Generator(seed, case, max_dim)
    while True:
        prog = gen.program()
        if prog.stmts:
            return prog
        gen = Generator(seed, case + 1_000_000_007 * (len(gen.inputs) + 1), max_dim)  # vanishingly rare

