"""`kiln autotune`: answer a model's autotune questions ahead of time, into the on-disk cache, so
the first compile in production measures nothing (seed 002's offline autotuning).

    kiln autotune --models bert,gpt2 --threads 1,2 [--mode max-autotune]

Each model is compiled by `kiln.compile` for inference at each thread count (the answer depends
on it) and run once; every GEMM and convolution over a frozen weight asks its question then.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from kiln import config
from kiln.autotune.choose import COUNTS  # the package's `choose` is the function; this is its module's tally


def tune(name: str, threads: int) -> dict[str, Any]:
    import kiln
    from kiln.bench.models import MODELS

    torch.set_num_threads(threads)
    spec = MODELS[name]
    model, inputs = spec.build(False), spec.make_inputs()
    before = dict(COUNTS)
    start = time.perf_counter()
    with torch.no_grad():
        kiln.compile(model)(**inputs)
    kiln.reset()
    return {"model": name, "threads": threads, "seconds": time.perf_counter() - start,
            **{k: COUNTS[k] - before[k] for k in before}}


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from kiln.bench.models import chosen_models

    try:
        names = chosen_models(args.suite, args.models)
        threads = [int(t) for t in args.threads.split(",")]
    except ValueError as error:
        parser.error(str(error))
    config.backend.autotune = args.mode
    print(f"autotune cache: {config.cache_dir() / 'autotune'} · mode {args.mode}")
    print("| model | threads | questions measured | answered from cache | seconds |")
    print("|---|---|---|---|---|")
    for t in threads:
        for name in names:
            r = tune(name, t)
            print(f"| {name} | {t} | {r['measured']} | {r['cached']} | {r['seconds']:.1f} |", flush=True)
    return 0


def add_command(commands: Any) -> None:
    parser = commands.add_parser("autotune", help="measure a model's GEMM and convolution choices ahead of time into the autotune cache")
    parser.add_argument("--suite", default=None, help="a model suite, e.g. hf or smoke")
    parser.add_argument("--models", default="bert", help="comma-separated model names (without --suite)")
    parser.add_argument("--threads", default="1", help="comma-separated torch thread counts, e.g. 1,2")
    parser.add_argument("--mode", default="default", choices=["default", "max-autotune"], help="how long each question is measured (max-autotune: longer budgets, more rounds)")
    parser.set_defaults(handler=main)
