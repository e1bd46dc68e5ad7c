"""What a compiled call costs where the model's own work is small: a tiny MLP and a tiny BERT,
and their narrow twins, where it is next to nothing.

    kiln call-overhead [--models mlp,tiny-bert,mlp-narrow,tiny-bert-narrow] [--calls 2000] [--threads 1]

Each model (batch 1) is compiled by every mode below, in one process, in cold private caches, and
called `--calls` times after a warm-up, seven rounds taking the modes in turn; the best round's
microseconds per call are printed beside eager's, with kiln's C++ wrapper's time over each
Inductor mode's.

The `-narrow` twins have the same layers, ops and kernels with every width shrunk (hidden size 8,
sequence 4): their arithmetic takes nanoseconds, so a call's time is the compiler's fixed cost per
call — guards, runtime wrappers, checks of frozen weights, the wrapper's allocations and its
kernel and extern calls, and the libraries' own fixed cost per extern call. (The BERTs return a
tuple, `return_dict=False`: their output dataclass would add ~18 µs of the model's own Python to
every mode.) That is how
docs/results.md "Per-call overhead" measures overhead (as PyTorch's own overhead benchmark does,
with inputs too small to compute).

Modes: eager; kiln (`kiln.compile`, the Python wrapper); kiln-cpp-wrapper (`backend.cpp_wrapper`:
one C++ call per graph); inductor (`torch.compile` with freezing) and inductor-cpp-wrapper
(the same with Inductor's `cpp_wrapper`).
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time
from typing import Any, Callable

import torch
from torch import nn

import kiln
from kiln import config

MODES = ("eager", "kiln", "kiln-cpp-wrapper", "inductor", "inductor-cpp-wrapper")


MODELS = ("mlp", "tiny-bert", "mlp-narrow", "tiny-bert-narrow")


def build_model(name: str) -> tuple[nn.Module, dict[str, Any]]:
    """(model, keyword inputs) of a model whose call takes well under a millisecond."""
    torch.manual_seed(0)
    narrow = name.endswith("-narrow")
    if name.removesuffix("-narrow") == "mlp":
        w, out = (4, 2) if narrow else (64, 10)
        model = nn.Sequential(nn.Linear(w, 2 * w), nn.GELU(), nn.LayerNorm(2 * w), nn.Linear(2 * w, 2 * w), nn.ReLU(),
                              nn.Linear(2 * w, out))
        return model.eval(), {"input": torch.randn(1, w)}
    if name.removesuffix("-narrow") == "tiny-bert":
        import transformers

        hidden, heads, vocab, sequence = (8, 2, 16, 4) if narrow else (64, 4, 1000, 16)
        # return_dict=False: the model returns a tuple, so a call times the compiled graph and its
        # wrappers, not the output dataclass every mode builds in Python (~18 µs).
        config_ = transformers.BertConfig(hidden_size=hidden, num_attention_heads=heads, intermediate_size=2 * hidden,
                                          max_position_embeddings=128, vocab_size=vocab, num_hidden_layers=2,
                                          return_dict=False)
        ids = torch.randint(0, vocab, (1, sequence), generator=torch.Generator().manual_seed(0))
        return transformers.BertModel(config_).eval(), {"input_ids": ids}
    raise ValueError(f"unknown model {name!r}: choose from {', '.join(MODELS)}")


def compiled(mode: str, model: nn.Module, inputs: dict[str, Any]) -> Callable:
    """`model` compiled by `mode` and called once (kiln and Inductor read their settings when
    they compile, so modes compiled one after the other each keep their own)."""
    if mode == "eager":
        return model
    if mode in ("kiln", "kiln-cpp-wrapper"):
        with config.patch({"backend.cpp_wrapper": mode == "kiln-cpp-wrapper"}), torch.no_grad():
            fn = kiln.compile(model)
            fn(**inputs)
        return fn
    from torch._inductor import config as inductor_config

    with inductor_config.patch({"freezing": True, "cpp_wrapper": mode == "inductor-cpp-wrapper"}), torch.no_grad():
        fn = torch.compile(model)
        fn(**inputs)
    return fn


def measure(name: str, calls: int, rounds: int = 7) -> dict[str, float]:
    """Best microseconds per call of each mode. Every mode is compiled first (each on its own copy
    of the model), then the rounds go through the modes in turn: a noisy spell of the machine
    (a shared VM's neighbours) reaches every mode alike instead of one."""
    import torch._dynamo

    model, inputs = build_model(name)
    with torch.no_grad():
        want = model(**inputs)
    kiln.reset()
    torch._dynamo.reset()
    first = lambda out: out[0] if isinstance(out, (tuple, list)) else out  # noqa: E731
    functions = {}
    for mode in MODES:
        fn = compiled(mode, copy.deepcopy(model), inputs)
        with torch.no_grad():
            torch.testing.assert_close(first(fn(**inputs)), first(want), rtol=1e-4, atol=1e-4)
            for _ in range(max(calls // 10, 20)):  # warm
                fn(**inputs)
        functions[mode] = fn
    times = {mode: float("inf") for mode in MODES}
    with torch.no_grad():
        for _ in range(rounds):
            for mode, fn in functions.items():
                start = time.perf_counter()
                for _ in range(calls):
                    fn(**inputs)
                times[mode] = min(times[mode], (time.perf_counter() - start) / calls * 1e6)
    return times


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    names = [n for n in args.models.split(",") if n]
    torch.set_num_threads(args.threads)
    print(f"microseconds per call (best of 7 rounds of {args.calls}, the modes in turn), {args.threads} thread(s):")
    ratios = ("kiln-cpp-wrapper / inductor", "/ inductor-cpp-wrapper")
    print("  model             " + "".join(f"{m:>22}" for m in MODES) + "".join(f"{r:>30}" for r in ratios))
    for name in names:
        with tempfile.TemporaryDirectory(prefix="kiln-overhead-") as cold, config.patch({"cache.dir": cold}):
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cold, "inductor")
            try:
                times = measure(name, args.calls)
            except ValueError as error:
                parser.error(str(error))
        kiln_cpp = times["kiln-cpp-wrapper"]
        print(f"  {name:<17} " + "".join(f"{times[m]:>22.1f}" for m in MODES)
              + f"{kiln_cpp / times['inductor']:>30.2f}{kiln_cpp / times['inductor-cpp-wrapper']:>30.2f}", flush=True)
    return 0


def add_command(commands: Any) -> None:
    parser = commands.add_parser("call-overhead", help="microseconds per call of tiny models, kiln's wrappers beside Inductor's")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated: {', '.join(MODELS)}")
    parser.add_argument("--calls", type=int, default=2000, help="calls per round (default 2000)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.set_defaults(handler=main)
