"""Which implementation runs a GEMM or a convolution over a frozen weight, by measurement.

The candidates are the implementations of `kiln::mm` and `kiln::conv` (kiln/externs/prepacked.py),
called as compiled graphs call them, every one that can run the dtype, in either autotune mode
(`backend.gemm_candidates` may narrow the GEMM's), run on random tensors of the node's shapes, dtypes and strides. The weight's packing
is done in each candidate's warm-up run, so only the steady state is timed; the candidates run
interleaved, so every packed copy of the trial weight exists while the question is measured
(a few times the weight's memory) and all are dropped when it is answered. A GEMM's candidates
cycle through several copies of a small weight, so that each call reads its weight from beyond L2,
as in a model (`weight_copies`). A candidate that raises (a library without that dtype) is out.
"""

from __future__ import annotations

import functools
import warnings
from pathlib import Path
from typing import Callable

import torch

from kiln import config
from kiln.autotune.choose import choose
from kiln.autotune.record import spec
from kiln.externs import native_ops
from kiln.externs.prepacked import CONV_IMPLS, MM_IMPLS, drop_packs, kiln_conv_applies

# Timing budget per question in seconds of timed runs (all candidates together), and the most
# interleaved rounds: the default search, and mode="max-autotune"'s.
BUDGET = {"default": 0.25, "max-autotune": 1.5, "record": 0.25}  # (record: for questions that cannot be recorded)
ROUNDS = {"default": 15, "max-autotune": 50, "record": 15}


class Inputs:
    """Random tensors like the fake values a question is about, made on first use by a
    candidate: a question answered from the cache never pays for them (filling them was most of
    a cold BERT compile's autotuning time), and they are drawn from a generator of their own, so
    compiling never moves the user's random stream."""

    def __init__(self, copies: dict[str, str] | None = None, **like: tuple[torch.Tensor | None, torch.memory_format | None]) -> None:
        """`copies`: names made as a clone of another's tensor (a weight's copies: cloning is four
        times faster than drawing, and a GEMM's speed does not depend on the values)."""
        self._like, self._made, self._copies = like, {}, copies or {}
        self._generator = torch.Generator().manual_seed(0)

    def __getattr__(self, name: str) -> torch.Tensor | None:
        made = self.__dict__.get("_made")
        if made is None or name not in self._like:
            raise AttributeError(name)
        if name not in made:
            val, memory_format = self._like[name]
            original = self._copies.get(name)
            made[name] = None if val is None else getattr(self, original).clone() if original else self._random(val, memory_format)
        return made[name]

    def made(self, name: str) -> torch.Tensor | None:
        """The tensor `name` if a candidate has made it, without making it."""
        return self._made.get(name)

    def _random(self, val: torch.Tensor, memory_format: torch.memory_format | None) -> torch.Tensor:
        if memory_format is not None:
            return torch.randn(tuple(val.shape), dtype=val.dtype, generator=self._generator).contiguous(memory_format=memory_format)
        shape, stride = tuple(val.shape), tuple(val.stride())
        if 0 in stride and 0 not in shape:
            # Elements that share memory (an expanded dimension: grouped-query attention's keys and
            # values repeated over the query heads): the memory drawn, then seen with those strides
            # (`normal_` refuses to write such a tensor, which left every candidate out).
            extent = 1 + sum((n - 1) * st for n, st in zip(shape, stride))
            return torch.empty(extent, dtype=val.dtype).normal_(generator=self._generator).as_strided(shape, stride)
        return torch.empty_strided(shape, stride, dtype=val.dtype).normal_(generator=self._generator)


def _strides(val: torch.Tensor, memory_format: torch.memory_format | None) -> tuple[int, ...]:
    """The strides `Inputs` gives a tensor like `val` (without making it)."""
    if memory_format is None:
        return tuple(val.stride())
    return tuple(torch.empty(tuple(val.shape), dtype=val.dtype, device="meta").contiguous(memory_format=memory_format).stride())


