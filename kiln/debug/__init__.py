"""Tools for finding what went wrong in a compiled model; they sit above every stage and may call
any of them (the backend, the AOT layer, capture), never the other way round.

- `bisect` (kiln/debug/bisect.py): which rung of the ladder eager → capture → AOT → backend, which
  rewrite pass and which kernel moves a model's output beyond tolerance.
- `minify` (kiln/debug/minify.py): shrinks a failing captured graph to the smallest one that fails
  the same way and writes a standalone repro.py.
- the HTML compile report (kiln/debug/trace.py, `KILN_TRACE=dir`).
"""

from kiln.debug.minify import MinifyResult, captured_graphs, minify, minify_model  # noqa: F401
