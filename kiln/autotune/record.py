"""Offline autotuning: the questions a first run asks, recorded; their answers measured later.

Online tuning measures each GEMM, convolution and attention question at the first compile that asks
it: minutes for a large model, inside the user's first call. With `backend.autotune=record`
(`KILN_AUTOTUNE=record`) a question the autotune cache cannot answer is not measured: it is
appended to the record log (`backend.autotune_log`, `KILN_AUTOTUNE_LOG`; by default
`<cache dir>/autotune/recorded.jsonl`), one JSON line holding what asks it again (the operands'
shapes, strides and dtypes, the op's flags, the thread count), and the call takes what
`backend.autotune=off` runs (ATen's GEMM and attention, oneDNN's convolution). Questions the cache
answers are answered as always. Later, `kiln autotune --answer LOG` (kiln/autotune/cli.py) asks
each recorded question again with measuring on, at its thread count, and the answers go to the
autotune cache as every answer does; the next run reads them and measures nothing.

    KILN_AUTOTUNE=record python serve.py           # runs at once, with the fixed choices
    kiln autotune --answer ~/.cache/kiln/autotune/recorded.jsonl
    python serve.py                                # reads every answer, measures nothing
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from kiln import config


def spec(t: torch.Tensor | None) -> dict[str, Any] | None:
    """What a question needs of an operand: its shape, strides and dtype (None stays None)."""
    if t is None:
        return None
    return {"shape": [_hint(s) for s in t.shape], "stride": [_hint(s) for s in t.stride()], "dtype": str(t.dtype)}


def _hint(size: int | torch.SymInt) -> int:
    # A symbolic size's example value, read without a guard (int() would specialize the graph to it).
    return int(size.node.hint) if isinstance(size, torch.SymInt) else int(size)


def tensor(described: dict[str, Any] | None) -> torch.Tensor | None:
    """A meta tensor as `spec` described it: what the question functions time random tensors like."""
    if described is None:
        return None
    dtype = getattr(torch, described["dtype"].removeprefix("torch."))
    return torch.empty_strided(described["shape"], described["stride"], dtype=dtype, device="meta")


def recording() -> bool:
    return config.backend.autotune == "record"


def log_path() -> Path:
    return Path(config.backend.autotune_log or config.cache_dir() / "autotune" / "recorded.jsonl")


def record(question: dict[str, Any]) -> None:
    """Append `question` (with this process's thread count, which its answer depends on) to the log."""
    path = log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({**question, "threads": torch.get_num_threads()}, sort_keys=True) + "\n"
    # One write of one line to a file opened for appending: processes recording at once interleave
    # whole lines.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def recorded(path: str | Path) -> list[dict[str, Any]]:
    """The distinct questions of a record log, in the order first asked; ValueError for a line
    that is not one."""
    seen: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            question = json.loads(line)
        except ValueError as error:
            raise ValueError(f"{path}:{number}: not a JSON line ({error})") from None
        if not isinstance(question, dict) or question.get("op") not in ("mm", "conv", "attention"):
            raise ValueError(f"{path}:{number}: not an autotune question")
        seen.setdefault(json.dumps(question, sort_keys=True), question)
    return list(seen.values())
