"""What a compiled call costs where the model's own work is small: a tiny MLP and a tiny BERT,
and their narrow twins, where it is next to nothing.

    kiln call-overhead [--models mlp,tiny-bert,mlp-narrow,tiny-bert-narrow] [--calls 2000] [--threads 1]

Each model (batch 1) is compiled by every mode below, in one process, in cold private caches, and
called `--calls` times after a warm-up, five rounds; the best round's microseconds per call are
printed beside eager's, with kiln's C++ wrapper's time over each Inductor mode's.

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
    """`model` compiled by `mode` and called once (kiln reads its settings when it compiles)."""
    if mode == "eager":
        return model
    if mode in ("kiln", "kiln-cpp-wrapper"):
        with config.patch({"backend.cpp_wrapper": mode == "kiln-cpp-wrapper"}), torch.no_grad():
            kiln.reset()
            fn = kiln.compile(model)
            fn(**inputs)
        return fn
    return _inductor(model, inputs, cpp_wrapper=mode == "inductor-cpp-wrapper")


def _inductor(model: nn.Module, inputs: dict[str, Any], cpp_wrapper: bool) -> Callable:
    import torch._dynamo
    from torch._inductor import config as inductor_config

    torch._dynamo.reset()
    inductor_config.freezing = True
    inductor_config.cpp_wrapper = cpp_wrapper
    fn = torch.compile(model)
    with torch.no_grad():
        fn(**inputs)
    return fn


def per_call_us(fn: Callable, inputs: dict[str, Any], calls: int) -> float:
    with torch.no_grad():
        for _ in range(max(calls // 10, 20)):
            fn(**inputs)
        rounds = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                fn(**inputs)
            rounds.append((time.perf_counter() - start) / calls * 1e6)
    return min(rounds)


def measure(name: str, calls: int) -> dict[str, float]:
    model, inputs = build_model(name)
    with torch.no_grad():
        want = model(**inputs)
    times = {}
    for mode in MODES:
        fn = compiled(mode, model, inputs)
        with torch.no_grad():
            got = fn(**inputs)
        first = lambda out: out[0] if isinstance(out, (tuple, list)) else getattr(out, "last_hidden_state", out)  # noqa: E731
        torch.testing.assert_close(first(got), first(want), rtol=1e-4, atol=1e-4)
        times[mode] = per_call_us(fn, inputs, calls)
    return times


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    names = [n for n in args.models.split(",") if n]
    torch.set_num_threads(args.threads)
    print(f"microseconds per call (best of 5 rounds of {args.calls}), {args.threads} thread(s):")
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