def no_grad(candidates: dict[str, Callable[[], object]]) -> dict[str, Callable[[], object]]:
    def wrap(run: Callable[[], object]) -> Callable[[], object]:
        def go() -> object:
            with torch.no_grad():
                return run()
        return go

    return {name: wrap(run) for name, run in candidates.items()}


# What an `MM_IMPLS` entry can run, where it is less than float32 and bfloat16 on any CPU torch
# runs on. A new entry (kiln's own GEMM) not named here is offered for both dtypes; one that
# raises RuntimeError for a dtype all the same is simply out of that question.
_MM_DTYPES = {"mkl": (torch.float32,)}
_MM_AVAILABLE = {"mkl": torch.backends.mkl.is_available, "onednn": torch.backends.mkldnn.is_available}
_DEFAULT_DTYPES = (torch.float32, torch.bfloat16)

# The candidates that apply a unary post-op inside the GEMM, and the `MM_IMPLS` entry each calls
# with it (every other candidate is timed followed by the op as ATen runs it).
FUSED_POST_OP = "onednn_post_op"
FUSED_POST_OPS = {FUSED_POST_OP: "onednn", "kiln_post_op": "kiln"}


def _runs(name: str, dtype: torch.dtype) -> bool:
    available = _MM_AVAILABLE.get(name)
    return dtype in _MM_DTYPES.get(name, _DEFAULT_DTYPES) and (available is None or available())


def allowed_candidates() -> frozenset[str] | None:
    """The GEMM candidates `backend.gemm_candidates` allows (ATen always among them), or None for all.

        KILN_GEMM_CANDIDATES=mkl,kiln  ->  frozenset({"aten", "mkl", "kiln"})
    """
    names = config.backend.gemm_candidates
    if not names:
        return None
    accepted = [*MM_IMPLS, *FUSED_POST_OPS]
    unknown = [name for name in names if name not in accepted]
    if unknown:
        message = (f"setting backend.gemm_candidates (KILN_GEMM_CANDIDATES) names {unknown[0]!r}, which is no GEMM "
                   f"implementation; accepted: {', '.join(accepted)} (aten is always a candidate)")
        _warn_once(message)  # the pass's error makes the graph run eagerly, recorded but silent
        raise ValueError(message)
    return frozenset(("aten", *names))


@functools.cache
def _warn_once(message: str) -> None:
    warnings.warn(message, stacklevel=3)


def mm_impls(dtype: torch.dtype) -> list[str]:
    """The plain mm candidates for `dtype`: every `MM_IMPLS` entry that can run it, in the table's
    order (ATen first: a tie goes to it, no copy of the weight), less those the setting
    `backend.gemm_candidates` leaves out.

        mm_impls(torch.bfloat16)  # ["aten", "aten_kn", "aten_nk", "onednn"]
    """
    allowed = allowed_candidates()
    return [name for name in MM_IMPLS if _runs(name, dtype) and (allowed is None or name in allowed)]


def _fused_impls(dtype: torch.dtype) -> dict[str, str]:
    """The fused post-op candidates for `dtype`: allowed by name, or by their GEMM's name."""
    allowed = allowed_candidates()
    return {fused: impl for fused, impl in FUSED_POST_OPS.items()
            if impl in MM_IMPLS and _runs(impl, dtype) and (allowed is None or fused in allowed or impl in allowed)}


def timing_value(val: torch.Tensor) -> torch.Tensor:
    """`val`, or where its sizes are symbolic, a meta tensor of the size bucket its example
    size falls in (the next power of two): a graph compiled once for all sizes is tuned for the
    bucket of the call that compiled it, and the answer is kept per bucket."""
    if all(isinstance(s, int) for s in val.shape):
        return val
    shape = [s if isinstance(s, int) else 1 << max(0, int(s.node.hint) - 1).bit_length() for s in val.shape]
    return torch.empty(shape, dtype=val.dtype, device="meta")


