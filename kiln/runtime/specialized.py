"""Size specialization, the runtime half: a graph with symbolic sizes compiled once per set of
concrete sizes (and read input values) it is called with.

The driver hands over `compile_at(args, values)`, which traces the graph again at those sizes
(kiln/passes/specialize_sizes.py) and compiles it through the whole pipeline; later calls with the
same sizes reuse the result. Each specialization is logged (`KILN_LOGS=recompiles`).

Specializations are bounded by `capture.recompile_limit` (KILN_RECOMPILE_LIMIT), the same limit
kiln's capture keeps per function: a caller that brings ever-new sizes would otherwise compile
and load one more library per call, for as long as the process lives (loaded libraries are never
unloaded). Beyond the limit, sizes not seen before run the graph through ATen, op by op (`eager`),
recorded once as a fallback (kiln/runtime/fallback.py) and told once as a warning.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence

import torch

from kiln import config, logs
from kiln.runtime.fallback import record_fallback


def _signature(args: Sequence[Any]) -> tuple:
    return tuple((tuple(a.shape), tuple(a.stride()), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)


class SpecializationLimit(RuntimeError):
    """Recorded (not raised) when a graph meets more sets of sizes than the limit."""


class SizeSpecialized:
    """`(*args) -> outputs`, compiling on first sight of each new set of argument sizes.

    scalar_inputs: positions of the inputs whose value the graph reads as a number (part of the key).
    symbolic_inputs: positions of the inputs with symbolic sizes (the ones a log line names).
    compile_at: `(args, {position: value}) -> compiled graph` for concrete `args`.
    eager: `(*args) -> outputs` without compiling (the ATen graph itself), for sizes beyond the
    limit; None keeps compiling every new size.
    """

    def __init__(self, scalar_inputs: list[int], symbolic_inputs: list[int],
                 compile_at: Callable[[list, dict[int, Any]], Callable], eager: Callable | None = None) -> None:
        self.scalar_inputs, self.symbolic_inputs, self.compile_at = scalar_inputs, symbolic_inputs, compile_at
        self.eager = eager
        self.compiled: dict[tuple, Callable] = {}
        self.eager_calls = 0
        self.limit_hit = False

    def __call__(self, *args: Any) -> Any:
        values = tuple(args[i].item() for i in self.scalar_inputs)
        key = (_signature(args), values)
        compiled = self.compiled.get(key)
        if compiled is None:
            shown = self.symbolic_inputs or range(len(args))
            sizes = [tuple(args[i].shape) if isinstance(args[i], torch.Tensor) else args[i] for i in shown]
            if self.eager is not None and len(self.compiled) >= config.capture.recompile_limit:
                return self._beyond_limit(sizes, args)
            logs.log("recompiles", "kiln backend: graph with symbolic sizes specialized to %s%s", sizes,
                     f" and input values {values}" if values else "")
            compiled = self.compiled[key] = self.compile_at(list(args), dict(zip(self.scalar_inputs, values)))
        return compiled(*args)

    def _beyond_limit(self, sizes: list, args: tuple) -> Any:
        if not self.limit_hit:
            self.limit_hit = True
            limit = config.capture.recompile_limit
            reason = (f"compiled for {limit} sets of sizes, the recompile limit (KILN_RECOMPILE_LIMIT); "
                      f"sizes seen after that, such as {sizes}, run through ATen op by op")
            record_fallback("kiln", "graph with symbolic sizes", SpecializationLimit(reason), tell=False)
            # Told even with logs off, as capture's limit is: these calls have lost kiln's speed-up.
            warnings.warn(f"kiln: a graph with symbolic sizes was {reason}. Raise KILN_RECOMPILE_LIMIT "
                          f"if the sizes are few but more than {limit}.", RuntimeWarning, stacklevel=3)
        self.eager_calls += 1
        return self.eager(*args)
