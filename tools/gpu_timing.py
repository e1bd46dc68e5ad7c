"""Times HuggingFace models on a CUDA GPU: eager, kiln, kiln with CUDA graphs, and (optionally)
Inductor, each compiled call's median from CUDA events; checks kiln's outputs against eager's.

    python tools/gpu_timing.py --models bert,gpt2 --dtypes fp32,bf16 --modes eager,kiln,kiln-ro,inductor
"""
import argparse
import os
import statistics
import time

import torch
import transformers

import kiln

MODELS = {
    "bert": ("BertModel", "BertConfig", {}),
    "gpt2": ("GPT2Model", "GPT2Config", {}),
    "t5enc": ("T5EncoderModel", "T5Config", {}),
    "distilbert": ("DistilBertModel", "DistilBertConfig", {}),
}


def build(name, batch, seq):
    model_cls, config_cls, extra = MODELS[name]
    config = getattr(transformers, config_cls)(**extra)
    model = getattr(transformers, model_cls)(config).eval().cuda()
    ids = torch.randint(0, config.vocab_size, (batch, seq)).cuda()
    return model, {"input_ids": ids}


def timed(fn, iters=30):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="bert,gpt2")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--modes", default="eager,kiln,kiln-ro")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=128)
    args = p.parse_args()
    print("gpu:", torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    rows = []
    for name in args.models.split(","):
        for dtype in args.dtypes.split(","):
            torch.manual_seed(0)
            model, inputs = build(name, args.batch, args.seq)
            cast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if dtype == "bf16" else torch.no_grad
            with torch.no_grad(), cast():
                ref = model(**inputs).last_hidden_state.float()
            eager_ms = None
            for mode in args.modes.split(","):
                t0 = time.perf_counter()
                try:
                    if mode == "eager":
                        fn = model
                    elif mode == "kiln":
                        fn = kiln.compile(model)
                    elif mode == "kiln-ro":
                        fn = kiln.compile(model, mode="reduce-overhead")
                    elif mode == "kiln-tgemm":
                        os.environ["KILN_TRITON_GEMM"] = "always"
                        kiln.config.backend.triton_gemm = "always"
                        fn = kiln.compile(model)
                    elif mode == "inductor":
                        fn = torch.compile(model)
                    elif mode == "inductor-ro":
                        fn = torch.compile(model, mode="reduce-overhead")
                    with torch.no_grad(), cast():
                        out = fn(**inputs).last_hidden_state.float()
                        torch.cuda.synchronize()
                        compile_s = time.perf_counter() - t0
                        err = ((out - ref).norm() / ref.norm()).item()
                        ms = timed(lambda: fn(**inputs))
                except Exception as e:  # noqa: BLE001
                    import traceback
                    print(f"{name} {dtype} {mode}: FAILED {type(e).__name__}: {str(e)[:3000]}", flush=True)
                    traceback.print_exc()
                    continue
                finally:
                    kiln.config.backend.triton_gemm = "auto"
                if mode == "eager":
                    eager_ms = ms
                speed = eager_ms / ms if eager_ms else float("nan")
                fb = len(kiln.runtime.fallback.FALLBACKS)
                row = f"{name:10s} {dtype:5s} {mode:12s} {ms:8.3f} ms  x{speed:5.2f} eager  compile {compile_s:6.1f} s  rel.err {err:.1e}  fallbacks {fb}"
                print(row, flush=True)
                rows.append(row)
            for f in kiln.runtime.fallback.FALLBACKS:
                print("   fallback:", f, flush=True)
            kiln.runtime.fallback.FALLBACKS.clear()
            torch._dynamo.reset()
    print("\n".join(["", "SUMMARY", *rows]))


if __name__ == "__main__":
    main()
