"""C++ sources -> one loaded shared library, cached on disk by content hash (kernels and kiln's GEMM).

A graph's kernels come as several translation units, compiled to objects by parallel compiler
processes (`backend.compile_workers`) and linked into one library. The key covers every source,
the compiler's identity and the flags (`-march=native`: the ISA is the machine's, chosen when the
kernels are built on it), so a cache entry is reused only for exactly what produced it. Entries
are written to a temporary name and renamed into place, then their digest beside them
(disk_cache.py); an entry whose digest is missing or does not match is rebuilt, never loaded.
Processes sharing the cache build a key one at a time (an advisory lock on the entry): the second
waits for the first and loads its library. Units that many libraries share (kiln's runtime in
every exported model) keep their objects in a cache of their own, so only the units that differ
are compiled again.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Collection, Sequence

from kiln import config, logs
from kiln import disk_cache

# -O2: as fast as -O3 for explicitly vectorized kernels, and compiles several times faster.
# -fno-math-errno: eager never reads errno, and with it sqrt is one vector instruction.
# -ffp-contract=off: GCC's default (fast) fuses a * b + c into one FMA, which rounds once where eager's
# kernels round twice; next to a cancellation that is a large relative difference (1 - x * x near
# x = 1: asin's and atanh's gradients missed float32 tolerances). Inductor compiles with it off too;
# kiln_vec_math.h asks for its FMAs explicitly (std::fma), so they stay.
# -mprefer-vector-width=512: kiln's vectors are a whole register wide (kiln_vec.h), but GCC's
# default for recent Intel CPUs (256) made it split the lane loops of the vector math (erf, exp,
# tanh) into halves and recombine them: GELU in kiln's GEMM epilogue cost 0.31 ms on a BERT-base
# FFN GEMM instead of 0.05 ms. Harmless without AVX-512.
FLAGS = ["-O2", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-fPIC", "-std=c++17",
         "-fno-finite-math-only", "-fno-math-errno", "-ffp-contract=off", "-Wno-psabi"]


@functools.cache
def compiler() -> tuple[str, str]:
    cxx = os.environ.get("CXX", "g++")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]
    return cxx, version


@functools.cache
def machine() -> str:
    """What `-march=native` resolves to here, so a cache shared by other machines never mixes ISAs."""
    cxx, _ = compiler()
    done = subprocess.run([cxx, "-march=native", "-Q", "--help=target"], capture_output=True, text=True)
    return hashlib.sha256(done.stdout.encode()).hexdigest()[:16]


def workers() -> int:
    return config.backend.compile_workers or os.cpu_count() or 1


def _run_all(commands: list[list[str]]) -> None:
    """Run compiler commands, at most `workers()` at once; raise with the first failure's output."""
    pending, running, failures = list(commands), [], []
    while pending or running:
        while pending and len(running) < workers():
            running.append(subprocess.Popen(pending.pop(0), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        done = running.pop(0)
        _, err = done.communicate()
        if done.returncode != 0:
            failures.append(err)
    if failures:
        raise RuntimeError(f"C++ compilation failed:\n{failures[0][-4000:]}")


def _build(sources: Sequence[str], target: Path, compile_flags: Sequence[str] = (), link_flags: Sequence[str] = (),
           unit_flags: Sequence[Sequence[str]] = (), reused_units: Collection[int] = ()) -> None:
    cxx, _ = compiler()
    disk_cache.make_private_dirs(target.parent)
    # Objects and the library are made in a folder of their own beside the target and renamed
    # into place: a process that has the old file loaded keeps its mapping, and no process ever
    # loads a library the linker is still writing.
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=target.name + ".") as tmp:
        objects, commands, to_keep = [], [], []
        for k, source in enumerate(sources):
            own = unit_flags[k] if k < len(unit_flags) else ()
            flags = [*FLAGS, *compile_flags, *own]
            kept = _object_entry(source, flags) if k in reused_units else None
            if kept is not None and disk_cache.intact(kept):
                logs.log("cache", "C++ object cache hit %s (unit %d)", kept.stem[:12], k)
                objects.append(str(kept))
                continue
            src, obj = Path(tmp) / f"kernels{k}.cpp", Path(tmp) / f"kernels{k}.o"
            src.write_text(source)
            objects.append(str(obj))
            commands.append([cxx, *flags, "-c", str(src), "-o", str(obj)])
            if kept is not None:
                to_keep.append((obj, kept))
        _run_all(commands)
        for obj, kept in to_keep:
            disk_cache.write(kept, obj.read_bytes())
        lib = Path(tmp) / "kernels.so"
        _run_all([[cxx, "-shared", "-fopenmp", *objects, "-o", str(lib), *link_flags]])
        os.replace(lib, target)


def build_library(sources: str | Sequence[str], compile_flags: Sequence[str] = (),
                  link_flags: Sequence[str] = (), unit_flags: Sequence[Sequence[str]] = (),
                  own: bool = False, reused_units: Collection[int] = ()) -> tuple[Path, bool]:
    """The path of the compiled library of `sources` (translation units, compiled in parallel),
    and whether it was built now (False: found intact in the cache). `compile_flags` and
    `link_flags` come after kiln's own (kiln's runtime: libtorch's headers and libraries);
    `unit_flags[k]`, after those, for unit k only (a C++ wrapper: -O0). `own`: one of kiln's own
    libraries (its runtime, its CPython extension): taken from `kiln prebuild`'s folder when it
    holds it, else cached under `cache.runtime_dir`. `reused_units`: the indices of units that
    many libraries share (kiln's runtime and kernels, linked into every exported model): their
    objects are cached on their own under `cache.runtime_dir`, so a library that differs only in
    its other units compiles only those."""
    sources = [sources] if isinstance(sources, str) else list(sources)
    if own:
        prebuilt = _prebuilt(_key(sources, compile_flags, link_flags, unit_flags))
        if prebuilt is not None:
            logs.log("cache", "C++ library %s prebuilt at install time", prebuilt.stem[:12])
            return prebuilt, False
        logs.log("cache", "kiln's own C++ library is not in %s (`kiln prebuild` puts it there): "
                 "taken from cache.runtime_dir, built there if missing", config.prebuilt_dir())
    return _build_cached(_target(sources, compile_flags, link_flags, unit_flags, own),
                         sources, compile_flags, link_flags, unit_flags, reused_units)


def prebuild_library(sources: Sequence[str], compile_flags: Sequence[str] = (),
                     link_flags: Sequence[str] = ()) -> tuple[Path, bool]:
    """`build_library(..., own=True)` into `kiln prebuild`'s folder (`cache.prebuilt_dir`), where
    every later process of this installation finds it: the path, and whether it was built now."""
    target = config.prebuilt_dir() / "cpp" / f"{_key(list(sources), compile_flags, link_flags, ())}.so"
    target.parent.mkdir(parents=True, exist_ok=True)  # readable by all: a system-wide install's users load from it
    with disk_cache.locked(target):
        if disk_cache.sealed_here(target):
            return target, False
        _build(list(sources), target, compile_flags, link_flags)
        disk_cache.seal(target, remote=False)
        for made in (target, target.with_name(target.name + ".sha256")):
            made.chmod(0o755 if made == target else 0o644)
    return target, True


def prebuilt_library(sources: Sequence[str], compile_flags: Sequence[str] = (),
                     link_flags: Sequence[str] = ()) -> Path | None:
    """The library `prebuild_library` made of these, when its folder holds it and may be loaded."""
    return _prebuilt(_key(list(sources), compile_flags, link_flags, ()))


def _prebuilt(key: str) -> Path | None:
    """`kiln prebuild`'s library of `key` when its folder holds it intact and only its owner (this
    user or root) can write there: kiln loads code from it."""
    folder = config.prebuilt_dir() / "cpp"
    target = folder / f"{key}.so"
    if not disk_cache.sealed_here(target):
        return None
    problem = disk_cache.unsafe_reason(folder, root_may_own=True)
    if problem is not None:
        logs.log("cache", "prebuilt library %s not used: %s", target, problem)
        return None
    return target


def _build_cached(target: Path, sources: list[str], compile_flags: Sequence[str], link_flags: Sequence[str],
                  unit_flags: Sequence[Sequence[str]], reused_units: Collection[int] = ()) -> tuple[Path, bool]:
    key = target.stem
    if disk_cache.intact(target):
        logs.log("cache", "C++ cache hit %s", key[:12])
        return target, False
    # One process builds a key at a time: another that wants it waits, then finds it intact.
    with disk_cache.locked(target):
        if disk_cache.intact(target):
            logs.log("cache", "C++ cache hit %s (built by another process meanwhile)", key[:12])
            return target, False
        logs.log("cache", "C++ cache miss %s: compiling %d units", key[:12], len(sources))
        _build(sources, target, compile_flags, link_flags, unit_flags, reused_units)
        disk_cache.seal(target)
    return target, True


def _key(sources: list[str], compile_flags: Sequence[str], link_flags: Sequence[str],
         unit_flags: Sequence[Sequence[str]]) -> str:
    flags = [*FLAGS, *compile_flags, *link_flags, *(" ".join(f) for f in unit_flags)]
    return hashlib.sha256("\0".join([*sources, *compiler(), machine(), *flags]).encode()).hexdigest()


def _object_entry(source: str, flags: Sequence[str]) -> Path:
    """Where the object of one reused unit compiled with `flags` is kept (`build_library`)."""
    key = hashlib.sha256("\0".join([source, *compiler(), machine(), *flags]).encode()).hexdigest()
    return disk_cache.entry("cpp-objects", key, ".o", root=config.runtime_cache_dir())


def _target(sources: list[str], compile_flags: Sequence[str], link_flags: Sequence[str],
            unit_flags: Sequence[Sequence[str]], own: bool = False) -> Path:
    return disk_cache.entry("cpp", _key(sources, compile_flags, link_flags, unit_flags), ".so",
                            root=config.runtime_cache_dir() if own else None)


def cached_library(sources: str | Sequence[str], compile_flags: Sequence[str] = (),
                   link_flags: Sequence[str] = (), own: bool = False) -> Path | None:
    """The path of the library `build_library` would give, when the cache holds it intact; None
    (nothing is built) otherwise."""
    sources = [sources] if isinstance(sources, str) else list(sources)
    if own:
        prebuilt = _prebuilt(_key(sources, compile_flags, link_flags, ()))
        if prebuilt is not None:
            return prebuilt
    target = _target(sources, compile_flags, link_flags, (), own)
    return target if disk_cache.intact(target) else None


def load_library(sources: str | Sequence[str]) -> ctypes.CDLL:
    """The compiled and loaded library of `sources`, from the cache when it holds it intact."""
    return ctypes.CDLL(str(build_library(sources)[0]))
