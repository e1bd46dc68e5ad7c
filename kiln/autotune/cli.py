"""`kiln autotune`: answer a workload's autotune questions ahead of time, into the on-disk cache, so
the first compile in production measures nothing (seed 002's offline autotuning).

    kiln autotune WORKLOAD [ARG ...] [--threads 1,2] [--mode max-autotune]
    kiln autotune --answer LOG [--mode max-autotune]

`--answer LOG` measures the questions a run under `KILN_AUTOTUNE=record` logged instead of
measuring them (kiln/autotune/record.py), each at the thread count it was asked at, into the same
cache; the workload is then not needed.

WORKLOAD names a function that returns the models to tune: `package.module:function`, or
`path/to/file.py:function` (`:workload` when the function is left out). It is called with the
ARGs (strings) and returns `(name, model, inputs)` triples, `inputs` a dict of keyword arguments
or a tuple of positional ones. Each model is compiled by `kiln.compile` for inference at each
thread count (the answer depends on it) and run once; every GEMM and convolution over a frozen
weight asks its question then. The repository's benchmark models are one such workload:
`kiln autotune benchmarks.models:workload bert gpt2`.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from kiln import config
from kiln.autotune.choose import COUNTS  # the package's `choose` is the function; this is its module's tally


def load_workload(spec: str) -> Callable[..., Iterable[tuple[str, Any, Any]]]:
    """The function `spec` names (see the module's docstring); ValueError saying what is wrong."""
    where, _, name = spec.rpartition(":") if ":" in spec else (spec, ":", "workload")
    name = name or "workload"
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise ValueError(f"workload file {where!r} does not exist")
        module_spec = importlib.util.spec_from_file_location(f"kiln_workload_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as error:
            raise ValueError(f"workload module {where!r} cannot be imported ({error})") from error
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"workload {spec!r}: {where} has no function {name!r}")
    return function


def tune(name: str, model: Any, inputs: Any, threads: int) -> dict[str, Any]:
    import kiln

    torch.set_num_threads(threads)
    before = dict(COUNTS)
    start = time.perf_counter()
    with torch.no_grad():
        fast = kiln.compile(model)
        fast(**inputs) if isinstance(inputs, dict) else fast(*inputs)
    kiln.reset()
    return {"model": name, "threads": threads, "seconds": time.perf_counter() - start,
            **{k: COUNTS[k] - before[k] for k in before}}


def answer(path: str, mode: str = "default") -> list[dict[str, Any]]:
    """Ask each question of a record log again, measured (or read where answered since); per
    question: its op, threads, choice and whether it was measured now."""
    from kiln.autotune.attention import choose_attention
    from kiln.autotune.gemm import choose_conv, choose_mm
    from kiln.autotune.record import recorded, tensor

    def ask(q: dict[str, Any]) -> str:
        if q["op"] == "mm":
            unary, scalars, algorithm = q["post_op"]
            return choose_mm(tensor(q["a"]), tensor(q["b"]), tensor(q["bias"]), mode, (unary, scalars, algorithm),
                             q.get("weights_from_dram", False))
        if q["op"] == "conv":
            stride, padding, dilation, groups = q["conv_args"]
            return choose_conv(tensor(q["x"]), q["x_channels_last"], tensor(q["w"]), tensor(q["bias"]),
                               (stride, padding, dilation, groups), q["unary"], q["scalars"], q["algorithm"],
                               tensor(q["other"]), mode, channels_last_only=q["channels_last_only"])
        return choose_attention(tensor(q["q"]), tensor(q["k"]), tensor(q["v"]), tensor(q["mask"]), q["scale"], q["causal"], mode)

    rows = []
    before = torch.get_num_threads()
    try:
        with config.patch({"backend.autotune": mode}):
            for q in recorded(path):
                torch.set_num_threads(q["threads"])
                measured = COUNTS["measured"]
                choice = ask(q)
                rows.append({"op": q["op"], "threads": q["threads"], "choice": choice,
                             "measured": COUNTS["measured"] > measured})
    finally:
        torch.set_num_threads(before)
    return rows


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.answer is not None:
        if args.workload is not None:
            parser.error("give a workload or --answer LOG, not both")
        try:
            rows = answer(args.answer, args.mode)
        except (OSError, ValueError) as error:
            parser.error(f"--answer {args.answer}: {error}")
        print(f"autotune cache: {config.cache_dir() / 'autotune'} · mode {args.mode} · {len(rows)} questions")
        print("| op | threads | choice | measured now |")
        print("|---|---|---|---|")
        for row in rows:
            print(f"| {row['op']} | {row['threads']} | {row['choice']} | {'yes' if row['measured'] else 'no (answered)'} |")
        return 0
    if args.workload is None:
        parser.error("give a workload (module:function) or --answer LOG")
    try:
        workload = load_workload(args.workload)
        threads = [int(t) for t in args.threads.split(",")]
        models = list(workload(*args.args))
    except ValueError as error:
        parser.error(str(error))
    print(f"autotune cache: {config.cache_dir() / 'autotune'} · mode {args.mode}")
    print("| model | threads | questions measured | answered from cache | seconds |")
    print("|---|---|---|---|---|")
    before = torch.get_num_threads()
    try:
        with config.patch({"backend.autotune": args.mode}):
            for t in threads:
                for name, model, inputs in models:
                    r = tune(name, model, inputs, t)
                    print(f"| {name} | {t} | {r['measured']} | {r['cached']} | {r['seconds']:.1f} |", flush=True)
    finally:
        torch.set_num_threads(before)  # (a command's setting, not left behind when called from Python)
    return 0


def add_command(commands: Any) -> None:
    parser = commands.add_parser("autotune", help="measure a workload's GEMM and convolution choices ahead of time into the autotune cache")
    parser.add_argument("workload", nargs="?", help="module:function or file.py:function returning (name, model, inputs) triples")
    parser.add_argument("args", nargs="*", help="strings passed to the workload function")
    parser.add_argument("--threads", default="1", help="comma-separated torch thread counts, e.g. 1,2")
    parser.add_argument("--mode", default="default", choices=["default", "max-autotune"], help="how long each question is measured (max-autotune: longer budgets, more rounds)")
    parser.add_argument("--answer", metavar="LOG", help="measure the questions a KILN_AUTOTUNE=record run logged (no workload)")
    parser.set_defaults(handler=main)
