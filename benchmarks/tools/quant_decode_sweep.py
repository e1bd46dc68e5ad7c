"""Times a decode step's weight-only quantized products (kiln_gemm_quant.h) built with other
settings (-D macros: KILN_QUANT_LOCALITY, KILN_INT8_AHEAD, KILN_INT4_PREFETCH_WORDS, KILN_DIGIT_RUNS) against the
default build, on one machine, in one process: every layer's products of an `llm` suite model
(its q/k/v and gate/up merged, as kiln's freezing merges them, and its LM head), the weights
cycled from DRAM as a decode step reads them, rounds interleaved across builds and kinds (each
round starting at the next build: the first of a round ran slower), medians.
float32's GEMV over the same weights runs beside them, and `torch.sum` over each pack's bytes
(read-fp32, read-int8, read-int4: a plain read of the same pieces of memory, ~3 us of Python a
call where the products' ctypes calls take ~8): on a shared VM the memory's speed moves with the
neighbours' work, and the quantized products' GB/s against float32's or the plain read's in the
same round is what compares across runs; so does each build's time over the default's in the same round
(the median of those ratios, with its quartiles).

    python benchmarks/tools/quant_decode_sweep.py --model llama-160m --rows 1 KILN_QUANT_LOCALITY=3
    python benchmarks/tools/quant_decode_sweep.py --model qwen2-0.5b --kinds int4 --huge-pages KILN_TABLE_AHEAD=0
    python benchmarks/tools/quant_decode_sweep.py --model qwen2-0.5b --kinds int4 --huge-page-runs KILN_DIGIT_RUNS=3

Each argument is one build: its macros joined by `+` (`KILN_QUANT_LOCALITY=3+KILN_INT8_AHEAD=128`;
KILN_TABLE_AHEAD and KILN_INT8_FAR_PREFETCH too). `--huge-pages` lays the packed weights on 2 MB pages (madvise, where
transparent huge pages are `madvise` or `always`) and tells the kernels so, as kiln's runtime
does on AMD (kiln_gemm.h `huge_page_packs`: one-row products then read one stream a thread);
`--huge-page-runs` lays them there but reads them in runs, as kiln's runtime does on Intel.
`--pages` times the default build over the same packs three ways instead: on 4 KB pages (the
"default" row), on 2 MB pages read in runs as on 4 KB ones, and on 2 MB pages read as on AMD:
which reading a CPU should get.

    python benchmarks/tools/quant_decode_sweep.py --model qwen2-0.5b --kinds fp32,int8,int4 --rounds 30 --pages
The calls go through ctypes (benchmarks/kernels.py): ~8 us of Python each, in every build alike.
`--in-c` runs each kind's whole step in one C call instead (kiln_gemm_quant_step: the products as
kiln's C++ wrapper calls them, float32's GEMVs too; kiln_read_pieces for the read kinds: every
line of each pack read in `--read-runs` runs a thread, asked `--read-ahead` bytes ahead, a faster
floor than `torch.sum`'s) and prints each product shape's time and GB/s too, the reads' beside
(the same pieces in the same order: where a product loses to the read of its own bytes):

    python benchmarks/tools/quant_decode_sweep.py --model qwen2-0.5b --kinds int4,read-int4 --huge-page-runs --in-c

`--by-state` probes the memory's read bandwidth between the rounds (benchmarks/roofline.py, as the
llm suite does) and gives each build's ratio over the rounds of each state of the machine apart: a
round counts where the probes before and after it agree within BRACKET_AGREEMENT, and is "high"
where their mean is at least HIGH_SHARE of the run's best probe, else "low". The 2-core Zen 4 VM
reads 60-65 GB/s or 33-35 for seconds at a time; a change can be faster in one state and slower in
the other (2026-12-04: one load a word in digits_tile, 0.92x the time from L2, 1.03x from DRAM in
the high state, 1.00x in the low one), which a median over both hides:

    python benchmarks/tools/quant_decode_sweep.py --model qwen2-0.5b --kinds int4 --huge-pages --in-c --by-state --rounds 200 KILN_INT4_PREFETCH_WORDS=64
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import time

import torch

from benchmarks import kernels
from benchmarks.llm_modes import LLM_MODELS
from benchmarks.roofline import ROUND_PROBE_PASSES, huge_page_bytes, probe_buffer, probes_agree, read_bandwidth
from benchmarks.rounds import rotated
from kiln.native import kernels_unit
from kiln.native.build import build_library

KINDS = ("fp32", "int8", "int4", "int4-a8", "read-fp32", "read-int8", "read-int4")
# The packs each kind reads; the read kinds are torch.sum over a pack's bytes (as int64): what a
# plain read of the same pieces of memory takes, the floor the products are held to.
READS = {"int4-a8": "int4", "read-fp32": "fp32", "read-int8": "int8", "read-int4": "int4"}
GROUP = 128
# (--in-c: int4-a8 still goes through one Python call a product)
IN_C_KINDS = ("fp32", "int8", "int4", "read-fp32", "read-int8", "read-int4")
# --by-state: a round is of the machine's high state where its probes read at least this share of the run's best.
HIGH_SHARE = 0.75


def _set_reading(build: ctypes.CDLL, reading: tuple[int, int]) -> None:
    """How the build's one-row products read their panels: (huge_page_packs, near_gemv), kiln_gemm.h."""
    build.kiln_gemm_set_huge_page_packs(reading[0])
    build.kiln_gemm_set_near_gemv(reading[1])


