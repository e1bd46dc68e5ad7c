"""The driver's debug output under KILN_DEBUG_DIR, one folder per graph the backend compiles,
files numbered in the order the stages ran: the ATen graph given to the backend, the graph after
each pass (the file and its header name the pass), the constants and runtime graphs of freezing's
split, the IR before fusion (one node per realized buffer, externs between), the IR after fusion
(kernels and their members), the C++ source and the generated Python wrapper."""

from __future__ import annotations

from typing import Any

from torch import fx

from kiln.ir.analysis import format_node
from kiln.ir.constant_split import ConstantSplit
from kiln.ir.program import ComputeStep, Program
from kiln import trace
from kiln.logs import DumpFolder


def _graph(gm: fx.GraphModule, header: str) -> str:
    return f"# {header}\n" + gm.print_readable(print_output=False)


def aten_graph(folder: DumpFolder | None, gm: fx.GraphModule) -> None:
    if folder is not None:
        folder.write("aten_graph.py", _graph(gm, "ATen graph given to kiln's backend"))


def after_pass(folder: DumpFolder | None, name: str, gm: fx.GraphModule, changed: bool) -> None:
    if folder is not None:
        header = f"after pass {name}" + ("" if changed else " (no change)")
        folder.write(f"pass_{name}.py", _graph(gm, header))


def constant_split(folder: DumpFolder | None, split: ConstantSplit) -> None:
    if folder is not None:
        folder.write("pass_split_constants.constants.py", _graph(split.constants, "after pass split_constants: the constants graph, run once per set of frozen inputs"))
        folder.write("pass_split_constants.runtime.py", _graph(split.runtime, "after pass split_constants: the runtime graph, compiled"))


def ir_before_fusion(folder: DumpFolder | None, program: Program) -> None:
    if folder is None:
        return
    lines = [f"inputs: {[b.name if b is not None else None for b in program.inputs]}"]
    for step in program.steps:
        if isinstance(step, ComputeStep):
            lines.append(format_node(step.node).replace(step.node.name or "", step.buffer.name, 1))
        else:
            outs = [b.name if b is not None else None for b in step.outputs]
            lines.append(f"{outs} = extern {step.op}")
    lines.append(f"outputs: {[getattr(o, 'name', o) for o in program.outputs]}")
    folder.write("ir_before_fusion.txt", "\n".join(lines) + "\n")


def ir_after_fusion(folder: DumpFolder | None, schedule: Any, functions: dict[str, str], report: str) -> None:
    if folder is None:
        return
    lines = [report, ""]
    for kernel in schedule.kernels:
        lines.append(f"{kernel.name} -> {functions[kernel.name]}: {_loop_nest(kernel, '  ')}")
    folder.write("ir_after_fusion.txt", "\n".join(lines) + "\n")


def _loop_nest(kernel: Any, indent: str) -> str:
    """A fused kernel's loops, what it reads, stores and keeps in registers, then its members."""
    head = (f"outer loops {list(kernel.outer)}, reads {[b.name for b in kernel.inputs]}, "
            f"stores {[b.name for b in kernel.outputs]}, in registers {sorted(kernel.locals)}")
    return "\n".join([head, *(indent + format_node(m.node).replace("\n", "\n" + indent) for m in kernel.members)])


def code(folder: DumpFolder | None, kernels_file: str, kernels_source: str, wrapper_source: str,
         cpp_wrapper_source: str | None = None) -> None:
    """`kernels_file`: the code generator's name for its kernels' file (kiln/backend/codegens.py)."""
    if folder is not None:
        folder.write(kernels_file, kernels_source)
        folder.write("wrapper.py", wrapper_source)
        if cpp_wrapper_source is not None:  # the wrapper that runs; wrapper.py its readable twin
            folder.write("wrapper.cpp", cpp_wrapper_source)


def traced_kernels(folder: DumpFolder | None, schedule: Any, kernels: Any, codegen: Any) -> None:
    """Each kernel of the graph for the compile report (KILN_TRACE): its loop nest (the members
    as the IR after fusion shows them) beside its code (`Codegen.kernel_source`)."""
    if not trace.active():
        return
    listed = []
    for kernel in schedule.kernels:
        listed.append({"kernel": kernel.name, "function": kernels.functions[kernel.name],
                       "vectorized": bool(kernels.vectorized.get(kernel.name)), "loops": _loop_nest(kernel, "  "),
                       "code": codegen.kernel_source(kernels, kernel.name)})
    trace.record("kernels", folder=str(folder.path) if folder is not None else None, codegen=codegen.name, kernels=listed)
