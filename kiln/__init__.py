"""kiln: a deep-learning compiler for PyTorch.

This module only re-exports the public API; each piece lives in its own layer.
"""

from kiln import config, logs
from kiln.capture import CaptureError, compile, explain, mark_dynamic, reset
from kiln.integrations import dynamo as _dynamo

__version__ = "0.1.0"

__all__ = ["CaptureError", "compile", "config", "explain", "logs", "mark_dynamic", "reset", "__version__"]

_dynamo.register()