# The plain GEMM a tie goes to (the others keep the table's order, ATen first). The weights are
# timed from L3 (copies of a few MB in turn); in a model they come from DRAM, where kiln's GEMM,
# which asks for the next panel while it computes the current one, loses least: at T5's
# 128x512x512 with 48 copies in turn (2 threads, Intel Xeon) kiln 274 GFLOP/s, MKL 259, ATen 240
# and 226 (its transposed copy), where the autotuner had timed kiln 2 % ahead of the transposed copy.
TIES_TO = "kiln"


def _ties_first(names) -> list[str]:
    """`names` with TIES_TO first (choose() gives a tie to the earlier candidate), the rest in order."""
    return sorted(names, key=lambda name: name != TIES_TO)


def choose_mm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, mode: str = "default",
              post_op: tuple[str, list, str] = ("none", [], ""), weights_from_dram: bool = False) -> str:
    """The fastest `kiln::mm` implementation for fake or meta values `a` [M, K], `b` [K, N].

    With a unary `post_op`, each candidate is timed followed by it as ATen runs it (what kiln's
    kernel after the GEMM costs, roughly), and those of `FUSED_POST_OPS` also with the op inside
    their GEMM: that candidate's name when it wins. `weights_from_dram` (the graph's products read
    more weight bytes a call than the last-level cache keeps, `streams_weights`): a memory-bound
    product is timed on weights read from DRAM (`STREAMED_ROWS`)."""
    names = _ties_first(mm_impls(a.dtype))
    streamed = weights_from_dram and memory_bound(a)
    copies = streamed_copies(b) if streamed else weight_copies(b)
    weights = [f"b{k}" for k in range(copies)]
    r = Inputs({name: "b0" for name in weights[1:]}, a=(a, None), bias=(bias, None), **{name: (b, None) for name in weights})
    unary, scalars, algorithm = post_op
    apply_post_op = native_ops.direct("post_op")
    after = (lambda y: y) if unary == "none" else lambda y: apply_post_op(y, unary, scalars, algorithm or None)  # noqa: E731
    plain = lambda f: lambda b: after(f(r.a, b, r.bias, "none", [], None))  # noqa: E731
    fused = lambda f: lambda b: f(r.a, b, r.bias, unary, scalars, algorithm or None)  # noqa: E731
    runs = {name: plain(mm_call(name)) for name in names}
    signature = (tuple(a.shape), tuple(b.shape), tuple(b.stride()), str(a.dtype), bias is not None)
    if unary != "none":  # signatures of plain GEMMs as before, so their cache entries stay valid
        for name, impl in _fused_impls(a.dtype).items():
            runs[name] = fused(mm_call(impl))
        signature += (unary, tuple(scalars), algorithm)
    candidates = _rotating(r, weights, runs)
    if streamed:  # (likewise)
        signature += ("weights from DRAM",)

    question = lambda: {"op": "mm", "a": spec(a), "b": spec(b), "bias": spec(bias),  # noqa: E731
                        "post_op": [unary, list(scalars), algorithm], "weights_from_dram": weights_from_dram}
    return choose("mm", signature, no_grad(candidates), BUDGET[mode], ROUNDS[mode], cleanup=_dropping_packs(r, weights),
                  question=question, default="aten")


def mm_call(impl: str) -> Callable:
    """`impl` of kiln::mm as compiled graphs call it, `(a, b, bias, unary, scalars, algorithm)`:
    kiln's runtime's function itself, without the dispatcher (kiln/externs/native_ops.py
    `direct`), so that each candidate pays per call what it pays in a graph."""
    mm = native_ops.direct("mm")
    return lambda a, b, bias, unary, scalars, algorithm: mm(a, b, bias, unary, scalars, algorithm, impl)


