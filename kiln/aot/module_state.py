"""Which inputs of an inference graph hold a module's state: its parameters and buffers.

For kiln's own capture they are the graph module's lifted parameters and buffers; behind Dynamo,
the inputs Dynamo took from a module (nn.Parameter objects, and tensors Dynamo marked as a
module's static inputs). An input the graph mutates is not marked. The AOT layer only states the
fact (`MODULE_STATE` on the placeholder); whether the backend treats those inputs as constants is
freezing's decision (kiln/passes/freeze.py), and keeping them valid is the runtime's
(kiln/runtime/frozen.py).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import fx

from kiln.aot.signature import Signature
from kiln.ir.graph_meta import MODULE_STATE


def _module_state(value: Any) -> bool:
    # Dynamo tags the parameters and buffers of modules it inlines; reading the tag is all.
    return isinstance(value, torch.nn.Parameter) or getattr(value, "_dynamo_static_input_type", None) is not None


def module_state_positions(num_lifted: int, example_inputs: Sequence[Any], sig: Signature) -> list[int]:
    """Positions among the graph's flat inputs (lifted state first) of unmutated module state."""
    positions = [*range(num_lifted), *(num_lifted + i for i, v in enumerate(example_inputs) if _module_state(v))]
    mutated = set(sig.mutated_inputs)
    return [p for p in positions if p not in mutated]


def mark_module_state(gm: fx.GraphModule, positions: list[int]) -> None:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for p in positions:
        if isinstance(placeholders[p].meta.get("val"), torch.Tensor):
            placeholders[p].meta[MODULE_STATE] = True
