"""GPU time of a product over a ragged width (GPT-2's language-model head: N = 50257) three ways, for
kiln/passes/wide_rows.py's choices: as eager runs it (cuBLAS picks its kernel for N as it is), with
the weight padded to whole 16-byte lines at every call (a weight that is not frozen), and with the
weight padded once (a frozen one). CUDA events, the three interleaved round by round, medians.

Usage (a machine with a CUDA GPU, the repository root): PYTHONPATH=. python benchmarks/tools/ragged_product.py [--rows 1,8,64,256,1024]
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from benchmarks.worker import cuda_seconds


def _gpu_us(fn, reps: int) -> float:
    def repeated() -> None:
        for _ in range(reps):
            fn()  # (each result dropped: the allocator reuses its memory, as in a model)

    return cuda_seconds(repeated) * 1e6 / reps


def _kernels(fn) -> str:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.key for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    return "; ".join(n[:90] for n in names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8,64,256,1024")
    parser.add_argument("--k", type=int, default=768)
    parser.add_argument("--n", type=int, default=50257)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    n, k = args.n, args.k
    wide = -(-n // 8) * 8
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    w_once = F.pad(w, (0, 0, 0, wide - n))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; bf16 x (M x {k}) @ w.t() ({k} x {n}), "
          f"padded to {wide}; µs per call, median of {args.rounds} rounds of {args.reps}")
    print(f"{'M':>6} {'as it is':>10} {'padded per call':>16} {'padded once':>12}  per call / as is  once / as is")
    for m in [int(r) for r in args.rows.split(",")]:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ways = {"as it is": lambda: x @ w.t(),
                "padded per call": lambda: (x @ F.pad(w, (0, 0, 0, wide - n)).t())[:, :n],
                "padded once": lambda: (x @ w_once.t())[:, :n]}
        for fn in ways.values():  # warm-up: cuBLAS's handles and heuristics
            fn()
        times = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, fn in ways.items():
                times[name].append(_gpu_us(fn, args.reps))
        med = {name: statistics.median(t) for name, t in times.items()}
        print(f"{m:>6} {med['as it is']:>10.1f} {med['padded per call']:>16.1f} {med['padded once']:>12.1f}  "
              f"{med['padded per call'] / med['as it is']:>15.2f}x {med['padded once'] / med['as it is']:>12.2f}x")
        if m == max(int(r) for r in args.rows.split(",")):
            for name, fn in ways.items():
                print(f"    {name}: {_kernels(fn)}")


if __name__ == "__main__":
    main()
