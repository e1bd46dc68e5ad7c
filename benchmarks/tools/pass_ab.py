"""kiln with one of its graph rewrites against kiln without it, one model, one process, calls
interleaved:

    python benchmarks/tools/pass_ab.py MODEL THREADS PASS [flip]

PASS is a name in kiln/passes/pipeline.py's REWRITES (`kiln_attention`: kiln's attention against
ATen's; `gemm_layer_norm`: layer norms inside kiln's GEMM against kernels of their own). Both copies are
compiled in this process with one autotune cache, so the products both graphs share get the same
answers; `flip` compiles the copy without the pass first. On the 2-core VMs the copy compiled
second ran 2-3 % faster whichever it was, so quote the geometric mean of both orders.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import kiln  # noqa: E402
from kiln import config  # noqa: E402
from benchmarks.models import MODELS  # noqa: E402
from kiln.passes import pipeline  # noqa: E402


def compiled(spec, inputs, without: str | None, cache: str):
    """`spec`'s model compiled by kiln, without rewrite `without` (None: with every rewrite)."""
    model = spec.build(False)
    kiln.reset()
    every = pipeline.REWRITES
    pipeline.REWRITES = [(name, rewrite) for name, rewrite in every if name != without]
    try:
        with config.patch({"cache.dir": cache}), torch.no_grad():
            run = kiln.compile(model)
            run(**inputs)
            run(**inputs)
    finally:
        pipeline.REWRITES = every
    return run


def main() -> None:
    name, threads, rewrite, flip = sys.argv[1], int(sys.argv[2]), sys.argv[3], len(sys.argv) > 4
    rewrites = [n for n, _ in pipeline.REWRITES]
    if rewrite not in rewrites:
        raise SystemExit(f"PASS must be one of {', '.join(rewrites)}, not {rewrite!r}")
    torch.set_num_threads(threads)
    spec = MODELS[name]
    inputs = spec.make_inputs()
    cache = tempfile.mkdtemp()
    order = [(f"without {rewrite}", rewrite), (f"with {rewrite}", None)]
    runs = {label: compiled(spec, inputs, without, cache) for label, without in (order if flip else order[::-1])}
    times: dict[str, list[float]] = {label: [] for label in runs}
    with torch.no_grad():
        for r in range(25):
            for label in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                start = time.perf_counter()
                runs[label](**inputs)
                times[label].append(time.perf_counter() - start)
    med = {label: statistics.median(t) * 1e3 for label, t in times.items()}
    print(f"{name} {threads}t ({'without' if flip else 'with'} compiled first): "
          + ", ".join(f"{label} {ms:.2f} ms" for label, ms in med.items())
          + f"; with / without {med[order[1][0]] / med[order[0][0]]:.3f}")


if __name__ == "__main__":
    main()
