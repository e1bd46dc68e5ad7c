"""Times kiln's GEMM built with other register blockings (MR rows x NV vectors, kiln_gemm.h's
-DKILN_GEMM_MR / -DKILN_GEMM_NV) against the default and MKL's packed GEMM, on one machine, in one
process: rounds interleaved across the builds, weights out of cache (8 copies called in turn, as
in a model), medians. What it answers: whether another blocking suits a CPU better (the default,
8 x 3 on AVX-512, was chosen on an AMD EPYC, whose AVX-512 FMAs are 256 bits wide twice over).

    python benchmarks/tools/gemm_blocking_sweep.py --threads 2 --shapes 128x768x768,128x768x3072,128x3072x768

`--k-blocks 1024,512,256` times each blocking with those K blocks too (kernels_unit.K_BLOCK, the
longest K a GEMM runs unblocked), `--blockings 8x3` only the default's build.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import kernels
from kiln.native import build, kernels_unit

BLOCKINGS = [(8, 3), (6, 4), (12, 2), (14, 2), (4, 6), (10, 2)]  # MR x NV: accumulators <= 28 of 32 registers
COPIES = 8


def build_blocking(mr: int, nv: int, folder: Path) -> ctypes.CDLL:
    src, lib = folder / f"gemm_{mr}x{nv}.cpp", folder / f"gemm_{mr}x{nv}.so"
    src.write_text(kernels_unit.source())
    cxx, _ = build.compiler()
    subprocess.run([cxx, *build.FLAGS, f"-DKILN_GEMM_MR={mr}", f"-DKILN_GEMM_NV={nv}", "-shared", str(src), "-o",
                    str(lib)], check=True, capture_output=True)
    return kernels.bind(ctypes.CDLL(str(lib)))


def _with_k_block(kc: int, run):
    default, kernels.K_BLOCK = kernels.K_BLOCK, kc
    try:
        return run()
    finally:
        kernels.K_BLOCK = default


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--shapes", default="128x768x768,128x768x3072,128x3072x768,197x768x3072,128x512x2048,2048x2048x2048")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--blockings", default=",".join(f"{mr}x{nv}" for mr, nv in BLOCKINGS), help="MRxNV,...")
    p.add_argument("--k-blocks", default=str(kernels_unit.K_BLOCK), help="K block lengths to time, e.g. 1024,512,256")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    blockings = [tuple(map(int, b.split("x"))) for b in a.blockings.split(",")]
    k_blocks = [int(kc) for kc in a.k_blocks.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        built = {(mr, nv): build_blocking(mr, nv, Path(tmp)) for mr, nv in blockings}
        libs = {f"kiln {mr}x{nv}" + (f" kc{kc}" if len(k_blocks) > 1 else ""): (lib, kc)
                for (mr, nv), lib in built.items() for kc in k_blocks}
        print(f"threads {a.threads}; {torch.backends.cpu.get_cpu_capability()}; times in ms (median of {a.rounds} "
              f"interleaved rounds, each the mean over {COPIES} weight copies)", flush=True)
        for shape in a.shapes.split(","):
            m, k, n = map(int, shape.split("x"))
            x, bias = torch.randn(m, k), torch.randn(n)
            weights = [torch.randn(k, n) for _ in range(COPIES)]
            packs = {lib: [kernels.pack(w, lib) for w in weights] for lib in built.values()}
            runs = {name: (lambda lib=lib, kc=kc: _with_k_block(kc, lambda: [kernels.mm(x, pk, n, bias, lib=lib)
                                                                              for pk in packs[lib]]))
                    for name, (lib, kc) in libs.items()}
            if torch.backends.mkl.is_available():  # Inductor-freeze's float32 GEMM, as kiln::mm calls it
                originals = [w.t().contiguous() for w in weights]  # [N, K]
                mkl_packs = [torch.ops.mkl._mkl_reorder_linear_weight(o, m) for o in originals]
                runs["mkl"] = lambda: [torch.ops.mkl._mkl_linear(x, pk, o, bias, m) for pk, o in zip(mkl_packs, originals)]
            times = {name: [] for name in runs}
            for run in runs.values():
                run()
            for _ in range(a.rounds):
                for name, run in runs.items():
                    start = time.perf_counter()
                    run()
                    times[name].append((time.perf_counter() - start) / COPIES * 1e3)
            medians = {name: statistics.median(t) for name, t in times.items()}
            best = min(medians, key=medians.get)
            gflops = {name: 2 * m * k * n / ms / 1e6 for name, ms in medians.items()}
            print(f"{shape:>15}: " + "  ".join(f"{name} {ms:.3f} ({gflops[name]:.0f})" for name, ms in medians.items())
                  + f"  fastest {best}", flush=True)


if __name__ == "__main__":
    main()
