"""kiln's own graph capture: symbolic interpretation of CPython bytecode (see api.py)."""

from kiln.capture.api import CompiledFunction, CompiledModule, capture, reset
from kiln.capture.break_records import BREAKS, BreakRecord, CaptureError
from kiln.capture.dynamic import mark_dynamic
from kiln.capture.explain import ExplainReport, explain

__all__ = ["BREAKS", "BreakRecord", "CaptureError", "CompiledFunction", "CompiledModule", "ExplainReport", "capture", "explain", "mark_dynamic", "reset"]
