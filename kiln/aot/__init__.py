"""kiln's AOT layer: torch-level graph -> functional core-ATen graphs, forward and backward.

`kiln.aot.compile(gm, example_inputs, compile_graph)` is the entry point (see compile.py).
"""

from kiln.aot.compile import AotOptions, SavingGraphCompiler, compile
from kiln.aot.signature import UnsupportedByAot

__all__ = ["AotOptions", "SavingGraphCompiler", "UnsupportedByAot", "compile"]
