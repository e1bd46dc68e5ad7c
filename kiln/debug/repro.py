"""A failing graph written out as a standalone repro.py: the graph as a torch.nn.Module, its inputs,
the kiln settings it failed under, and the check (kiln/debug/check.py's CARRIED functions, copied).

    path = write_repro(out_dir, gm, inputs, failure, notes, settings, rtol, atol, exact=False)

The inputs, and the graph's constants, are made from their size, stride, dtype and device with
fixed seeds; with `exact=True` (the failure needs the very values) they are saved beside the file,
in repro_inputs.pt, and loaded. The file imports torch and kiln only (and Python's own modules);
`python repro.py` raises as the graph failed (an AssertionError for an accuracy failure) and prints
`ok` once it no longer fails. `load_repro` gives back what the file defines, for checking it in-process.
"""

from __future__ import annotations

import builtins
import inspect
import runpy
import textwrap
import types
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import fx

from kiln.debug.check import CARRIED, Failure

INPUTS_FILE = "repro_inputs.pt"

# Names fx's printed code may use, defined by every repro's preamble.
_PREAMBLE = '''import copy
import os
from math import inf, nan

import torch
import torch.fx._pytree as fx_pytree
import torch.utils._pytree as pytree
from torch import device

import kiln
from kiln import aot
from kiln.backend import Backend

NoneType = type(None)
'''
_DEFINED = {"inf", "nan", "torch", "device", "fx_pytree", "pytree", "NoneType", "copy", "os", "kiln", "aot", "Backend"}

_CARRIED_HEADER = "# The check kiln.debug.minify ran, copied from kiln/debug/check.py.\n\n\n"

_MAIN = '''
def main():
    gm = torch.fx.symbolic_trace(Repro())
    inputs = make_inputs()
    with kiln.config.patch(SETTINGS):
        actual = run_with_kiln(gm, inputs)  # a compile failure raises here
    error = accuracy_error(gm, inputs, actual, RTOL, ATOL)
    if error is not None:
        raise AssertionError(error)
    print("ok")


if __name__ == "__main__":
    main()
'''


def _tensor_spec(tensor: torch.Tensor, seed: int) -> tuple:
    return tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype, str(tensor.device), seed


def _random_call(tensor: torch.Tensor, seed: int) -> str:
    size, stride, dtype, device, seed = _tensor_spec(tensor, seed)
    return f"random_tensor({size}, {stride}, {dtype}, {device!r}, {seed})"


def _constants(gm: fx.GraphModule) -> dict[str, Any]:
    return {n.target: getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"}


def _constant_lines(gm: fx.GraphModule, first_seed: int, exact: bool) -> list[str]:
    lines = []
    for seed, (name, value) in enumerate(_constants(gm).items(), first_seed):
        if not isinstance(value, torch.Tensor):
            lines.append(f"self.{name} = {value!r}")
            continue
        made = f"SAVED['constants'][{name!r}]" if exact else _random_call(value, seed)
        if isinstance(value, torch.nn.Parameter):
            lines.append(f"self.{name} = torch.nn.Parameter({made}, requires_grad=False)")
        else:
            lines.append(f"self.register_buffer({name!r}, {made})")
    return lines


def _import_line(name: str, value: Any) -> str:
    """A line that defines `name` as fx's code uses it: a module, or a function or class by its path."""
    if isinstance(value, types.ModuleType):
        return f"import {value.__name__} as {name}"
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
    if module and qualname and "<" not in qualname and "." not in qualname:
        return f"from {module} import {qualname} as {name}"
    raise NotImplementedError(f"kiln.debug.minify: the repro cannot define {name} = {value!r}, which the graph's code uses")


def _module_source(gm: fx.GraphModule, exact: bool, first_seed: int) -> tuple[list[str], str]:
    """(import lines, the Repro class) for `gm`."""
    code = gm.graph.python_code(root_module="self")
    imports = [_import_line(name, value) for name, value in code.globals.items()
               if name not in _DEFINED and getattr(builtins, name, None) is not value]
    init = ["super().__init__()", *_constant_lines(gm, first_seed, exact)]
    body = textwrap.indent("def __init__(self):\n" + textwrap.indent("\n".join(init), "    ") + "\n\n"
                           + code.src.strip() + "\n", "    ")
    return imports, "class Repro(torch.nn.Module):\n" + body


def _inputs_source(inputs: Sequence[Any], exact: bool) -> str:
    if exact:
        made = "SAVED['inputs']"
    else:
        made = "[\n" + "".join(f"        {_random_call(x, seed)},\n" for seed, x in enumerate(inputs)) + "    ]"
    return f"def make_inputs():\n    return {made}\n"


def write_repro(out_dir: str | Path, gm: fx.GraphModule, inputs: Sequence[Any], failure: Failure, notes: str,
                settings: dict[str, Any], rtol: float, atol: float, exact: bool) -> Path:
    """Write `out_dir`/repro.py (and, when `exact`, repro_inputs.pt) for `gm` failing on `inputs`.

    `notes`: lines for the docstring (how this graph fails, node counts). Every input must be a
    tensor (a cut-out graph's are).

    Example::

        write_repro("/tmp/repro", small_gm, small_inputs, failure, "3 op nodes", {}, 1e-3, 1e-3, exact=False)
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    saved = out / INPUTS_FILE
    if exact:
        torch.save({"inputs": list(inputs), "constants": _constants(gm)}, saved)
    elif saved.exists():
        saved.unlink()  # a stale one from an earlier run would mislead the reader
    imports, module = _module_source(gm, exact, first_seed=len(inputs))
    values = ("the exact values, saved beside this file in repro_inputs.pt" if exact
              else "random, from fixed seeds (their values do not matter to the failure)")
    docstring = (f'"""kiln minifier repro: {failure.kind} failure of kiln\'s backend.\n\n'
                 f"Failed in the graph given: {failure.message}\n{notes}\nInputs and constants: {values}.\n"
                 f"Settings: {settings or 'kiln defaults'}.\n\n"
                 f"`python repro.py` raises while the failure remains and prints `ok` once it is gone.\n"
                 f"Written by kiln.debug.minify.\n" + '"""\n\n')
    saved_line = (f"SAVED = torch.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), {INPUTS_FILE!r}), "
                  "weights_only=True)\n" if exact else "")
    carried = "\n\n".join(inspect.getsource(function) for function in CARRIED)
    text = (docstring + _PREAMBLE + "".join(line + "\n" for line in imports)
            + f"\nSETTINGS = {settings!r}\nRTOL, ATOL = {rtol!r}, {atol!r}\n{saved_line}\n\n"
            + module + "\n\n" + _inputs_source(inputs, exact) + "\n\n" + _CARRIED_HEADER + carried + "\n\n" + _MAIN)
    path = out / "repro.py"
    path.write_text(text)
    return path


def load_repro(path: str | Path) -> tuple[fx.GraphModule, list, dict[str, Any]]:
    """(the graph, its inputs, its settings) as the repro at `path` builds them, without running it.

    Example::

        gm, inputs, settings = load_repro("repro/repro.py")
    """
    namespace = runpy.run_path(str(path))
    return fx.symbolic_trace(namespace["Repro"]()), namespace["make_inputs"](), namespace["SETTINGS"]
