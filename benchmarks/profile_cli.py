"""`kiln profile`: where the time of kiln's compiled call goes, per kernel and extern, for models
of the benchmark's suites.

    kiln profile --suite hf --models BertModel --threads 2
    kiln profile --models resnet50 --mode kiln,kiln-dynamo --top 15 --json bert-profile.json

Each (model, mode, threads) runs as a `kiln bench --profile` case does: in its own subprocess with
a fresh compile cache (so every graph is compiled and its kernels' FLOPs are known), checked
against eager and timed, then profiled (benchmarks/profile.py). The tables are printed per case.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kiln import config
from benchmarks.cli import _choices, _split, check_writable, parse_threads
from benchmarks.models import MODELS, suites
from benchmarks.results import Case

KILN_MODES = ("kiln", "kiln-dynamo")


def select_cases(args: argparse.Namespace) -> list[Case]:
    if args.models:
        models = _choices("model", _split(args.models), list(MODELS))
    else:
        all_suites = suites()
        models = all_suites[_choices("suite", [args.suite], list(all_suites))[0]]
    modes = _choices("mode", _split(args.mode), list(KILN_MODES))
    if args.iters < 1 or args.warmup < 0 or args.timeout <= 0:
        raise ValueError("--iters must be >= 1, --warmup >= 0 and --timeout > 0")
    return [Case(model, mode, t, iters=args.iters, warmup=args.warmup, profile=True)
            for model in models for t in parse_threads(args.threads) for mode in modes]


def run_profile(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from benchmarks import report
    from benchmarks.profile_report import format_results
    from benchmarks.runner import Progress, run_cases

    try:
        cases = select_cases(args)
        check_writable("--json", args.json, ".json")
    except ValueError as e:
        parser.error(str(e))
    results = run_cases(cases, args.timeout, cold_cache=args.cache == "cold", progress=Progress(len(cases)))
    for r in results:
        if r.status != "ok" or not r.kernel_profile:
            print(f"== {r.case.label}: no profile ({r.status}{': ' + r.error if r.error else ''})")
    print(format_results(results, args.top))
    if args.json:
        meta = report.run_metadata(task="inference, profiled", suite=args.suite if not args.models else "custom",
                                   threads=parse_threads(args.threads), iters=args.iters, warmup=args.warmup,
                                   cache=args.cache, timeout_s=args.timeout,
                                   keep_freed_mb=config.runtime.keep_freed_mb)
        Path(args.json).write_text(json.dumps(report.json_report(results, meta), indent=1) + "\n")
    return 0 if all(r.status == "ok" and r.kernel_profile for r in results) else 1


def add_command(commands: argparse._SubParsersAction) -> None:
    suite_names = ", ".join(f"{name} ({', '.join(models)})" for name, models in suites().items())
    p = commands.add_parser(
        "profile",
        help="time each kernel and extern of kiln's compiled graphs: a roofline table per model",
        description="Per compiled graph: each kernel's and extern's time per call, FLOPs, bytes, GFLOP/s, GB/s "
        "and the fraction of the machine's peak it reached (docs/profile.md).",
    )
    p.add_argument("--suite", default="hf", help=f"model suite: {suite_names} (default: hf)")
    p.add_argument("--models", help="comma-separated model names from any suite (overrides --suite)")
    p.add_argument("--mode", default="kiln-dynamo", help=f"comma-separated: {', '.join(KILN_MODES)} (default: %(default)s)")
    p.add_argument("--threads", default="1", help="torch thread counts, e.g. 1,2 (default: 1)")
    p.add_argument("--iters", type=int, default=config.bench.iters, help="timed calls (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=config.bench.warmup, help="untimed calls first (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=config.bench.timeout_s, help="seconds per case (default: %(default)s)")
    p.add_argument("--cache", choices=["cold", "warm"], default="cold",
                   help="compile caches: fresh per case (cold, the default: every kernel's FLOPs known) or the user's")
    p.add_argument("--top", type=int, help="show only the slowest N entries of each graph")
    p.add_argument("--json", metavar="PATH", help="write the results with their profiles as JSON")
    p.set_defaults(handler=run_profile)