def rounds_by_state(probes: list[float]) -> dict[str, list[int]]:
    """The rounds of each state of the machine ("high", "low"), from `probes`: the bandwidth read
    before the first round and after each (round i between probes i and i + 1). A round whose two
    probes disagree by more than BRACKET_AGREEMENT is in neither: the machine changed state while
    it ran."""
    best = max(probes)
    states: dict[str, list[int]] = {"high": [], "low": []}
    for i, (before, after) in enumerate(zip(probes, probes[1:])):
        if not probes_agree(before, after):
            continue
        states["high" if (before + after) / 2 >= HIGH_SHARE * best else "low"].append(i)
    return states


def _ratio_line(ratios: list[float]) -> str:
    """The median of the rounds' time ratios with their quartiles (one ratio: no quartiles)."""
    if len(ratios) < 2:
        return f"{ratios[0]:.3f}x the default's time"
    low, _, high = statistics.quantiles(ratios, n=4)
    return f"{statistics.median(ratios):.3f}x the default's time (quartiles {low:.3f}-{high:.3f})"


def build_variant(macros: list[str]) -> ctypes.CDLL:
    flags = [f"-D{m}" for m in macros]
    return kernels.bind(ctypes.CDLL(str(build_library(kernels_unit.source(), flags)[0])))


