"""The backend's debug output under KILN_DEBUG_DIR, one folder per compiled graph: the ATen graph,
the IR before fusion (one node per realized buffer, externs between), the IR after fusion (kernels
and their members), the C++ source and the generated Python wrapper."""

from __future__ import annotations

from typing import Any

from torch import fx

from kiln import logs
from kiln.ir.analysis import format_node
from kiln.lowering.graph import ComputeStep


def _ir_before(program: Any) -> str:
    lines = [f"inputs: {[b.name if b is not None else None for b in program.inputs]}"]
    for step in program.steps:
        if isinstance(step, ComputeStep):
            lines.append(format_node(step.node).replace(step.node.name or "", step.buffer.name, 1))
        else:
            outs = [b.name if b is not None else None for b in step.outputs]
            lines.append(f"{outs} = extern {step.op}")
    lines.append(f"outputs: {[getattr(o, 'name', o) for o in program.outputs]}")
    return "\n".join(lines) + "\n"


def _ir_after(compiled: Any) -> str:
    lines = [compiled.report(), ""]
    for kernel in compiled.schedule.kernels:
        lines.append(f"{kernel.name} -> {compiled.functions[kernel.name]}: outer loops {list(kernel.outer)}, "
                     f"reads {[b.name for b in kernel.inputs]}, stores {[b.name for b in kernel.outputs]}, "
                     f"in registers {sorted(kernel.locals)}")
        for m in kernel.members:
            lines.append("  " + format_node(m.node).replace("\n", "\n  "))
    return "\n".join(lines) + "\n"


def dump(gm: fx.GraphModule, compiled: Any) -> None:
    """Write one graph's backend stages, when KILN_DEBUG_DIR is set."""
    folder = logs.dump_folder("kiln_backend")
    if folder is None:
        return
    folder.write("aten_graph.py", "# ATen graph given to kiln's backend\n" + gm.print_readable(print_output=False))
    folder.write("ir_before_fusion.txt", _ir_before(compiled.program))
    folder.write("ir_after_fusion.txt", _ir_after(compiled))
    folder.write("kernels.cpp", compiled.source)
    folder.write("wrapper.py", compiled.python)
