"""kiln: a deep-learning compiler for PyTorch.

This module only re-exports the public API; each piece lives in its own layer. The backends for
`torch.compile(model, backend="kiln")` are found by Dynamo through an entry point
(kiln/integrations/dynamo.py), so importing kiln does not import Dynamo.
"""

from kiln import config, logs
from kiln.api import compile, refreeze, reset
from kiln.capture import CaptureError, explain, graph_break, mark_dynamic

__version__ = "0.1.0"

from kiln.deploy import export, load  # noqa: E402  (after __version__, which artifacts record)

__all__ = ["CaptureError", "compile", "config", "debug", "explain", "export", "graph_break", "load", "logs", "mark_dynamic", "quantize",
           "refreeze", "reset", "__version__"]


def __getattr__(name: str):
    # kiln.debug (bisection, the minifier) is imported on first use: a plain `import kiln` does
    # not pay for the debugging tools.
    if name == "debug":
        import kiln.debug

        return kiln.debug
    if name == "quantize":  # kiln.quant defines its operator on import: only for who quantizes
        from kiln.quant import quantize

        return quantize
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")
