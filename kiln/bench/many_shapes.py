"""What serving many input sizes costs: a text model called at batch x sequence shapes in turn.

    kiln many-shapes --models bert,gpt2 [--batches 1,2,4] [--seqs 16,32,64,128] [--symbolic-kernels off]

For each model (full size, random weights, from the `hf` suite's configs), `kiln.compile(model)`
is called once per shape with fresh `input_ids`, in a cold private cache: the first call at each
shape is timed (it includes whatever capture, lowering and C++ compiles that shape brings), its
output compared with eager's, and the graphs kiln's backend builds are counted — a graph with
symbolic sizes compiled once, or (`--symbolic-kernels off`, or where kiln cannot) one graph per
size. Graphs that ran through ATen instead (recorded fallbacks) are counted too.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import torch

import kiln
from kiln import config
from kiln.bench.models import MODELS, chosen_models
from kiln.runtime import fallback
from kiln.runtime.specialized import SizeSpecialized


def measure(name: str, shapes: list[tuple[int, int]]) -> dict[str, Any]:
    model = MODELS[name].build(False)
    kiln.reset()
    fallback.reset()
    compiled = kiln.compile(model)
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
    return {"model": name, "rows": rows, "seconds": total, "error": worst,
            "graphs": sum(not isinstance(b, SizeSpecialized) for b in built),
            "entries": len(compiled.kiln_cache.entries), "fallbacks": len(fallback.FALLBACKS)}


def render(result: dict[str, Any]) -> str:
    lines = [f"{result['model']}: {result['seconds']:.1f} s over {len(result['rows'])} shapes; "
             f"{result['entries']} captures, {result['graphs']} backend graphs built, "
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
            print(render(measure(name, shapes)), flush=True)
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
    parser.set_defaults(handler=main)
