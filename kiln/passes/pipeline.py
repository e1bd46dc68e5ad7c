"""The one ordered list of graph passes kiln's backend runs before lowering.

Each pass takes an ATen `fx.GraphModule` whose nodes carry `meta["val"]` and returns one
(rewriting a copy is not required: passes edit the graph they are given and recompile it).
`KILN_LOGS=passes` prints the graph after each pass that changed it.
"""

from __future__ import annotations

from typing import Callable

from torch import fx

from kiln import logs
from kiln.passes.attention import attention
from kiln.passes.bias_epilogue import bias_epilogue
from kiln.passes.conv_batchnorm import conv_batchnorm
from kiln.passes.conv_prepack import conv_prepack
from kiln.passes.gemm_prepack import gemm_prepack
from kiln.passes.redundant_casts import redundant_casts
from kiln.passes.scatter_accumulate import scatter_accumulate

Pass = Callable[[fx.GraphModule], bool]  # edits the graph; True when it changed something

# Passes over frozen weights (conv_batchnorm, conv_prepack, gemm_prepack) do nothing in graphs
# without frozen inputs (training, or freezing off).
PASSES: list[tuple[str, Pass]] = [
    ("redundant_casts", redundant_casts),
    ("attention", attention),
    ("conv_batchnorm", conv_batchnorm),
    ("conv_prepack", conv_prepack),
    ("bias_epilogue", bias_epilogue),
    ("gemm_prepack", gemm_prepack),
    ("scatter_accumulate", scatter_accumulate),
]


def run_passes(gm: fx.GraphModule) -> fx.GraphModule:
    for name, graph_pass in PASSES:
        if graph_pass(gm):
            gm.recompile()
            logs.log_lazy("passes", lambda: f"after {name}:\n{gm.code}")
    return gm
