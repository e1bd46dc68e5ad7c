"""Which inputs of an inference graph the backend may treat as constants: parameters and buffers.

For kiln's own capture they are the graph module's lifted parameters and buffers; behind Dynamo,
the inputs Dynamo took from a module (nn.Parameter objects, and tensors Dynamo marked as a
module's static inputs). An input the graph mutates is never frozen. The backend checks, on each
call, that the frozen inputs are the same objects at the same version, and freezes them again if
not (kiln/runtime/frozen.py): a weight changed after compiling gives the new result.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import fx

from kiln import config
from kiln.aot.signature import Signature
from kiln.passes.constants import FROZEN


def _module_state(value: Any) -> bool:
    # Dynamo tags the parameters and buffers of modules it inlines; reading the tag is all.
    return isinstance(value, torch.nn.Parameter) or getattr(value, "_dynamo_static_input_type", None) is not None


def frozen_positions(num_lifted: int, example_inputs: Sequence[Any], sig: Signature) -> list[int]:
    """Positions among the graph's flat inputs (lifted state first) to freeze."""
    if not config.backend.freezing:
        return []
    positions = [*range(num_lifted), *(num_lifted + i for i, v in enumerate(example_inputs) if _module_state(v))]
    mutated = set(sig.mutated_inputs)
    return [p for p in positions if p not in mutated]


def mark_frozen(gm: fx.GraphModule, positions: list[int]) -> None:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for p in positions:
        if isinstance(placeholders[p].meta.get("val"), torch.Tensor):
            placeholders[p].meta[FROZEN] = True
