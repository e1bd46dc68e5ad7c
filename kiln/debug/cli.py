"""`kiln bisect FILE.py`: kiln.debug.bisect from the command line.

FILE.py is run as a script and must define `model` (a module or function) and `inputs` (a tuple
of its positional arguments, or one tensor); it may define `kwargs` (a dict of keyword
arguments). The report is printed; the exit status is 0 when every rung matches eager, 1 when
one does not.

Example::

    $ cat repro.py
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.GELU()).eval()
    inputs = (torch.randn(4, 16),)
    $ kiln bisect repro.py --rtol 1e-4
"""

from __future__ import annotations

import argparse
import runpy
from typing import Any

import torch

from kiln.debug.bisect import bisect


def add_command(commands: Any) -> None:
    parser = commands.add_parser("bisect", help="which stage of kiln (capture, AOT, a rewrite pass, a kernel) makes a "
                                 "model's output differ from eager's", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", help="a Python file that defines `model` and `inputs` (and optionally `kwargs`)")
    parser.add_argument("--rtol", type=float, default=1e-3, help="relative tolerance (default 1e-3)")
    parser.add_argument("--atol", type=float, default=1e-3,
                        help="absolute tolerance, times the largest |expected| of each output (default 1e-3)")
    parser.set_defaults(handler=main)


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    script = runpy.run_path(args.file, run_name="__kiln_bisect__")
    missing = [name for name in ("model", "inputs") if name not in script]
    if missing:
        parser.error(f"{args.file} must define `model` and `inputs` (a tuple); it has no {', '.join(missing)}")
    inputs = script["inputs"]
    inputs = inputs if isinstance(inputs, tuple) else (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    result = bisect(script["model"], *inputs, rtol=args.rtol, atol=args.atol, **script.get("kwargs", {}))
    return 0 if result.rung == "none" else 1
