"""kiln with its own attention against kiln with ATen's, one model, one process, calls interleaved:

    python tools/attention_ab.py MODEL THREADS [flip]

Both copies are compiled in this process (the GEMM autotune answers are shared, so only the
attention differs); `flip` compiles the ATen copy first. On the 2-core VMs the copy compiled
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
from kiln.autotune import attention as attention_autotune  # noqa: E402
from kiln.bench.models import MODELS  # noqa: E402


def compiled(spec, inputs, atens: bool):
    """`spec`'s model compiled by kiln; `atens`: with the attention question answered "aten"."""
    model = spec.build(False)
    kiln.reset()
    original = attention_autotune.choose
    if atens:
        attention_autotune.choose = lambda *args, **kwargs: "aten"
    try:
        with config.patch({"cache.dir": tempfile.mkdtemp()}), torch.no_grad():
            run = kiln.compile(model)
            run(**inputs)
            run(**inputs)
    finally:
        attention_autotune.choose = original
    return run


def main() -> None:
    name, threads, flip = sys.argv[1], int(sys.argv[2]), len(sys.argv) > 3
    torch.set_num_threads(threads)
    spec = MODELS[name]
    inputs = spec.make_inputs()
    order = [("aten attention", True), ("kiln attention", False)]
    runs = {label: compiled(spec, inputs, atens) for label, atens in (order if flip else order[::-1])}
    times: dict[str, list[float]] = {label: [] for label in runs}
    with torch.no_grad():
        for r in range(25):
            for label in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                start = time.perf_counter()
                runs[label](**inputs)
                times[label].append(time.perf_counter() - start)
    med = {label: statistics.median(t) * 1e3 for label, t in times.items()}
    print(f"{name} {threads}t ({'aten' if flip else 'kiln'} compiled first): "
          + ", ".join(f"{label} {ms:.2f} ms" for label, ms in med.items())
          + f"; kiln / aten {med['kiln attention'] / med['aten attention']:.3f}")


if __name__ == "__main__":
    main()
