"""The memory roofline of text generation: how fast this machine reads memory, and how many bytes a
decode step of a decoder LM must read.

A decode step at small batch is a matrix-vector product per weight: every weight is read once per
step and used for `batch` multiply-adds, so its time is bounded below by bytes / bandwidth.

    gbps = read_bandwidth(threads=2)                                  # e.g. 26.8
    step = decode_step_bytes(model, "fp32", batch=1, cache_len=192)
    fraction = step.total / seconds_per_step / 1e9 / gbps             # 1.0: at the roofline
"""

from __future__ import annotations

import ctypes
import math
import mmap
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from benchmarks.peak import best_seconds

# Bytes per weight of a linear layer as each mode stores it.
BYTES_PER_WEIGHT = {"fp32": 4.0, "bf16": 2.0, "int8": 1.0, "int4": 0.5}
# The rule's scales and zero points (where the quantized tensors are not at hand): float32, one scale
# per output channel (int8), a scale and a zero point per group of input channels (int4).
SCALE_BYTES = 4
DEFAULT_GROUP_SIZE = 128

_BUFFER_BYTES = 1 << 30  # far beyond any CPU's last-level cache
_PASSES = 4  # best of this many passes per way of reading, after one warm-up pass
_ROWS = 16384


ROUND_PROBE_PASSES = 2  # a probe between the timed calls of a benchmark: ~0.3 s at 40 GB/s
# A call's probes (before and after it) agree when the larger is at most this times the smaller:
# the probe of a steady machine moves by a few percent, a change of state (34 -> 62 GB/s) by 1.8x.
BRACKET_AGREEMENT = 1.2


def probes_agree(before: float, after: float) -> bool:
    """Whether two probes around a call read alike (within BRACKET_AGREEMENT): the machine stayed
    in one state while the call ran, so the call likely ran at that bandwidth."""
    return max(before, after) <= BRACKET_AGREEMENT * min(before, after)


_HUGE_PAGE = 2 << 20


