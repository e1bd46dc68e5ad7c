"""Tools for finding what went wrong in a compiled model; they sit above every stage and may call
any of them (the backend, the AOT layer, capture), never the other way round.

- `bisect` (kiln/debug/bisect.py): which rung of the ladder eager → capture → AOT → backend, which
  rewrite pass and which kernel moves a model's output beyond tolerance.
- `minify` (kiln/debug/minify.py): shrinks a failing captured graph to the smallest one that fails
  the same way and writes a standalone repro.py.

The HTML compile report (`KILN_TRACE=dir`) is recorded below every stage, in kiln/trace/.
"""

from kiln.debug.bisect import BisectResult, bisect
from kiln.debug.minify import MinifyResult, captured_graphs, minify, minify_model

__all__ = ["BisectResult", "MinifyResult", "bisect", "captured_graphs", "minify", "minify_model"]
