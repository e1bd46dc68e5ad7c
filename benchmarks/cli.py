"""Arguments of `kiln bench` and `kiln report`, checked before any model runs."""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from kiln import config
from benchmarks.llm_modes import DEFAULT_MODELS as LLM_DEFAULT_MODELS, LLM_MODELS, LLM_MODES
from benchmarks.models import MODELS, suites
from benchmarks.modes import MODES
from benchmarks.results import Case, Result

DEFAULT_MODES = "all"
LLM_MODEL_NAMES, LLM_MODE_NAMES = list(LLM_MODELS), list(LLM_MODES)
GEMM_SUITE = "gemm"  # not a suite of models: single GEMMs through each kiln::mm implementation (benchmarks/gemm.py)
LLM_SUITE = "llm"  # text generation of decoder LMs, in this process (benchmarks/llm.py)
# --iters and --warmup when not given: a model suite's calls, or the llm suite's generate calls (each
# one a whole generation: a few rounds are minutes on a 0.5 B model).
LLM_ROUNDS, LLM_WARMUP = 3, 1


def _choices(kind: str, given: list[str], valid: list[str]) -> list[str]:
    unknown = [g for g in given if g not in valid]
    if unknown:
        raise ValueError(f"unknown {kind} {', '.join(map(repr, unknown))}; valid {kind}s: {', '.join(valid)}")
    return given


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def parse_threads(text: str) -> list[int]:
    try:
        threads = [int(t) for t in _split(text)]
    except ValueError:
        threads = []
    if not threads or min(threads) < 1:
        raise ValueError(f"--threads takes positive integers separated by commas, e.g. 1,2 (got {text!r})")
    return threads