# In a model, a GEMM's weight was last read a layer ago and comes from L3 or DRAM, while its input
# was just written. Timed on one weight, every call after the first would find that weight in L2:
# ATen's plain GEMM, which repacks the weight inside every call, then looks as fast as the packed
# ones, and in the model it is not (T5's 128x512x512 projections: 0.31 ms a call with ATen's, 0.21
# with MKL's packed GEMM; 2-core Intel Xeon). So each candidate cycles through copies of the weight
# that together exceed the caches a core has (a weight this large or larger is timed alone).
WEIGHT_STREAM_BYTES = 16 << 20
MAX_WEIGHT_COPIES = 8


def weight_copies(b: torch.Tensor) -> int:
    """How many copies of a weight like `b` a GEMM question times its candidates on."""
    nbytes = max(1, b.numel() * b.element_size())
    return max(1, min(MAX_WEIGHT_COPIES, -(-WEIGHT_STREAM_BYTES // nbytes)))


# A decoder generating text reads every weight once per token: its products have a row or a few
# (memory-bound: at 8 rows an fp32 product does 4 FLOP per weight byte, bf16 8, under any CPU's
# ratio of FLOP/s to DRAM bytes/s), and a model of more weight bytes than the last-level cache holds
# reads them all from DRAM. Timed from L3, as above, the candidate that computes fastest wins; from
# DRAM, the one that streams best, and they differ: llama-160m's LM head, 1x768 @ 768x32000 on a
# 2-core Intel Xeon (260 MB L3), took 2.40 ms with ATen's GEMM and 3.20 with its transposed copy
# from L3, 3.51 and 3.25 ms from DRAM. So a memory-bound product of such a graph is timed on copies
# of its weight as large together as the last-level cache: each copy is evicted before a candidate
# comes back to it, also in the rounds where the close two run alone.
STREAMED_ROWS = 8
MAX_STREAMED_COPIES = 256


def memory_bound(a: torch.Tensor) -> bool:
    """Whether a product of `a`'s rows is bound by reading its weight (`STREAMED_ROWS`)."""
    return a.shape[0] <= STREAMED_ROWS


# What of the last-level cache a graph's weights, read in turn every call, find there again the next
# call: a quarter. The cache a virtual machine reports is its host's whole socket's, which other
# guests share: a 2-core Intel Xeon with AMX reports 480 MB of L3, yet a buffer read again and again
# came at 49 GB/s up to 64 MB, 36 at 128 MB and DRAM's 21-22 from 240 MB on. Timed as from L3,
# llama-160m's float32 decode products (452 MB of weights) took ATen's GEMM, which streams slower:
# its decode graph 15.5 ms a call, 13.0-14.2 with the products timed from DRAM (13.0 all kiln's GEMV).
CACHE_KEPT_FRACTION = 4


def streams_weights(weight_bytes: int) -> bool:
    """Whether a graph whose products read `weight_bytes` of weights a call reads them from DRAM:
    more than the part of the last-level cache they would find again (`CACHE_KEPT_FRACTION`)."""
    return weight_bytes > last_level_cache_bytes() // CACHE_KEPT_FRACTION


def streamed_copies(b: torch.Tensor) -> int:
    """How many copies of a weight like `b` time a question on weights from DRAM."""
    nbytes = max(1, b.numel() * b.element_size())
    return max(1, min(MAX_STREAMED_COPIES, -(-last_level_cache_bytes() // nbytes)))


# Where the system says nothing (not Linux), a last-level cache larger than most: a graph's weights
# are taken to stream from DRAM only when they surely do.
_UNKNOWN_LLC_BYTES = 256 << 20


@functools.cache
def last_level_cache_bytes() -> int:
    """The size of the largest cache the first CPU reports (Linux's sysfs: L3 on x86, L2 or the
    system-level cache elsewhere). On a virtual machine it is the host's whole socket's, shared
    with other guests: an upper bound of what this process keeps."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes, default=_UNKNOWN_LLC_BYTES)


def _rotating(r: Inputs, weights: list[str], runs: dict[str, Callable[[torch.Tensor], object]]) -> dict[str, Callable[[], object]]:
    """Each candidate of `runs` as one that runs on the next copy of the weight at each call; its
    first call (the untimed warm-up) runs on every copy, so each is packed before the timed rounds.
    The candidates start at copies spread evenly over the ring: those that read the weight where
    it lies (ATen's, which pack nothing) would otherwise read the same copy in the same round, the
    later one from the cache the earlier one just filled (from DRAM, ATen's 768x768 GEMV timed 67 us
    after ATen's other call on its copy, where the model's read it in 90)."""
    def rotation(run: Callable[[torch.Tensor], object], start: int) -> Callable[[], object]:
        turn = [-1]

        def go() -> object:
            if turn[0] < 0:
                turn[0] = start
                for k, name in enumerate(weights):
                    if k != start:
                        run(getattr(r, name))
                return run(getattr(r, weights[start]))
            turn[0] = (turn[0] + 1) % len(weights)
            return run(getattr(r, weights[turn[0]]))

        return go

    return {name: rotation(run, i * len(weights) // len(runs)) for i, (name, run) in enumerate(runs.items())}


def _dropping_packs(r: Inputs, weights: list[str]) -> Callable[[], None]:
    """A question's cleanup: the packed forms of the weight copies it made, dropped."""
    def cleanup() -> None:
        for name in weights:
            if r.made(name) is not None:
                drop_packs(r.made(name))

    return cleanup


def choose_conv(x: torch.Tensor, x_channels_last: bool, w: torch.Tensor, bias: torch.Tensor | None, conv_args: tuple,
                unary: str, scalars: list, algorithm: str | None, other: torch.Tensor | None, mode: str = "default",
                *, channels_last_only: bool = False) -> str:
    """The fastest `kiln::conv` implementation, post-ops included: ATen's convolution on the
    input as it arrives, ATen on channels-last data, oneDNN with a blocked weight and the
    post-ops fused, or, for a depthwise or a 1x1 stride-1 convolution, kiln's own kernel (the
    latter its GEMM). Input that arrives channels-last (from an earlier rewritten convolution)
    leaves ATen's own layout out: its convolution on such data takes a slow path; so does
    `channels_last_only`, where the graph's layout was decided for it (conv_prepack.py)."""
    stride, padding, dilation, groups = conv_args
    arriving = torch.channels_last if x_channels_last else None
    weights = [f"w{k}" for k in range(weight_copies(w))]
    r = Inputs({name: "w0" for name in weights[1:]}, x=(x, arriving), bias=(bias, None), other=(other, arriving),
               **{name: (w, None) for name in weights})
    names = [n for n in CONV_IMPLS if not ((x_channels_last or channels_last_only) and n == "aten")
             and (n != "kiln" or kiln_conv_applies(x, w, stride, padding, dilation, groups))]
    conv = native_ops.direct("conv")
    candidates = _rotating(r, weights, {name: lambda w, impl=name: conv(
        r.x, w, r.bias, stride, padding, dilation, groups, unary, scalars, algorithm, r.other, impl)
        for name in _ties_first(names)})
    signature = (tuple(x.shape), _strides(x, arriving), tuple(w.shape), str(x.dtype), bias is not None, tuple(stride),
                 tuple(padding), tuple(dilation), groups, unary, tuple(scalars), algorithm, other is not None)
    question = lambda: {"op": "conv", "x": spec(x), "x_channels_last": x_channels_last, "w": spec(w),  # noqa: E731
                        "bias": spec(bias), "conv_args": [list(stride), list(padding), list(dilation), groups],
                        "unary": unary, "scalars": list(scalars), "algorithm": algorithm, "other": spec(other),
                        "channels_last_only": channels_last_only}
    return choose("conv", signature, no_grad(candidates), BUDGET[mode], ROUNDS[mode], cleanup=_dropping_packs(r, weights),
                  question=question, default="onednn")  # what backend.autotune=off runs