def probe_buffer(buffer_bytes: int = _BUFFER_BYTES) -> torch.Tensor:
    """A buffer for `read_bandwidth` to read again and again (made once: filling 1 GiB takes longer
    than reading it), on 2 MB pages where the kernel gives them (transparent huge pages, advised):
    kiln reads its packed weights from such pages (backend.huge_pages), and on 4 KB pages a plain
    read of the same memory runs far slower (2 threads of a 2-core AMD EPYC VM: 36 against 65
    GB/s), so a probe on 4 KB pages would understate the machine. Where the kernel refuses the
    advice the pages are 4 KB, as before."""
    return huge_page_bytes(buffer_bytes // 4 * 4).view(torch.float32).uniform_()


def probe_ready(buffer_bytes: int = _BUFFER_BYTES) -> torch.Tensor:
    """`probe_buffer`'s buffer with kiln's line reader (`lines_read`) built: what a first probe
    would otherwise do inside its clock (benchmarks/machine.py `OthersClock`). Its C++ compiles in
    other processes, which read as "other processes used 41-48 % of the CPUs" on an idle 2-core
    Intel Xeon (a first probe of 21.7 s; 0.94 s, 0.1-0.6 %, once built)."""
    buffer = probe_buffer(buffer_bytes)
    lines_read(buffer)
    return buffer


def huge_page_bytes(nbytes: int) -> torch.Tensor:
    """`nbytes` bytes (uint8, uninitialized zeros), starting at a 2 MB boundary, in memory advised
    as transparent huge pages: 2 MB pages where the kernel gives them, 4 KB pages where it
    refuses the advice (benchmarks/tools/quant_decode_sweep.py lays packed weights there too)."""
    memory = mmap.mmap(-1, nbytes + _HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    offset = -ctypes.addressof(ctypes.c_char.from_buffer(memory)) % _HUGE_PAGE
    try:
        memory.madvise(mmap.MADV_HUGEPAGE, offset, nbytes // _HUGE_PAGE * _HUGE_PAGE)
    except (AttributeError, OSError):  # (no MADV_HUGEPAGE here, or a kernel without THP)
        pass
    return torch.frombuffer(memory, dtype=torch.uint8, count=nbytes, offset=offset)


def read_bandwidth(threads: int | None = None, buffer_bytes: int = _BUFFER_BYTES, passes: int = _PASSES,
                   buffer: torch.Tensor | None = None) -> float:
    """GB/s of the fastest read-only pass over a float32 buffer of `buffer_bytes` (1 GiB), at
    `threads` torch threads (default: the current count). Four reductions, each reading every
    byte once: `torch.sum`, `torch.amax`, a `torch.dot` of the buffer's two halves and the sums of
    its rows (16384 rows: each thread reads several rows at once). Which one reaches the bandwidth
    depends on the machine, so the best is kept: on a 2-core AMD EPYC (Zen 4) at 2 threads the
    row sums read 57 GB/s in a process where `torch.sum` read 35, and kiln's float32 decode steps
    had streamed their weights at 43 (a 4 KB-page buffer, before `probe_buffer` asked for 2 MB
    pages). A fifth read is kiln's own (`lines_read`): on the Intel Xeon with AMX it read 36.7 GB/s
    where ATen's best read 33.2-33.5. `buffer`: one made by `probe_buffer` (else one of
    `buffer_bytes` is made now)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        buffer = probe_buffer(buffer_bytes) if buffer is None else buffer
        half = buffer.numel() // 2
        count = min(_ROWS, buffer.numel())
        rows = buffer[:buffer.numel() // count * count].view(count, -1)
        reads = [lambda: torch.sum(buffer), lambda: torch.amax(buffer),
                 lambda: torch.dot(buffer[:half], buffer[half:2 * half]), lambda: rows.sum(1), lines_read(buffer)]
        seconds = min(best_seconds(read, passes) for read in reads)
    finally:
        torch.set_num_threads(before)
    return buffer.numel() * 4 / seconds / 1e9


# kiln's line reader (kiln_gemm_quant.h `read_pieces`): one load a 64-byte line, each thread's share in
# LINE_RUNS runs read side by side, each line also asked for LINE_AHEAD bytes ahead; the reading
# of Qwen2-0.5B's packs that was fastest on the Intel Xeon with AMX (2026-12-03: 2 runs, 3 KB).
LINE_RUNS, LINE_AHEAD = 2, 3072


def lines_read(buffer: torch.Tensor) -> Any:
    """A call that reads every line of `buffer` (contiguous) once with kiln's line reader, at the
    current thread count (benchmarks/kernels.py builds it for this machine on first use)."""
    from benchmarks import kernels  # (the GEMM's unit: built only when a probe runs)

    lib = kernels.library()
    pieces, sizes = (ctypes.c_void_p * 1)(buffer.data_ptr()), (ctypes.c_int64 * 1)(buffer.numel() * buffer.element_size())
    return lambda: lib.kiln_read_pieces(1, pieces, sizes, LINE_RUNS, LINE_AHEAD, None)


@dataclass(frozen=True)
class StepBytes:
    """The bytes one decode step reads, by kind: the linear layers' weights (their scales and
    biases, the LM head included even when it is the embedding's tensor), one embedding row per
    sequence, every other parameter and buffer (norms, rotary frequencies), and the KV cache's
    keys and values at the average cache length. `source`: "rule" (bytes per weight of the mode)
    or "tensors" (the quantized layers' own tensors)."""

    linear: int
    embedding: int
    other: int
    kv_cache: int
    source: str = "rule"

    @property
    def total(self) -> int:
        return self.linear + self.embedding + self.other + self.kv_cache

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total}


def linear_names(model: nn.Module) -> list[str]:
    """The names of the model's nn.Linear layers (record them before a quantization replaces them)."""
    return [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]


def rule_linear_bytes(out_features: int, in_features: int, weights: str, group_size: int = DEFAULT_GROUP_SIZE) -> int:
    """Bytes of one linear layer's weight stored as `weights`, with its scales and zero points."""
    size = out_features * in_features * BYTES_PER_WEIGHT[weights]
    if weights == "int8":
        size += out_features * SCALE_BYTES
    elif weights == "int4":
        size += out_features * math.ceil(in_features / group_size) * SCALE_BYTES  # its zero in the scale's low bits
    return int(size)


def _tensors(module: nn.Module) -> list[torch.Tensor]:
    return [*module.parameters(), *module.buffers()]


def _read_tensors(module: nn.Module) -> list[torch.Tensor]:
    """A layer's tensors as kiln's GEMM reads them: a quantized int4 layer's zero points ride in
    the low bits of its scales in the packed weight (kiln_gemm_quant.h), not read apart."""
    zeros = getattr(module, "zeros", None)
    return [t for t in _tensors(module) if t is not zeros]


def _linear_bytes(module: nn.Module, weights: str, from_tensors: bool) -> int:
    if from_tensors or weights == "fp32" or not isinstance(module, nn.Linear):
        # (A layer a quantization replaced is read as it now is: its own tensors.)
        return sum(t.nbytes for t in {id(t): t for t in _read_tensors(module)}.values())
    bias = module.bias.nbytes if module.bias is not None else 0  # (biases stay float32)
    return rule_linear_bytes(module.out_features, module.in_features, weights) + bias


def kv_cache_bytes(config: Any, batch: int, cache_len: float, element_bytes: int = 4) -> int:
    """Keys and values of every layer over `cache_len` positions."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return int(config.num_hidden_layers * 2 * batch * heads * head_dim * cache_len * element_bytes)


def decode_step_bytes(model: nn.Module, weights: str, batch: int, cache_len: float, linears: list[str] | None = None,
                      from_tensors: bool = False) -> StepBytes:
    """The bytes one decode step of `model` reads with its linear layers stored as `weights`.

    `linears`: the names of the layers that were nn.Linear before a quantization (default: those
    that are now); `from_tensors`: count those layers by their own tensors (after a quantization)
    rather than by the rule of `weights`. `cache_len`: the KV cache's length averaged over the
    decode steps.
    """
    names = linear_names(model) if linears is None else linears
    counted: set[int] = set()
    linear = 0
    for name in names:
        module = model.get_submodule(name)
        linear += _linear_bytes(module, weights, from_tensors)
        counted.update(id(t) for t in _tensors(module))
    embedding = 0
    for module in model.modules():
        if isinstance(module, nn.Embedding):  # one row per sequence (a tied LM head's full read is counted above)
            embedding += batch * module.embedding_dim * module.weight.element_size()
            counted.add(id(module.weight))
    other = sum(t.nbytes for t in {id(t): t for t in _tensors(model)}.values() if id(t) not in counted)
    return StepBytes(linear, embedding, other, kv_cache_bytes(model.config, batch, cache_len),
                     "tensors" if from_tensors else "rule")