def layer_shapes(model: str) -> list[tuple[int, int]]:
    """(K, N) of each product a decode step runs: per layer q/k/v merged, o, gate/up merged, down; then the LM head."""
    c = LLM_MODELS[model].config
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    kv = c.get("num_key_value_heads", heads) * (hidden // heads)
    layer = [(hidden, hidden + 2 * kv), (hidden, hidden), (hidden, 2 * c["intermediate_size"]),
             (c["intermediate_size"], hidden)]
    return layer * c["num_hidden_layers"] + [(hidden, c["vocab_size"])]


def _int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
    scale = w.abs().amax(1) / 127
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale, None


def _int4(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, k = w.shape
    grouped = w.view(n, k // group, group)
    low, high = grouped.amin(2), grouped.amax(2)
    scale = (high - low) / 15
    zero = torch.round(-low / scale)
    q = torch.clamp(torch.round(grouped / scale[..., None]) + zero[..., None], 0, 15).to(torch.uint8).view(n, k)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous(), scale, zero


class HugePageArena:
    """Tensors laid one after another in memory advised as 2 MB pages (each at a 4 KB boundary)."""

    def __init__(self, nbytes: int) -> None:
        self._bytes = huge_page_bytes(nbytes)
        self._used = 0

    @staticmethod
    def room(t: torch.Tensor) -> int:
        """The bytes `copy_of(t)` takes: t's, up to the next 4 KB."""
        return (t.numel() * t.element_size() + 4095) // 4096 * 4096

    def copy_of(self, t: torch.Tensor) -> torch.Tensor:
        n = t.numel() * t.element_size()
        out = self._bytes[self._used:self._used + n].view(t.dtype)
        out.copy_(t.reshape(-1))
        self._used += self.room(t)
        return out.view(t.shape)


class StepInC:
    """One kind's decode step as one C call (--in-c): the products' (or pieces') arguments as C
    arrays, made once; each product's nanoseconds summed over the calls (`per_shape`)."""

    def __init__(self, weights: list, acts: dict, kind: str, args: argparse.Namespace) -> None:
        bits = READS.get(kind, kind)
        self.kind, self.shapes, self.read_runs, self.read_ahead = kind, [(k, n) for k, n, *_ in weights], \
            args.read_runs, args.read_ahead
        self.packs = [packed[kind] for *_, packed in weights]
        self.outs = [torch.empty(args.rows, n) for _, n, *_ in weights]
        self.a = [acts[k] for k, *_ in weights]
        self.bytes = [p.numel() * p.element_size() for p in self.packs]
        self.byte_counts = self._int64(self.bytes)  # (made once: `run` is timed)
        self.count, self.bits, self.rows = len(weights), {"fp32": 32, "int8": 8}.get(bits, 4), args.rows
        self.ns = (ctypes.c_double * len(weights))()
        self.args = (self._int64([n for _, n, *_ in weights]), self._int64([k for k, *_ in weights]),
                     self._int64([k if bits == "int8" else group for k, _, group, _ in weights]),
                     self._pointers(self.a), self._pointers(self.packs), self._pointers(self.outs))

    @staticmethod
    def _int64(values: list[int]) -> ctypes.Array:
        return (ctypes.c_int64 * len(values))(*values)

    @staticmethod
    def _pointers(tensors: list[torch.Tensor]) -> ctypes.Array:
        return (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])

    def run(self, build: ctypes.CDLL) -> float:
        start = time.perf_counter()
        if self.kind.startswith("read-"):
            build.kiln_read_pieces(self.count, self.args[4], self.byte_counts, self.read_runs, self.read_ahead, self.ns)
        else:
            build.kiln_gemm_quant_step(self.count, self.bits, self.rows, *self.args, kernels.K_BLOCK, self.ns)
        return time.perf_counter() - start

    def per_shape(self, rounds: int) -> dict[str, tuple[int, float, float]]:
        """(K)x(N) -> (products a step, ms a step, GB/s) over the `rounds` calls."""
        shapes: dict[str, list] = {}
        for i, (k, n) in enumerate(self.shapes):
            entry = shapes.setdefault(f"{k}x{n}", [0, 0.0, 0])
            entry[0] += 1
            entry[1] += self.ns[i] / rounds / 1e6
            entry[2] += self.bytes[i]
        return {shape: (calls, ms, nbytes / ms / 1e6) for shape, (calls, ms, nbytes) in shapes.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("builds", nargs="*", help="builds besides the default: macros joined by '+'")
    parser.add_argument("--model", default="llama-160m", choices=sorted(LLM_MODELS))
    parser.add_argument("--rows", type=int, default=1, choices=range(1, 5), help="rows of activations (the batch)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"of {', '.join(KINDS)}")
    parser.add_argument("--huge-pages", action="store_true",
                        help="packed weights on 2 MB pages, read as kiln's runtime reads them there (AMD)")
    parser.add_argument("--huge-page-runs", action="store_true",
                        help="packed weights on 2 MB pages, read in runs (as kiln's runtime reads them on Intel: "
                             "float32's asked for into L1, near_gemv)")
    parser.add_argument("--pages", action="store_true",
                        help="the default build only, over four readings of the same packs: 4 KB pages read in runs "
                             "(the default row), 2 MB pages read in runs as on Intel (near_gemv), 2 MB pages read in "
                             "runs as on 4 KB ones, 2 MB pages read as on AMD (huge_page_packs)")
    parser.add_argument("--in-c", action="store_true",
                        help=f"each kind's step in one C call ({', '.join(IN_C_KINDS)}; the others a call a product as "
                             "without it), and each shape's time")
    parser.add_argument("--read-runs", type=int, default=2, help="--in-c: runs a thread reads side by side (read kinds)")
    parser.add_argument("--read-ahead", type=int, default=3072,
                        help="--in-c: bytes ahead each line is asked for (read kinds; 0: none)")
    parser.add_argument("--by-state", action="store_true",
                        help="probe the memory between rounds and give each build's ratio over the rounds of each "
                             "state of the machine (its probes' agreeing high and low readings) apart")
    args = parser.parse_args(argv)
    kinds = args.kinds.split(",")
    if any(kind not in KINDS for kind in kinds):
        parser.error(f"--kinds: accepted kinds are {', '.join(KINDS)}, got {args.kinds!r}")
    if args.pages and (args.builds or args.huge_pages or args.huge_page_runs):
        parser.error("--pages compares page layouts of the default build: give it no builds and no --huge-pages")
    if args.huge_pages and args.huge_page_runs:
        parser.error("--huge-pages and --huge-page-runs are two readings of the same pages: give one")
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    builds = {"default": build_variant([])}
    builds.update({b: build_variant(b.split("+")) for b in args.builds})
    lib = builds["default"]
    torch.manual_seed(0)
    weights = []
    for k, n in layer_shapes(args.model):
        w, group = torch.randn(n, k) * 0.02, min(GROUP, k)  # (the suite's tiny model: K below a group)
        weights.append((k, n, group, {"fp32": kernels.pack(w.t().contiguous(), lib),
                                      "int8": kernels.quant_pack(*_int8(w), 8, k, k, lib),
                                      "int4": kernels.quant_pack(*_int4(w, group), 4, group, k, lib)}))
    # Each variant: (build, its packs, (huge_page_packs, near_gemv) while it runs: the one-row reading).
    variants = {name: (build, weights, (0, 0)) for name, build in builds.items()}
    if args.huge_pages or args.huge_page_runs or args.pages:
        arena = HugePageArena(sum(HugePageArena.room(p) for *_, packs in weights for p in packs.values()))
        huge = [(k, n, group, {kind: arena.copy_of(p) for kind, p in packs.items()}) for k, n, group, packs in weights]
        reading = (1, 0) if args.huge_pages else (0, 1)
        variants = ({"default": (lib, weights, (0, 0)), "2mb-pages-runs": (lib, huge, (0, 1)),
                     "2mb-pages-plain-runs": (lib, huge, (0, 0)), "2mb-pages-amd-reads": (lib, huge, (1, 0))}
                    if args.pages else {name: (build, huge, reading) for name, build in builds.items()})
    for _, packs_of, _ in variants.values():
        for *_, packs in packs_of:
            for bits in ("fp32", "int8", "int4"):
                raw = packs[bits].reshape(-1).view(torch.uint8)
                packs[f"read-{bits}"] = raw[:raw.numel() // 8 * 8].view(torch.int64)  # (a tail of < 8 bytes left)
    acts = {k: torch.randn(args.rows, k) for k in {k for k, *_ in weights}}

    in_c = {(name, kind): StepInC(packs_of, acts, kind, args) for name, (_, packs_of, _) in variants.items()
            for kind in kinds if kind in IN_C_KINDS} if args.in_c else {}  # (--in-c: each variant's step of each kind)

    def step(build: ctypes.CDLL, weights: list, kind: str) -> float:
        start = time.perf_counter()
        for k, n, group, packed in weights:
            a = acts[k]
            if kind == "fp32":
                kernels.mm(a, packed["fp32"], n, lib=build)
            elif kind == "int8":
                kernels.mm_quant(a, packed["int8"], n, 8, k, lib=build)
            elif kind == "int4":
                kernels.mm_quant(a, packed["int4"], n, 4, group, lib=build)
            elif kind.startswith("read-"):
                packed[kind].sum()
            else:
                kernels.mm_quant(a, packed["int4"], n, 4, group, lib=build, int8_activations="integer")
        return time.perf_counter() - start

    stored = {kind: sum(p[READS.get(kind, kind)].numel() * (4 if READS.get(kind, kind) == "fp32" else 1)
                        for *_, p in weights) for kind in kinds}
    samples: dict[tuple[str, str], list[float]] = {(v, kind): [] for v in variants for kind in kinds}
    # (the default build is the library the process's other callers share: its setting is put back)
    before = {name: (build.kiln_gemm_huge_page_packs(), build.kiln_gemm_near_gemv()) for name, build in builds.items()}
    buffer = probe_buffer() if args.by_state else None
    probes = [read_bandwidth(args.threads, passes=ROUND_PROBE_PASSES, buffer=buffer)] if args.by_state else []
    try:
        for round_ in range(args.rounds):
            # (each round starting at the next variant: the read's ratio did not take out the first's
            # slowness, benchmarks/rounds.py)
            for name, (build, packs, reading) in rotated(list(variants.items()), round_):
                _set_reading(build, reading)
                for kind in kinds:
                    timed = in_c.get((name, kind))
                    samples[(name, kind)].append(timed.run(build) if timed else step(build, packs, kind))
            if args.by_state:
                probes.append(read_bandwidth(args.threads, passes=ROUND_PROBE_PASSES, buffer=buffer))
    finally:
        for name, build in builds.items():
            _set_reading(build, before[name])
    print(f"{args.model}: {len(weights)} products a step, {args.rows} row(s), {args.threads} threads, "
          f"median of {args.rounds} interleaved rounds; GB/s of the packed weights")
    for (name, kind), times in samples.items():
        t = statistics.median(times)
        line = f"{name:48s} {kind:8s} {t * 1e3:7.3f} ms  {stored[kind] / t / 1e9:5.3g} GB/s"  # (a slow round: not 0.0)
        if name != "default" and args.rounds >= 4:
            line += "  " + _ratio_line([x / y for x, y in zip(times, samples[("default", kind)])])
        print(line)
    if args.by_state:
        for state, rounds in rounds_by_state(probes).items():
            if not rounds:
                print(f"{state} state: no round between two agreeing probes")
                continue
            read = [(probes[i] + probes[i + 1]) / 2 for i in rounds]
            print(f"{state} state: {len(rounds)} rounds whose probes read {min(read):.1f}-{max(read):.1f} GB/s")
            for (name, kind), times in samples.items():
                t = statistics.median(times[i] for i in rounds)
                line = f"  {name:46s} {kind:8s} {t * 1e3:7.3f} ms  {stored[kind] / t / 1e9:5.3g} GB/s"
                if name != "default":
                    line += "  " + _ratio_line([times[i] / samples[("default", kind)][i] for i in rounds])
                print(line)
    for (name, kind), _ in samples.items():
        if in_c and (name, kind) in in_c:
            for shape, (calls, ms, gbps) in in_c[(name, kind)].per_shape(args.rounds).items():
                print(f"  {name:46s} {kind:8s} {shape}: {calls} a step, {ms:.3f} ms, {gbps:.3g} GB/s")


if __name__ == "__main__":
    main()
