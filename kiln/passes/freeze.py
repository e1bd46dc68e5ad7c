"""Freezing, step one: the module state the AOT layer found becomes the graph's frozen inputs.

The AOT layer marks the placeholders that hold unmutated parameters and buffers of the user's
module (`MODULE_STATE`, kiln/ir/graph_meta.py). With `backend.freezing` on (the default), this pass
marks them frozen (`FROZEN`, kiln/passes/constants.py): the passes after it may fold them
(conv_batchnorm) and prepack them (conv_prepack, gemm_prepack), and `split_constants` cuts what
they alone decide into a constants graph that the runtime runs once and re-runs when a frozen
input changes (kiln/runtime/frozen.py).
"""

from __future__ import annotations

from torch import fx

from kiln import config
from kiln.ir.graph_meta import MODULE_STATE
from kiln.ir.target import Target
from kiln.passes.constants import FROZEN


def freeze(gm: fx.GraphModule, target: Target) -> bool:
    if not config.backend.freezing:
        return False
    marked = False
    for node in gm.graph.nodes:
        if node.op == "placeholder" and node.meta.get(MODULE_STATE):
            node.meta[FROZEN] = marked = True
    return marked
