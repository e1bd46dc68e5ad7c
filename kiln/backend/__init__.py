"""The backend: the driver that runs passes, lowering, scheduling, code generation, build and
load in order for one ATen graph (driver.py), and the backends for torch-level graphs that both
doors call (backends.py)."""

from kiln.backend.backends import BACKENDS, kiln, kiln_aot_eager, run_as_is  # noqa: F401
from kiln.backend.driver import Backend, compile_graph, watch  # noqa: F401
