"""What one benchmark case is, and what it measured: plain records that travel as JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

# Statuses: "ok" ran and was measured; "error" raised (see `error`, `phase`); "timeout" passed its
# time limit; "crash" died without a result (a signal, an abort); "n/a" the mode is not available.
STATUSES = ("ok", "error", "timeout", "crash", "n/a")


@dataclass(frozen=True)
class Case:
    """One (model, mode, threads) measurement on one device, run in its own subprocess."""

    model: str
    mode: str
    threads: int
    train: bool = False
    iters: int = 20
    warmup: int = 3
    autocast: str | None = None  # "bfloat16": inference under torch.autocast(device, dtype=torch.bfloat16)
    profile: bool = False  # also time each kernel and extern of kiln's graphs (benchmarks/profile.py)
    device: str = "cpu"  # "cuda": model and inputs on the GPU; the float64 reference stays on the CPU
    against: str | None = None  # a peer mode compiled in the same process and timed interleaved with this one
    dtype: str | None = None  # "bfloat16": the model cast with .to(dtype), floating inputs too; None: as built (float32)
    batch: int = 1  # the model's batch-1 inputs repeated along dim 0 this many times

    @property
    def lowers_precision(self) -> bool:
        """Whether the case computes in less than float32 (a cast model or autocast): its error is
        then also stated against a float32 eager run."""
        return self.dtype not in (None, "float32") or self.autocast is not None

    @property
    def label(self) -> str:
        device = f" · {self.device}" if self.device != "cpu" else ""
        against = f" (against {self.against})" if self.against else ""
        dtype = f" · {self.dtype}" if self.dtype else ""
        autocast = f" · {self.autocast} autocast" if self.autocast else ""
        batch = f" · batch {self.batch}" if self.batch != 1 else ""
        return (f"{self.model} · {self.mode}{against} · {self.threads} thread{'s' if self.threads > 1 else ''}"
                f"{device}{dtype}{autocast}{batch}")


@dataclass
class Result:
    case: Case
    status: str
    error: str | None = None  # first line of the error, or why a mode is not available
    phase: str | None = None  # build, reference, compile, accuracy, timing
    accuracy: str | None = None  # "pass" or "fail"
    accuracy_rule: str | None = None  # which step of the tolerance rule decided
    accuracy_detail: str | None = None
    max_abs_err: float | None = None
    compile_s: float | None = None  # wall time of the first compiled call (compilation included)
    compile_parts: dict[str, float] | None = None  # compile_s by part of kiln's compilation (worker._compile_parts)
    eager_ms: float | None = None  # median, interleaved with compiled_ms in the same process
    compiled_ms: float | None = None
    speedup: float | None = None  # eager_ms / compiled_ms
    peer_ms: float | None = None  # the `against` mode's median, interleaved with eager_ms and compiled_ms
    peer_compile_s: float | None = None
    peer_accuracy: str | None = None  # "pass" or "fail": the peer's outputs under the same rule
    peer_error: str | None = None  # the first line of the peer's failure; the case itself is still timed
    peak_rss_mb: float | None = None  # peak resident memory of the case's whole process
    graphs: int | None = None
    graph_breaks: int | None = None
    fallbacks: int | None = None  # graphs kiln failed to compile and ran eagerly: a failure
    wall_s: float | None = None  # the whole subprocess, start to end
    kernel_profile: dict | None = None  # benchmarks.profile.Profile.to_json(), when the case asked for one
    # Cases that lower precision (Case.lowers_precision): max |out - fp32 out| / max |fp32 out|, the
    # worst output's (with --train: the loss, and the gradients as one), against eager float32 on the CPU
    # from the same weights before the cast; the same figure for eager itself and for the peer.
    fp32_rel_err: float | None = None
    eager_fp32_rel_err: float | None = None
    peer_fp32_rel_err: float | None = None
    timing_wait_s: float | None = None  # on cuda: seconds waiting for the GPU while other cases timed theirs
    launches: float | None = None  # on cuda: kernel launches per call (a CUDA graph replay is one), launch_count.py
    waits: float | None = None  # on cuda: host waits for the GPU per call
    peer_launches: float | None = None
    peer_waits: float | None = None
    malloc: str | None = None  # what the case's process did to glibc's malloc (kiln/heap.py describe())

    @property
    def versus_peer(self) -> float | None:
        """compiled_ms / peer_ms: this mode's call against the peer's, timed in one process."""
        return self.compiled_ms / self.peer_ms if self.compiled_ms and self.peer_ms else None

    @property
    def passed(self) -> bool:
        return self.status == "ok" and self.accuracy == "pass" and not self.fallbacks

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self.case), **{f.name: getattr(self, f.name) for f in fields(self) if f.name != "case"}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Result":
        case_keys = {f.name for f in fields(Case)}
        case = Case(**{k: v for k, v in data.items() if k in case_keys})
        known = {f.name for f in fields(cls)}
        return cls(case=case, **{k: v for k, v in data.items() if k in known and k != "case"})
