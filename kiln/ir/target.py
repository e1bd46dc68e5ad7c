"""What the backend compiles a graph for, as the stages before code generation need to know it.

The driver (kiln/backend/driver.py) makes one `Target` per graph, from the graph's device and the
code generator chosen for it, and hands it to every pass: a pass that rewrites an op into a form
only some code generators fuse well asks the target instead of importing a later stage.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    device: str  # "cpu"; the device type of the graph's tensors
    codegen: str  # the code generator that prints the graph's kernels: "cpp"
    loop_ops: frozenset  # ATen ops the lowering turns into loop IR (every other op is an extern call)
