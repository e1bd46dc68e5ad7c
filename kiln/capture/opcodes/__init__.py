"""Opcode handlers: one function per opcode, named after it, registered for the Python versions
it serves. `HANDLERS` maps the running interpreter's opcode names to their handlers.

Adding Python 3.13: register the new opcodes (and the changed ones) with `versions=(3, 13)` in
the module of their family; handlers that keep their meaning list 3.13 among their versions.
"""

from kiln.capture.opcodes import stack, names, calls, arithmetic, build, control, exception_handling, matching  # noqa: F401 - registration
from kiln.capture.opcodes.registry import HANDLERS, opcode

__all__ = ["HANDLERS", "opcode"]