def check_writable(flag: str, path: str | None, suffix: str | None = None) -> None:
    """Fail before any model runs if an output could not be written at the end."""
    if path is None:
        return
    target = Path(path)
    if suffix and target.suffix.lower() != suffix:
        raise ValueError(f"{flag} must name a {suffix} file (got {path!r})")
    if target.is_dir():
        raise ValueError(f"{flag} {path!r} is a directory; give a file path")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise ValueError(f"{flag} {path!r}: folder {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise ValueError(f"{flag} {path!r} cannot be written (permission denied)")


def _check_plotting(path: str | None) -> None:
    check_writable("--plot", path, ".png")
    if path and importlib.util.find_spec("matplotlib") is None:
        raise ValueError("--plot needs matplotlib: pip install 'kiln[bench]'")


AUTOCAST = {"bf16": "bfloat16"}  # --autocast value -> torch dtype name
DTYPES = {"fp32": None, "bf16": "bfloat16"}  # --dtype value -> Case.dtype (None: the model as built, float32)
DEVICES = ("cpu", "cuda")


def positive_int(text: str) -> int:
    """argparse's type for counts (--batch, --jobs): its error names the argument and the value."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"takes a positive integer, e.g. 8 (got {text!r})")
    return value


def batch_sizes(text: str) -> tuple[int, ...]:
    """argparse's type for --batch: one size, or with --suite llm several separated by commas."""
    parts = _split(text) or [text]
    for part in parts:
        positive_int(part)  # (its error names the bad part)
    return tuple(int(p) for p in parts)


def one_batch(batch: tuple[int, ...] | int | None) -> int:
    """The single --batch of a model suite (default 1)."""
    if batch is None or isinstance(batch, int):
        return batch or 1
    if len(batch) > 1:
        raise ValueError(f"--batch takes one size here (got {','.join(map(str, batch))}); several only with "
                         f"--suite {LLM_SUITE}")
    return batch[0]


def with_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """--iters and --warmup filled in for the suite the run is (see LLM_ROUNDS)."""
    llm = getattr(args, "suite", None) == LLM_SUITE
    if getattr(args, "iters", None) is None:
        args.iters = LLM_ROUNDS if llm else config.bench.iters
    if getattr(args, "warmup", None) is None:
        args.warmup = LLM_WARMUP if llm else config.bench.warmup
    return args


def check_device(device: str) -> None:
    """Fail before any model runs if the device is not there (each case would fail alike, later)."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")


def select_cases(args: argparse.Namespace) -> list[Case]:
    all_suites = suites()
    if args.models:
        models = _choices("model", _split(args.models), list(MODELS))
    else:
        models = all_suites[_choices("suite", [args.suite], list(all_suites) + [GEMM_SUITE, LLM_SUITE])[0]]
    if args.modes == "all":  # (CUDA graphs' modes only on a GPU: on a CPU they repeat kiln and inductor)
        modes = [m for m in MODES if args.device != "cpu" or not m.endswith("-reduce-overhead")]
    else:
        modes = _choices("mode", _split(args.modes), list(MODES))
    threads = parse_threads(args.threads)
    if args.iters < 1 or args.warmup < 0 or args.timeout <= 0:
        raise ValueError("--iters must be >= 1, --warmup >= 0 and --timeout > 0")
    dtype = DTYPES[args.dtype]
    if args.autocast and dtype:
        raise ValueError(f"--autocast {args.autocast} and --dtype {args.dtype}: choose one (autocast keeps float32 "
                         "weights and computes in bfloat16 where it is safe; --dtype casts the whole model)")
    profile = getattr(args, "profile", False)
    if profile and args.device != "cpu":
        # benchmarks/profile.py times each kernel with the CPU's clock, no synchronize, against the CPU's peak.
        raise ValueError(f"--profile measures kernels on the CPU only; leave it out with --device {args.device}")
    autocast = AUTOCAST[args.autocast] if args.autocast else None
    against = getattr(args, "against", None)
    if against is not None:
        against = _choices("--against mode", [against], [m for m in MODES if m != "eager"])[0]
        why = MODES[against].unavailable_reason(args.train)
        if why:
            raise ValueError(f"--against {against}: {why}")
    return [
        Case(model, mode, t, train=args.train, iters=args.iters, warmup=args.warmup, autocast=autocast,
             profile=profile, device=args.device, against=against if mode not in ("eager", against) else None,
             dtype=dtype, batch=one_batch(args.batch))
        for model in models
        for t in threads
        for mode in modes
    ]


def write_outputs(results: list[Result], meta: dict[str, Any], args: argparse.Namespace, gemm=None, llm=None) -> None:
    from benchmarks import report

    print(report.text_report(results, meta, gemm, llm))
    if any(r.kernel_profile for r in results):
        from benchmarks.profile_report import format_results

        print("\n" + format_results(results, top=25))  # all entries are in the JSON
    if args.json:
        write_whole(args.json, json.dumps(report.json_report(results, meta, gemm, llm), indent=1) + "\n")
    if args.plot and results:
        from benchmarks.plot import plot_speedups

        plot_speedups(results, meta, args.plot)
    elif args.plot:
        print(f"kiln: no plot written to {args.plot}: it draws models' speedups, and this run timed single GEMMs",
              file=sys.stderr)
    if args.markdown:
        plot = os.path.relpath(args.plot, Path(args.markdown).parent) if args.plot and results else None
        write_whole(args.markdown, report.markdown_report(results, meta, plot, gemm, llm))


def _gemm_choices(args: argparse.Namespace) -> tuple[list, list[int], list[str]]:
    """Shapes, thread counts and dtypes of a gemm-suite run; ValueError for what does not apply."""
    from benchmarks.gemm import DTYPES, SHAPES, parse_shapes

    for flag, given in [("--train", args.train), ("--autocast", args.autocast), ("--plot", args.plot),
                        ("--modes", args.modes != DEFAULT_MODES), ("--device", args.device != "cpu"),
                        ("--dtype", args.dtype != "fp32"), ("--batch", args.batch not in (None, (1,))), ("--jobs", args.jobs != 1)]:
        if given:
            raise ValueError(f"{flag} does not apply to --suite {GEMM_SUITE}, which times every kiln::mm implementation "
                             "on single GEMMs")
    if args.iters < 1 or args.warmup < 0:
        raise ValueError("--iters must be >= 1, --warmup >= 0")
    dtypes = _choices("dtype", _split(args.dtypes), list(DTYPES))
    return (parse_shapes(args.shapes) if args.shapes else SHAPES), parse_threads(args.threads), dtypes


def run_gemm(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`kiln bench --suite gemm`: in this process, no subprocess per case (nothing is compiled)."""
    from benchmarks.gemm import run_gemm_suite
    from benchmarks.report import run_metadata

    try:
        shapes, threads, dtypes = _gemm_choices(args)
        check_writable("--json", args.json, ".json")
        check_writable("--markdown", args.markdown, ".md")
    except ValueError as e:
        parser.error(str(e))
    meta = run_metadata(task="single GEMMs through each kiln::mm implementation", suite=GEMM_SUITE, threads=threads,
                        iters=args.iters, warmup=args.warmup, cache="user's", dtypes=dtypes)
    gemm = run_gemm_suite(shapes, threads, dtypes, rounds=args.iters, warmup=args.warmup)
    write_outputs([], meta, args, gemm)
    return 0


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    """Stop the run: its cases killed, the files of those finished kept, exit 143. Further SIGTERMs
    are ignored (`timeout` sends one to the command and one to its process group: a second
    SystemExit in the middle of the first one's unwinding would lose the files)."""
    from benchmarks.runner import stop_running_cases

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stop_running_cases()
    print("kiln bench: stopped (SIGTERM); the cases finished are in the --json and --markdown files", file=sys.stderr)
    raise SystemExit(128 + signum)


def check_folder(flag: str, path: str | None) -> None:
    if path is not None and not Path(path).is_dir():
        raise ValueError(f"{flag} {path!r} is not an existing folder")


def run_bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from benchmarks.report import run_metadata
    from benchmarks.runner import Progress, run_cases, run_in_subprocess

    with_defaults(args)
    try:
        check_device(args.device)
    except ValueError as e:
        parser.error(str(e))
    if args.suite == LLM_SUITE:
        from benchmarks.llm_cli import run_llm

        return run_llm(args, parser)
    for flag, given in [("--prompt-len", args.prompt_len), ("--new-tokens", args.new_tokens), ("--kv-cache", args.kv_cache)]:
        if given is not None:
            parser.error(f"{flag} applies to --suite {LLM_SUITE} only")
    if args.suite == GEMM_SUITE and not args.models:
        return run_gemm(args, parser)
    try:
        cases = select_cases(args)
        check_writable("--json", args.json, ".json")
        check_writable("--markdown", args.markdown, ".md")
        check_folder("--case-logs", args.case_logs)
        _check_plotting(args.plot)
    except ValueError as e:
        parser.error(str(e))
    meta = run_metadata(
        task=("training step" if args.train else "inference") + (f" under {args.autocast} autocast" if args.autocast else ""),
        suite=args.suite if not args.models else "custom",
        threads=parse_threads(args.threads),
        iters=args.iters,
        warmup=args.warmup,
        cache=args.cache,
        timeout_s=args.timeout,
        device=args.device,
        dtype=DTYPES[args.dtype] or "float32",
        batch=one_batch(args.batch),
        jobs=args.jobs,
        keep_freed_mb=config.runtime.keep_freed_mb,  # every case's process runs under it (runner._child_env)
    )
    run_one = functools.partial(run_in_subprocess, log_dir=Path(args.case_logs) if args.case_logs else None)
    previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)  # (a lease's limit: no case may outlive the run)
    try:
        results = run_cases(cases, args.timeout, cold_cache=args.cache == "cold", progress=Progress(len(cases)),
                            run_one=run_one, jobs=args.jobs, on_result=lambda done: save_partial(done, len(cases), meta, args))
    finally:
        if signal.getsignal(signal.SIGTERM) is _stop_on_sigterm:  # (not stopped: SIGTERM as before)
            signal.signal(signal.SIGTERM, previous)
    write_outputs(results, meta, args)
    return 0


