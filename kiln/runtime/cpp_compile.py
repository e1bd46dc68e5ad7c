"""C++ source -> loaded shared library, cached on disk by content hash.

The key covers the source, the compiler's identity and the flags, so a cache entry is reused only
for exactly what produced it. Entries are written to a temporary name and renamed into place, then
their digest beside them; an entry whose digest is missing or does not match is rebuilt, never
loaded.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from kiln import config, logs

FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-finite-math-only"]


@functools.cache
def compiler() -> tuple[str, str]:
    cxx = os.environ.get("CXX", "g++")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    return cxx, version


def _build(source: str, target: Path) -> None:
    cxx, _ = compiler()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src, lib = Path(tmp) / "kernels.cpp", Path(tmp) / "kernels.so"
        src.write_text(source)
        done = subprocess.run([cxx, *FLAGS, str(src), "-o", str(lib)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"C++ compilation failed:\n{done.stderr[-4000:]}")
        os.replace(lib, target)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _intact(target: Path) -> bool:
    # The digest is written after the library is in place, so a missing or different digest
    # means a build that did not finish, or a file changed since.
    digest = target.with_suffix(".sha256")
    return target.exists() and digest.exists() and digest.read_text() == _digest(target)


def load_library(source: str) -> ctypes.CDLL:
    """The compiled and loaded library of `source`, from the cache when it holds it intact."""
    key = hashlib.sha256("\0".join([source, *compiler(), *FLAGS]).encode()).hexdigest()
    target = config.cache_dir() / "cpp" / key[:2] / f"{key}.so"
    if _intact(target):
        logs.log("cache", "C++ cache hit %s", key[:12])
    else:
        logs.log("cache", "C++ cache miss %s: compiling", key[:12])
        _build(source, target)
        digest = target.with_suffix(".sha256.tmp")
        digest.write_text(_digest(target))
        os.replace(digest, target.with_suffix(".sha256"))
    return ctypes.CDLL(str(target))
