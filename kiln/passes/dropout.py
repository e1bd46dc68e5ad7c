"""Training-mode dropout computed inside kernels from a counter-based generator.

    native_dropout(x, p, True)  ->  philox_dropout(x, seeds[i], p),   seeds = randint(0, 2^62, [n])

ATen's dropout draws a mask from the global generator in a kernel of its own and writes it out;
`kiln::philox_dropout` (kiln/externs/dropout.py) is a pure function of one random seed, and lowers
to loops that fuse with the ops around them. The graph's n dropouts take their seeds from one draw
per call from the same global generator (so `torch.manual_seed` still decides the masks). Both
results stay what native_dropout's were: the scaled output and the mask, which the backward graph
reads (the same mask forward and backward).
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
    calls = [node for node in gm.graph.nodes if _training_dropout(node)]
    if not calls:
        return False
    # One draw of every call's seed (one launch on a GPU, not one per dropout: 25 in a 12-layer
    # BERT's training forward there), before the first call; each call reads its own.
    val = calls[0].args[0].meta["val"]
    with gm.graph.inserting_before(calls[0]):  # (a factory call: its fake value from x's fake mode)
        seeds = gm.graph.call_function(aten.randint.low, (0, SEED_RANGE, [len(calls)]),
                                       {"dtype": torch.int64, "device": val.device})
    with val.fake_mode:
        seeds.meta["val"] = aten.randint.low(0, SEED_RANGE, [len(calls)], dtype=torch.int64, device=val.device)
    for number, node in enumerate(calls):
        x, p = node.args[0], node.args[1]
        seed = insert(gm, node, aten.select.int, seeds, 0, number)
        replacement = insert(gm, node, torch.ops.kiln.philox_dropout.default, x, seed, float(p))
        node.replace_all_uses_with(replacement)
        gm.graph.erase_node(node)
    return True


def _training_dropout(node: fx.Node) -> bool:
    """A training-mode dropout of a floating-point tensor with 0 < p < 1: what is rewritten."""
    if node.op != "call_function" or node.target is not aten.native_dropout.default:
        return False
    x, p = node.args[0], node.args[1]
    train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train")
    val = x.meta.get("val") if isinstance(x, fx.Node) else None
    return train is True and isinstance(val, torch.Tensor) and val.is_floating_point() and 0 < p < 1