def save_partial(results: list[Result], total: int, meta: dict[str, Any], args: argparse.Namespace) -> None:
    """The --json and --markdown files of the cases finished so far, rewritten after each: a run
    stopped from outside (a lease's time limit) leaves what it measured, its cases stopped
    midway included. A run that ends writes them once more, complete."""
    from benchmarks import report

    partial = {**meta, "finished": f"{len(results)} of {total} cases"}
    if args.json:
        write_whole(args.json, json.dumps(report.json_report(results, partial), indent=1) + "\n")
    if args.markdown:
        write_whole(args.markdown, report.markdown_report(results, partial))


def write_whole(path: str, text: str) -> None:
    """Write `path` through a file beside it renamed over it: a reader, or a run killed meanwhile,
    never leaves half a file."""
    temporary = Path(f"{path}.writing")
    temporary.write_text(text)
    os.replace(temporary, path)


def run_report(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from benchmarks.gemm import GemmRun

    try:
        check_writable("--markdown", args.markdown, ".md")
        _check_plotting(args.plot)
    except ValueError as e:
        parser.error(str(e))
    from benchmarks.llm import LlmRun

    try:
        data = json.loads(Path(args.run).read_text())
        results = [Result.from_json(r) for r in data["results"]]
        gemm = GemmRun.from_json(data["gemm"]) if "gemm" in data else None
        llm = LlmRun.from_json(data["llm"]) if "llm" in data else None
    except (OSError, ValueError, KeyError, TypeError) as e:
        parser.error(f"cannot read the run {args.run!r}: {e}")
    args.json = None
    write_outputs(results, data["meta"], args, gemm, llm)
    return 0


def add_bench_command(commands: argparse._SubParsersAction) -> None:
    # A long suite (wide) says how many models it has before naming them.
    suite_names = ", ".join(f"{name} ({f'{len(models)} models: ' if len(models) > 12 else ''}{', '.join(models)})"
                            for name, models in suites().items())
    suite_names += (f", {GEMM_SUITE} (single GEMMs at the hf models' shapes through every kiln::mm implementation), "
                    f"{LLM_SUITE} (text generation of decoder LMs: tokens/s against the memory roofline)")
    modes = "\n".join(f"  {name:22} {mode.help}" for name, mode in MODES.items())
    p = commands.add_parser(
        "bench",
        help="benchmark eager, torch.compile and kiln side by side",
        description="Each (model, mode, threads) case runs in its own subprocess; eager and compiled "
        "calls are interleaved in that process and their medians compared.",
        epilog=f"modes:\n{modes}\n\n--suite {GEMM_SUITE} times each kiln::mm implementation (ATen, MKL, oneDNN, "
        "kiln's own, ...) on single GEMMs, in this process: rounds (--iters) interleaved across implementations "
        "after --warmup calls, medians, GFLOP/s and the fraction of the machine's measured peak.\n\n"
        f"--suite {LLM_SUITE} times greedy generate() with a static KV cache of decoder LMs (--models among "
        f"{', '.join(LLM_MODEL_NAMES)}; default {', '.join(LLM_DEFAULT_MODELS)}), in this process: "
        "prefill and decode tokens/s per --batch (default 1,4), --prompt-len and --new-tokens (default 128 each), "
        "--iters rounds (default 3) interleaved across modes after --warmup generate calls (default 1); "
        "decode time against Inductor-freeze's and the bytes a step reads against the machine's read bandwidth. "
        f"Its modes: {', '.join(LLM_MODE_NAMES)}.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--suite", default="hf", help=f"model suite: {suite_names} (default: hf)")
    p.add_argument("--models", help="comma-separated model names from any suite (overrides --suite); with "
                   f"--suite {LLM_SUITE}, among its models")
    p.add_argument("--modes", default=DEFAULT_MODES, help=f"comma-separated, or all: {', '.join(MODES)} "
                   "(inductor-max-autotune can take many minutes per model on a CPU); "
                   f"--suite {LLM_SUITE}: {', '.join(LLM_MODE_NAMES)}")
    p.add_argument("--device", choices=DEVICES, default="cpu",
                   help="where the models run (default: cpu); on cuda --threads sets only the CPU's share, "
                   "and the float64 accuracy reference still runs on the CPU")
    p.add_argument("--threads", default="1", help="torch thread counts to run, e.g. 1,2 (default: 1)")
    p.add_argument("--iters", type=int, help=f"timed iterations (default: {config.bench.iters}; --suite {LLM_SUITE}: "
                   f"rounds, {LLM_ROUNDS})")
    p.add_argument("--warmup", type=int, help=f"untimed iterations (default: {config.bench.warmup}; --suite {LLM_SUITE}: "
                   f"generate calls per mode, {LLM_WARMUP})")
    p.add_argument("--timeout", type=float, default=config.bench.timeout_s, help="seconds per case (default: %(default)s)")
    p.add_argument("--train", action="store_true", help="time a training step and check gradients")
    p.add_argument("--autocast", choices=list(AUTOCAST),
                   help="run under torch.autocast(DEVICE, dtype=...): inference, or with --train the forward of "
                        "a training step (mixed precision: float32 weights and gradients)")
    p.add_argument("--dtype", choices=list(DTYPES), default="fp32",
                   help="cast the model and its floating inputs to this dtype (default: fp32, as built); the "
                        "error against a float32 eager run is reported beside the accuracy verdict")
    p.add_argument("--batch", type=batch_sizes,
                   help="the models' batch-1 inputs repeated to this batch size (default: 1); "
                   f"--suite {LLM_SUITE}: sequences per generate call, several separated by commas (default: 1,4)")
    p.add_argument("--jobs", type=positive_int, default=1,
                   help="cases run at once, each in its own process (default: 1); on cuda their timings take "
                        "turns on the GPU, while compile times measured side by side are inflated by the "
                        "shared CPU (the report says so)")
    p.add_argument("--cache", choices=["cold", "warm"], default="cold", help="compile caches: fresh per case (cold) or the user's (warm)")
    p.add_argument("--profile", action="store_true",
                   help="also time each kernel and extern of kiln's graphs: a roofline table per case (docs/profile.md)")
    p.add_argument("--against", metavar="MODE",
                   help="also compile each case's model with this peer mode in the case's own process and time "
                        "the two compiled calls interleaved (e.g. inductor-freeze): a ratio immune to the machine's "
                        "drift between processes")
    p.add_argument("--shapes", metavar="MxKxN,...", help=f"--suite {GEMM_SUITE} only: these GEMM shapes instead of the hf models'")
    p.add_argument("--dtypes", default="float32,bfloat16", help=f"--suite {GEMM_SUITE} only: float32, bfloat16 (default: both)")
    p.add_argument("--prompt-len", type=positive_int, help=f"--suite {LLM_SUITE} only: prompt tokens per sequence (default: 128)")
    p.add_argument("--new-tokens", type=positive_int,
                   help=f"--suite {LLM_SUITE} only: tokens generated per sequence, at least 2 (default: 128)")
    p.add_argument("--kv-cache", choices=("static", "dynamic"),
                   help=f"--suite {LLM_SUITE} only: HF's StaticCache (default) or DynamicCache (generate()'s own "
                        "default, which grows by torch.cat: a copy of the cache each token)")
    p.add_argument("--json", metavar="PATH", help="write every result and the run's metadata as JSON")
    p.add_argument("--markdown", metavar="PATH", help="write the tables as markdown")
    p.add_argument("--plot", metavar="PATH.png", help="write a bar chart of speedups")
    p.add_argument("--case-logs", metavar="DIR",
                   help="keep each case's output (tracebacks, warnings) in this folder, one file per case")
    p.set_defaults(handler=run_bench)


def add_report_command(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("report", help="re-render a run saved by kiln bench --json")
    p.add_argument("run", help="the JSON file of a run")
    p.add_argument("--markdown", metavar="PATH")
    p.add_argument("--plot", metavar="PATH.png")
    p.set_defaults(handler=run_report)
