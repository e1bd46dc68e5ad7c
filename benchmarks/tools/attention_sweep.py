"""Times kiln's attention kernel (kiln_attention.h, `kiln_attention_f32` of the kernels library)
on a decode step's shapes, built with other settings against the default build, in one process:
each layer's query rows of every key-value head over its KV cache, the layers' caches read from
memory (a 64 MB write between the rounds pushes them out of the caches; `--warm` leaves them),
rounds interleaved across builds, medians in µs a layer.

A build is its -D macros joined by `+` (`KILN_KEYS_AHEAD=64+KILN_ATTENTION_LOCALITY=3`), with
`header=PATH` among them for another kiln_attention.h in the default's place (the file before a
change, kept aside: `git show HEAD~1:kiln/native/include/kiln_attention.h > /tmp/before.h`):

    python benchmarks/tools/attention_sweep.py --keys 192,1000,2000,4000 header=/tmp/before.h
    python benchmarks/tools/attention_sweep.py --kv-heads 12 --rows 1 --layers 12 --keys 192,2000 KILN_KEYS_AHEAD=64

The default shape is Qwen2-0.5B's decode step (2 key-value heads of 7 query rows, head size 64, 24
layers, a static cache of 4096 rows, the keys past a row's end masked as HuggingFace masks them).
`--aten` times ATen's flash kernel beside them (`enable_gqa`, on the live rows only).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from kiln.native import INCLUDE, kernels_unit
from kiln.native.build import build_library

HEADER = "kiln_attention.h"
ATEN = "aten"


def build(settings: list[str]) -> ctypes._CFuncPtr:
    """`kiln_attention_f32` of the kernels library built with `settings`: -D macros, and
    `header=PATH` for another kiln_attention.h."""
    source = kernels_unit.source()
    macros = []
    for setting in settings:
        if setting.startswith("header="):
            ours = (INCLUDE / HEADER).read_text().replace("#pragma once", "")
            if ours not in source:
                raise SystemExit(f"attention_sweep: {HEADER} is not inlined whole in the kernels unit; header= cannot replace it")
            source = source.replace(ours, Path(setting[len("header="):]).read_text().replace("#pragma once", ""))
        else:
            macros.append(f"-D{setting}")
    function = ctypes.CDLL(str(build_library(source, macros)[0])).kiln_attention_f32
    function.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_float, ctypes.c_int32]
    return function


def shape_record(kv_heads: int, rows: int, cache: int, head: int) -> torch.Tensor:
    """kiln_attention::Shape of one layer's call: q [1, kv, rows, D], k and v [1, kv, cache, D],
    out like q, a key mask [1, 1, 1, cache] (zero strides where it is broadcast)."""
    q = (kv_heads * rows * head, rows * head, head)
    kv = (kv_heads * cache * head, cache * head, head)
    return torch.tensor([1, kv_heads, rows, cache, head, head, *q, *kv, *kv, *q, 0, 0, 0], dtype=torch.int64)


def parse_builds(builds: list[str], parser: argparse.ArgumentParser) -> list[list[str]]:
    settings = [[]]
    for b in builds:
        parts = b.split("+")
        if any(not p or (not p.startswith("header=") and not p.startswith("KILN_")) for p in parts):
            parser.error(f"a build is KILN_* macros and header=PATH joined by '+', got {b!r}")
        for p in parts:
            if p.startswith("header=") and not Path(p[len("header="):]).is_file():
                parser.error(f"{p}: no such file")
        settings.append(parts)
    return settings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("builds", nargs="*", help="builds besides the default: macros (and header=PATH) joined by '+'")
    parser.add_argument("--keys", default="192,2000", help="keys each row attends to, comma-separated")
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=7, help="query rows a key-value head")
    parser.add_argument("--head", type=int, default=64, help="head size (a multiple of the vector width)")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--cache", type=int, default=4096, help="rows of the static cache")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warm", action="store_true", help="leave the caches in the CPU's caches between rounds")
    parser.add_argument("--aten", action="store_true", help="ATen's flash kernel beside the builds")
    args = parser.parse_args(argv)
    keys = [int(k) for k in args.keys.split(",")]
    if any(not 0 < k <= args.cache for k in keys):
        parser.error(f"--keys: each between 1 and --cache ({args.cache}), got {args.keys!r}")
    settings = parse_builds(args.builds, parser)
    torch.set_num_threads(args.threads)
    functions = [build(s) for s in settings]
    names = ["+".join(s) or "default" for s in settings] + ([ATEN] if args.aten else [])
    torch.manual_seed(0)
    L, kv, rows, head = args.layers, args.kv_heads, args.rows, args.head
    qs = [torch.randn(1, kv, rows, head) for _ in range(L)]
    ks = [torch.randn(1, kv, args.cache, head) for _ in range(L)]
    vs = [torch.randn(1, kv, args.cache, head) for _ in range(L)]
    outs = [torch.empty(1, kv, rows, head) for _ in range(L)]
    evict = torch.empty(64 << 20, dtype=torch.uint8)
    record = shape_record(kv, rows, args.cache, head)
    print(f"{kv} key-value heads of {rows} query rows, head size {head}, {L} layers, {args.threads} threads, "
          f"caches {'warm' if args.warm else 'from memory'}; median of {args.rounds} interleaved rounds, µs a layer")
    for n in keys:
        mask = torch.full((1, 1, 1, args.cache), torch.finfo(torch.float32).min)
        mask[..., :n] = 0

        def kiln_call(function):
            for i in range(L):
                function(record.data_ptr(), qs[i].data_ptr(), ks[i].data_ptr(), vs[i].data_ptr(), mask.data_ptr(),
                         outs[i].data_ptr(), head ** -0.5, 0)

        def aten_call():
            for i in range(L):
                F.scaled_dot_product_attention(qs[i].reshape(1, kv * rows, 1, head), ks[i][:, :, :n], vs[i][:, :, :n],
                                               enable_gqa=True)

        calls = [lambda f=f: kiln_call(f) for f in functions] + ([aten_call] if args.aten else [])
        times: list[list[float]] = [[] for _ in calls]
        for _ in range(args.rounds):
            for call, spent in zip(calls, times):
                if not args.warm:
                    evict.add_(1)
                start = time.perf_counter()
                call()
                spent.append((time.perf_counter() - start) / L * 1e6)
        print(f"{n} keys: " + "; ".join(f"{name} {statistics.median(t):.1f}" for name, t in zip(names, times)))


if __name__ == "__main__":
    main(sys.argv[1:])
