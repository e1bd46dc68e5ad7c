"""Where a compiled model's GPU call goes, kiln beside Inductor: for each mode, one process,
torch.profiler over a few calls after warm-up; per call: the GPU's kernel time, kernel launches,
host-side synchronizations, the host's time; then the kernels taking the most GPU time.

    PYTHONPATH=. python benchmarks/tools/gpu_profile.py --models gpt2,bert --modes eager,kiln,inductor --batch 8 [--train] [--top 15]

Models are HuggingFace's, built from their configs and cast to bfloat16 (`--train`: float32
weights, one AMP step, forward and backward under bf16 autocast). For a lent GPU machine: what the
numbers of `kiln bench` do not say (which kernels are slow, how many launches and waits a call
makes), so the next change can aim at it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import torch
import transformers

import kiln
from benchmarks.launch_count import LAUNCHES, STEP, inside_steps, is_wait

MODELS = {
    "gpt2": (transformers.GPT2LMHeadModel, transformers.GPT2Config, {"use_cache": False}),
    "bert": (transformers.BertModel, transformers.BertConfig, {}),
    "mistral": (transformers.MistralForCausalLM, transformers.MistralConfig,
                {"hidden_size": 1024, "intermediate_size": 3584, "num_hidden_layers": 4, "num_attention_heads": 16,
                 "num_key_value_heads": 4, "vocab_size": 32000, "use_cache": False}),
}


def build(name: str, batch: int, train: bool):
    model_cls, config_cls, extra = MODELS[name]
    config = config_cls(**extra)
    torch.manual_seed(0)
    model = model_cls(config).cuda()
    model = model.train() if train else model.eval().to(torch.bfloat16)
    ids = torch.randint(0, config.vocab_size, (batch, 128), device="cuda")
    return model, {"input_ids": ids}


def compiled(model, mode: str):
    if mode == "eager":
        return model
    if mode.startswith("kiln"):
        return kiln.compile(model, mode="reduce-overhead" if mode.endswith("-ro") else None)
    return torch.compile(model, mode="reduce-overhead" if mode.endswith("-ro") else None)


def step(fn, inputs: dict, train: bool):
    if not train:
        with torch.no_grad():
            return fn(**inputs)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = fn(**inputs)
    logits = out[0] if isinstance(out, tuple) else getattr(out, "logits", None)
    logits = logits if logits is not None else out.last_hidden_state
    logits.float().mean().backward()


def profile(name: str, mode: str, batch: int, train: bool, calls: int, top_kernels: int = 15) -> None:
    model, inputs = build(name, batch, train)
    started = time.perf_counter()
    fn = compiled(model, mode)
    step(fn, inputs, train)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - started
    for _ in range(5):
        step(fn, inputs, train)
    torch.cuda.synchronize()
    host = []
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(calls):
            t0 = time.perf_counter()
            with torch.profiler.record_function(STEP):
                step(fn, inputs, train)
            host.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    gpu_us, kernels = 0.0, {}
    for row in prof.key_averages():
        if row.device_type == torch.autograd.DeviceType.CUDA:  # a kernel (or a copy) on the GPU
            us = row.self_device_time_total
            gpu_us += us
            kernels[row.key] = (row.count, us)
    # The host's CUDA calls inside the calls (not the profiler's own synchronize when it stops);
    # waits as benchmarks/launch_count.py tells them (an asynchronous copy is none).
    calls_made = Counter(name for name, _ in inside_steps(prof.events()))
    launches = sum(n for name, n in calls_made.items() if name in LAUNCHES)
    waits = Counter({name: n for name, n in calls_made.items() if is_wait(name)})
    fallbacks = [str(f) for f in kiln.runtime.fallback.FALLBACKS]
    print(f"\n== {name} {'AMP training step' if train else 'bf16 inference'} batch {batch}: {mode} "
          f"(compile {compile_s:.1f} s{'; fallbacks: ' + '; '.join(fallbacks) if fallbacks else ''})")
    print(f"per call: GPU kernels {gpu_us / calls / 1e3:.3f} ms, host {statistics.median(host) * 1e3:.3f} ms, "
          f"{launches / calls:.0f} launches, waits {dict((k, v / calls) for k, v in waits.items()) or 0}")
    top = sorted(kernels.items(), key=lambda item: -item[1][1])[:top_kernels]
    for kernel, (count, us) in top:
        print(f"  {us / calls:9.1f} us  {count / calls:5.1f}x  {kernel[:110]}")
    kiln.runtime.fallback.FALLBACKS.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2")
    parser.add_argument("--modes", default="eager,kiln,inductor")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--top", type=int, default=15, help="the kernels listed, by GPU time")
    parser.add_argument("--train", action="store_true")
    args = parser.parse_args()
    print("gpu:", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    for name in args.models.split(","):
        for mode in args.modes.split(","):
            try:
                profile(name, mode, args.batch, args.train, args.calls, args.top)
            except Exception as error:  # noqa: BLE001 - the next mode still runs
                print(f"\n== {name} {mode}: failed: {type(error).__name__}: {str(error)[:500]}", flush=True)


if __name__ == "__main__":
    main()
