"""Size specialization, the runtime half: a graph with symbolic sizes compiled once per set of
concrete sizes (and read input values) it is called with.

The driver hands over `compile_at(args, values)`, which traces the graph again at those sizes
(kiln/passes/specialize_sizes.py) and compiles it through the whole pipeline; later calls with the
same sizes reuse the result. Each specialization is logged (`KILN_LOGS=recompiles`).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from kiln import logs


def _signature(args: Sequence[Any]) -> tuple:
    return tuple((tuple(a.shape), tuple(a.stride()), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)


class SizeSpecialized:
    """`(*args) -> outputs`, compiling on first sight of each new set of argument sizes.

    scalar_inputs: positions of the inputs whose value the graph reads as a number (part of the key).
    symbolic_inputs: positions of the inputs with symbolic sizes (the ones a log line names).
    compile_at: `(args, {position: value}) -> compiled graph` for concrete `args`.
    """

    def __init__(self, scalar_inputs: list[int], symbolic_inputs: list[int],
                 compile_at: Callable[[list, dict[int, Any]], Callable]) -> None:
        self.scalar_inputs, self.symbolic_inputs, self.compile_at = scalar_inputs, symbolic_inputs, compile_at
        self.compiled: dict[tuple, Callable] = {}

    def __call__(self, *args: Any) -> Any:
        values = tuple(args[i].item() for i in self.scalar_inputs)
        key = (_signature(args), values)
        compiled = self.compiled.get(key)
        if compiled is None:
            shown = self.symbolic_inputs or range(len(args))
            sizes = [tuple(args[i].shape) if isinstance(args[i], torch.Tensor) else args[i] for i in shown]
            logs.log("recompiles", "kiln backend: graph with symbolic sizes specialized to %s%s", sizes,
                     f" and input values {values}" if values else "")
            compiled = self.compiled[key] = self.compile_at(list(args), dict(zip(self.scalar_inputs, values)))
        return compiled(*args)
