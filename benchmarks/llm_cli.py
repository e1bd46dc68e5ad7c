"""`kiln bench --suite llm`: its arguments checked before any model is built, the run, its outputs."""

from __future__ import annotations

import argparse
import json
from typing import Any

from benchmarks.cli import (DEFAULT_MODES, LLM_SUITE, _choices, _split, check_writable, parse_threads, write_outputs,
                            write_whole)
from benchmarks.llm import LlmRun, LlmSettings
from benchmarks.llm_modes import DEFAULT_MODELS, LLM_MODELS, LLM_MODES

DEFAULT_BATCHES = (1, 4)
DEFAULT_PROMPT_LEN = DEFAULT_NEW_TOKENS = 128


def _refuse_what_does_not_apply(args: argparse.Namespace) -> None:
    for flag, given in [("--train", args.train), ("--autocast", args.autocast), ("--plot", args.plot),
                        ("--device", args.device != "cpu"), ("--dtype", args.dtype != "fp32"), ("--jobs", args.jobs != 1),
                        ("--against", args.against), ("--profile", args.profile), ("--shapes", args.shapes),
                        ("--case-logs", args.case_logs)]:
        if given:
            raise ValueError(f"{flag} does not apply to --suite {LLM_SUITE}, which times generate() of decoder LMs in "
                             "this process, float32 models on the CPU (its modes set the precision)")


def llm_settings(args: argparse.Namespace) -> LlmSettings:
    """The run `kiln bench --suite llm ...` asks for; ValueError naming the argument otherwise."""
    _refuse_what_does_not_apply(args)
    try:
        models = _choices("model", _split(args.models), list(LLM_MODELS)) if args.models else list(DEFAULT_MODELS)
    except ValueError as e:
        raise ValueError(f"--models: {e}") from None
    try:
        modes = list(LLM_MODES) if args.modes == DEFAULT_MODES else _choices("mode", _split(args.modes), list(LLM_MODES))
    except ValueError as e:
        raise ValueError(f"--modes: {e}") from None
    if not models or not modes:
        raise ValueError("--models and --modes must name at least one each")
    new_tokens = args.new_tokens or DEFAULT_NEW_TOKENS
    if new_tokens < 2:
        raise ValueError(f"--new-tokens must be at least 2: the prefill gives the first token, decode steps the rest "
                         f"(got {new_tokens})")
    if args.iters < 1 or args.warmup < 1:
        raise ValueError(f"--iters (rounds) and --warmup (generate calls per mode, the first compiles) must be >= 1 "
                         f"with --suite {LLM_SUITE}")
    return LlmSettings(models=tuple(dict.fromkeys(models)), modes=tuple(dict.fromkeys(modes)),
                       batches=tuple(dict.fromkeys(args.batch or DEFAULT_BATCHES)),
                       threads=tuple(parse_threads(args.threads)), prompt_len=args.prompt_len or DEFAULT_PROMPT_LEN,
                       new_tokens=new_tokens, rounds=args.iters, warmup=args.warmup, kv_cache=args.kv_cache or "static")


def llm_metadata(settings: LlmSettings) -> dict[str, Any]:
    from benchmarks.report import run_metadata

    return run_metadata(task=f"text generation: greedy generate() with a {settings.kv_cache} KV cache", suite=LLM_SUITE,
                        threads=list(settings.threads), iters=settings.rounds, warmup=settings.warmup,
                        cache="user's", models=list(settings.models), modes=list(settings.modes),
                        batches=list(settings.batches), prompt_len=settings.prompt_len, new_tokens=settings.new_tokens)


def run_llm(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`kiln bench --suite llm`: in this process, every mode of a (model, batch) interleaved."""
    from benchmarks import report
    from benchmarks.llm import run_llm_suite

    try:
        settings = llm_settings(args)
        check_writable("--json", args.json, ".json")
        check_writable("--markdown", args.markdown, ".md")
    except ValueError as e:
        parser.error(str(e))
    meta = llm_metadata(settings)

    def save_partial(run: LlmRun) -> None:
        # A long run stopped midway keeps the groups it finished (as the model suites do).
        partial = {**meta, "finished": f"{len(run.results)} of "
                   f"{len(settings.threads) * len(settings.models) * len(settings.batches) * len(settings.modes)} rows"}
        if args.json:
            write_whole(args.json, json.dumps(report.json_report([], partial, llm=run), indent=1) + "\n")
        if args.markdown:
            write_whole(args.markdown, report.markdown_report([], partial, llm=run))

    run = run_llm_suite(settings, on_group=save_partial)
    write_outputs([], meta, args, llm=run)
    return 0
