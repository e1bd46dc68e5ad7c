"""kiln's own graph capture: symbolic interpretation of CPython bytecode (see api.py)."""

from kiln.capture.api import CompiledFunction, CompiledModule, compile, reset
from kiln.capture.breaks import BREAKS, BreakRecord, CaptureError
from kiln.capture.dynamic import mark_dynamic
from kiln.capture.explain import ExplainReport, explain

__all__ = ["BREAKS", "BreakRecord", "CaptureError", "CompiledFunction", "CompiledModule", "ExplainReport", "compile", "explain", "mark_dynamic", "reset"]
