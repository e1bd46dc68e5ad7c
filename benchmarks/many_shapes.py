"""What serving many input sizes costs: a text model called at batch x sequence shapes in turn.

    kiln many-shapes --models bert,gpt2 [--batches 1,2,4] [--seqs 16,32,64,128] [--symbolic-kernels off]
                     [--mode kiln|kiln-dynamo|inductor|inductor-freeze] [--dynamic auto|on]

For each model (full size, random weights, from the `hf` suite's configs), the model compiled by
`--mode` (a `kiln bench` mode, `kiln.compile(model)` by default) is called once per shape with fresh
`input_ids`, in cold private caches (kiln's and Inductor's): the first call at each shape is timed
(it includes whatever capture, lowering and compiles that shape brings) and its output compared
with eager's. For kiln's modes the graphs kiln's backend builds are counted — a graph with symbolic
sizes compiled once, or (`--symbolic-kernels off`, or where kiln cannot) one graph per size — and
graphs that ran through ATen instead (recorded fallbacks); for the peer, the graphs Dynamo captured.
`--dynamic auto` (the default) compiles as the mode does by default: the first call with static
sizes, dimensions made symbolic as they are seen to change; `--dynamic on` passes `dynamic=True`
(every dimension symbolic from the first call, sizes 0 and 1 still specialized).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import torch

import kiln
from kiln import config
from benchmarks.models import MODELS, chosen_models
from benchmarks.modes import MODES
from kiln.runtime import fallback
from kiln.runtime.specialized import SizeSpecialized


SHAPE_MODES = ("kiln", "kiln-dynamo", "inductor", "inductor-freeze")


def measure(name: str, shapes: list[tuple[int, int]], mode: str = "kiln", dynamic: bool = False) -> dict[str, Any]:
    model = MODELS[name].build(False)
    kiln.reset()
    fallback.reset()
    if mode != "kiln":
        from torch._dynamo.utils import counters

        counters.clear()  # the peer's graph count is per model
    compiled = MODES[mode].compile(model, **({"dynamic": True} if dynamic else {}))
    g = torch.Generator().manual_seed(0)
    rows, worst, total = [], 0.0, 0.0
    with torch.no_grad(), kiln.backend.watch() as built:
        for b, s in shapes:
            ids = torch.randint(0, 1000, (b, s), generator=g)
            before = len(built)
            start = time.perf_counter()
            out = compiled(input_ids=ids)[0]
            seconds = time.perf_counter() - start
            total += seconds
            error = (out - model(input_ids=ids)[0]).abs().max().item()
            worst = max(worst, error)
            graphs = [b for b in built[before:] if not isinstance(b, SizeSpecialized)]
            rows.append((f"{b}x{s}", seconds, len(graphs)))
    captures = len(compiled.kiln_cache.entries) if mode == "kiln" else MODES[mode].stats().get("graphs", 0)
    return {"model": name, "mode": mode + (", dynamic=True" if dynamic else ""), "rows": rows, "seconds": total, "error": worst,
            "graphs": sum(not isinstance(b, SizeSpecialized) for b in built),
            "entries": captures, "fallbacks": len(fallback.FALLBACKS)}


def render(result: dict[str, Any]) -> str:
    lines = [f"{result['model']} ({result['mode']}): {result['seconds']:.1f} s over {len(result['rows'])} shapes; "
             f"{result['entries']} captures, {result['graphs']} kiln backend graphs built, "
             f"{result['fallbacks']} fallbacks; max |kiln - eager| {result['error']:.1e}",
             "  shape    first call (s)  graphs built"]
    lines += [f"  {shape:<8} {seconds:>14.2f}  {graphs:>12}" for shape, seconds, graphs in result["rows"]]
    return "\n".join(lines)


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        names = chosen_models(None, args.models)
    except ValueError as error:
        parser.error(str(error))
    shapes = [(b, s) for b in _ints(args.batches, parser, "--batches") for s in _ints(args.seqs, parser, "--seqs")]
    torch.set_num_threads(args.threads)
    symbolic = args.symbolic_kernels == "on"
    for name in names:
        with tempfile.TemporaryDirectory(prefix="kiln-shapes-") as cold, \
                config.patch({"cache.dir": cold, "backend.symbolic_kernels": symbolic}):
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cold, "inductor")  # the peer's cache cold too
            print(render(measure(name, shapes, args.mode, args.dynamic == "on")), flush=True)
    return 0


def _ints(text: str, parser: argparse.ArgumentParser, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        parser.error(f"{flag} must be comma-separated positive integers, got {text!r}")
    if any(v < 1 for v in values):
        parser.error(f"{flag} must be comma-separated positive integers, got {text!r}")
    return values


def add_command(commands: Any) -> None:
    parser = commands.add_parser("many-shapes", help="first-call time and backend graphs of a text model over many shapes")
    parser.add_argument("--models", default="bert,gpt2", help="comma-separated hf-suite text models taking input_ids")
    parser.add_argument("--batches", default="1,2,4", help="batch sizes (default 1,2,4)")
    parser.add_argument("--seqs", default="16,32,64,128", help="sequence lengths (default 16,32,64,128)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--symbolic-kernels", choices=("on", "off"), default="on",
                        help="compile graphs with symbolic sizes once (on) or per size (off)")
    parser.add_argument("--mode", choices=SHAPE_MODES, default="kiln",
                        help="how the model is compiled (a kiln bench mode; default kiln: kiln.compile)")
    parser.add_argument("--dynamic", choices=("auto", "on"), default="auto",
                        help="auto: sizes made symbolic as they change (the default); on: dynamic=True from the first call")
    parser.set_defaults(handler=main)
