"""Files in kiln's on-disk caches: written atomically, each with a digest beside it, and read back
only when the digest matches, so a torn or corrupted entry reads as a miss and is rebuilt."""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from pathlib import Path

from kiln import config


def entry(kind: str, key: str, suffix: str) -> Path:
    """Where the entry `key` of cache `kind` lives: <cache dir>/<kind>/<key[:2]>/<key><suffix>."""
    return config.cache_dir() / kind / key[:2] / f"{key}{suffix}"


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def intact(path: Path) -> bool:
    """The file exists and matches the digest written after it was complete."""
    check = _digest_path(path)
    return path.exists() and check.exists() and check.read_text() == digest(path)


def _replace_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    os.replace(temp, path)


def seal(path: Path) -> None:
    """Mark a complete file valid by writing its digest (the last step of every write)."""
    _replace_atomically(_digest_path(path), digest(path).encode())


def write(path: Path, data: bytes) -> None:
    _replace_atomically(path, data)
    seal(path)


def read(path: Path) -> bytes | None:
    """The entry's bytes, or None when missing or not intact."""
    return path.read_bytes() if intact(path) else None


@functools.cache
def kiln_fingerprint() -> str:
    """A hash of kiln's own source: any change to the compiler invalidates what it cached."""
    root = Path(__file__).resolve().parent  # the kiln package
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".h") and "bench" not in path.parts:
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()
