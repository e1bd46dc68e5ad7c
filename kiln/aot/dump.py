"""The AOT layer's debug output: readable ATen graphs under KILN_DEBUG_DIR, and the `aot` log."""

from __future__ import annotations

from typing import Any

from torch import fx

from kiln import logs
from kiln.aot.signature import Signature


def _readable(title: str, gm: fx.GraphModule) -> str:
    header = f"# {title}, written by kiln.aot\n"
    return header + gm.print_readable(print_output=False, include_stride=True, include_device=True)


def inference(label: str, graph: fx.GraphModule, sig: Signature) -> None:
    logs.log_lazy("aot", lambda: _readable(f"{label}: ATen inference graph", graph))
    folder = logs.dump_folder(label)
    if folder is not None:
        folder.write("aot_signature.txt", sig.describe() + "\n")
        folder.write("aten_inference.py", _readable("ATen inference graph", graph))


def training(label: str, joint: fx.GraphModule, split: Any, sig: Signature) -> None:
    logs.log_lazy("aot", lambda: f"{label}: partition\n{split.summary()}")
    logs.log_lazy("aot", lambda: _readable(f"{label}: ATen forward graph", split.forward))
    logs.log_lazy("aot", lambda: _readable(f"{label}: ATen backward graph", split.backward))
    folder = logs.dump_folder(label)
    if folder is not None:
        folder.write("aot_signature.txt", sig.describe() + "\n")
        folder.write("aten_joint.py", _readable("ATen joint forward+backward graph", joint))
        folder.write("aten_forward.py", _readable("ATen forward graph (after partition)", split.forward))
        folder.write("aten_backward.py", _readable("ATen backward graph (after partition)", split.backward))
        folder.write("partition.txt", split.summary() + "\n")
