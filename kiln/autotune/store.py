"""The autotune results kept on disk: one small JSON file per question, under
`<cache dir>/autotune/`, written atomically with a digest (kiln/disk_cache.py), so a torn
or edited file reads as a miss and is measured again.

A question's key names everything that decides its answer: the op, shapes and dtypes, the
candidate names, the thread count, the CPU and the torch version. Not kiln's own source: a change
to the compiler does not change which library call is fastest.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
from typing import Any

import torch

from kiln import disk_cache


@functools.cache
def _machine() -> str:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}|{torch.__version__}|{torch.backends.cpu.get_cpu_capability()}"


def question_key(op: str, signature: Any, candidates: list[str]) -> str:
    text = json.dumps([op, repr(signature), sorted(candidates), torch.get_num_threads(), _machine()])
    return hashlib.sha256(text.encode()).hexdigest()


def _path(key: str):
    return disk_cache.entry("autotune", key, ".json")


def locked(key: str):
    """Hold question `key` against other processes: the one that measures first answers for all,
    so processes sharing a cache agree on every choice (and do not time while the other times)."""
    return disk_cache.locked(_path(key))


def load(key: str) -> dict[str, Any] | None:
    data = disk_cache.read(_path(key))
    if data is None:
        return None
    try:
        result = json.loads(data)
    except ValueError:
        return None
    return result if isinstance(result, dict) and isinstance(result.get("choice"), str) else None


def save(key: str, result: dict[str, Any]) -> None:
    disk_cache.write(_path(key), json.dumps(result, indent=1).encode())
