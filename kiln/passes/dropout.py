"""Training-mode dropout computed inside kernels from a counter-based generator.

    native_dropout(x, p, True)  ->  philox_dropout(x, randint(0, 2^62, []), p)

ATen's dropout draws a mask from the global generator in a kernel of its own and writes it out;
`kiln::philox_dropout` (kiln/externs/dropout.py) is a pure function of one random seed, drawn per
call from the same global generator (so `torch.manual_seed` still decides the masks), and lowers
to loops that fuse with the ops around them. Both results stay what native_dropout's were: the
scaled output and the mask, which the backward graph reads (the same mask forward and backward).
"""

from __future__ import annotations

import torch
from torch import fx

import kiln.externs.dropout  # noqa: F401  (defines kiln::philox_dropout)
from kiln.ir.target import Target
from kiln.passes.pattern import insert

aten = torch.ops.aten

SEED_RANGE = 1 << 62  # seeds below this: non-negative int64, as kiln/ir/philox.py takes them


def dropout(gm: fx.GraphModule, target: Target) -> bool:
    changed = False
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not aten.native_dropout.default:
            continue
        x, p = node.args[0], node.args[1]
        train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train")
        val = x.meta.get("val") if isinstance(x, fx.Node) else None
        if train is not True or not isinstance(val, torch.Tensor) or not val.is_floating_point() or not 0 < p < 1:
            continue
        with gm.graph.inserting_before(node):  # (a factory call: its fake value from x's fake mode)
            seed = gm.graph.call_function(aten.randint.low, (0, SEED_RANGE, []), {"dtype": torch.int64, "device": val.device})
        with val.fake_mode:
            seed.meta["val"] = aten.randint.low(0, SEED_RANGE, [], dtype=torch.int64, device=val.device)
        replacement = insert(gm, node, torch.ops.kiln.philox_dropout.default, x, seed, float(p))
        node.replace_all_uses_with(replacement)
        gm.graph.erase_node(node)
        changed = True
    return changed
