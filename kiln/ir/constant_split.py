"""A graph with frozen inputs, cut in two, as the passes hand it to the runtime:

    constants graph:  (*frozen inputs) -> (*constants)          run once, and again on change
    runtime graph:    (*other inputs, *constants) -> outputs    compiled, run on every call

kiln/passes/constant_split.py makes it; kiln/runtime/frozen.py runs the constants graph and keeps
its results valid.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import fx


@dataclass
class ConstantSplit:
    constants: fx.GraphModule  # (*frozen inputs) -> tuple of constants
    runtime: fx.GraphModule  # (*other inputs, *constants) -> the original outputs
    frozen_positions: list[int]  # positions of the frozen inputs among the original inputs
    runtime_positions: list[int]  # positions of the other inputs
    computed: list[bool]  # per constant: not a view of a frozen input (it holds memory of its own)
