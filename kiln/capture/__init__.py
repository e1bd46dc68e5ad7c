"""kiln's own graph capture: symbolic interpretation of CPython bytecode (see api.py)."""

from kiln.capture.api import CompiledModule, capture, reset
from kiln.capture.break_records import BREAKS, BreakRecord, CaptureError
from kiln.capture.dynamic import mark_dynamic
from kiln.capture.explain import ExplainReport, explain
from kiln.capture.markers import graph_break

__all__ = ["BREAKS", "BreakRecord", "CaptureError", "CompiledModule", "ExplainReport", "capture", "explain", "graph_break", "mark_dynamic", "reset"]
