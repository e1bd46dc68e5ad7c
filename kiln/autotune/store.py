"""The autotune results kept on disk: one small JSON file per question, under
`<cache dir>/autotune/`, written atomically with a digest (kiln/disk_cache.py), so a torn
or edited file reads as a miss and is measured again.

A question's key names everything that decides its answer: the op, shapes and dtypes, the
candidate names, the thread count, the CPU (`disk_cache.cpu_identity`: its model, the ISA
extensions GEMM speed turns on, and torch's CPU capability) and the torch version; where one of
the candidates is kiln's own kernel, also a digest of those kernels' source (a faster kiln GEMM
must be timed again, not lose to its older self's answers). Not the rest of kiln's source: a change to the compiler does not change
which library call is fastest.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

import torch

from kiln import disk_cache
from kiln.native import kernels_unit  # one translation unit holds all of kiln's CPU kernels


# How questions are measured; a change that makes older answers wrong (weights cycled through
# copies, kiln/autotune/gemm.py; convolutions too since 3; GEMMs called as graphs call them since
# 4; candidates that read the weight where it lies no longer read one copy in the same round since
# 5) bumps it, so they are measured again.
METHOD = 5


@functools.cache
def _kiln_kernels() -> str:
    return hashlib.sha256(kernels_unit.source().encode()).hexdigest()[:16]


def question_key(op: str, signature: Any, candidates: list[str]) -> str:
    kernels = _kiln_kernels() if any(name.startswith("kiln") for name in candidates) else ""
    text = json.dumps([op, repr(signature), sorted(candidates), torch.get_num_threads(), disk_cache.cpu_identity(),
                       torch.__version__, METHOD, kernels])
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
    if not isinstance(result, dict) or not isinstance(result.get("choice"), str):
        return None
    if _unmeasured(result):
        return None  # (stored before 2026-12-01: asked again)
    return result


def _unmeasured(result: dict[str, Any]) -> bool:
    """An answer where no candidate ran (every one raised): a choice nothing measured."""
    seconds = result.get("seconds")
    return result.get("rounds") == 0 and isinstance(seconds, dict) and bool(seconds) and \
        all(t == float("inf") for t in seconds.values())


def save(key: str, result: dict[str, Any]) -> None:
    disk_cache.write(_path(key), json.dumps(result, indent=1).encode())
