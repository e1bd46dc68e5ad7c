"""Files in kiln's on-disk caches: written atomically, each with a digest beside it, and read back
only when the digest matches, so a torn or corrupted entry reads as a miss and is rebuilt.

Several processes may share one cache directory. A writer holds an advisory lock on the entry
(`locked`, `fcntl.flock` on `<entry>.lock`) from its data to its digest, so two writers never
leave a digest that belongs to the other's data; readers take no lock, read the bytes once and
compare them with the digest, so an entry caught between a new file and its new digest reads as
a miss, never as half of one.

The cache holds shared libraries that kiln loads, so a directory that another user can write
into would let that user run code in this process. Before using a cache directory kiln checks it
(`unsafe_reason`): the directory and the folders kiln keeps inside it must be owned by the
current user and writable by no one else, and no folder above it may be writable by others
unless it is sticky (as /tmp is). An unsafe directory is refused with a warning that names it and
the fix, and this process caches into a private temporary directory instead. Folders kiln creates
get mode 0o700.

What keys are made of, where more than one cache needs it, is here too: `kiln_fingerprint` (every
file of kiln's source) and `cpu_identity` (the CPU, in every entry that holds a machine's
decisions).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import functools
import hashlib
import os
import platform
import shutil
import stat
import tempfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from kiln import config, logs, remote_cache

# Cache directories refused in this process -> the private directory used instead.
_REFUSED: dict[Path, Path] = {}


def entry(kind: str, key: str, suffix: str, root: Path | None = None) -> Path:
    """Where the entry `key` of cache `kind` lives: <cache dir>/<kind>/<key[:2]>/<key><suffix>
    (<cache dir>: `root` when given, else the configured one; a private temporary directory when
    that one is unsafe)."""
    return _folder(kind, key[:2], root=root) / f"{key}{suffix}"


def folder(kind: str) -> Path:
    """<cache dir>/<kind>, created and checked, for a cache whose files another tool names
    (Triton's compiled kernels)."""
    return _folder(kind)


def _folder(*parts: str, root: Path | None = None) -> Path:
    """<cache dir>/<parts>, created (mode 0o700) and checked; see the module docstring."""
    wanted = root if root is not None else config.cache_dir()
    private = _REFUSED.get(wanted)
    if private is None:
        problem = _prepare(wanted, parts)
        if problem is None:
            return wanted.joinpath(*parts)
        private = _refuse(wanted, problem)
    folder = private.joinpath(*parts)
    make_private_dirs(folder)
    return folder


def _prepare(root: Path, parts: tuple[str, ...]) -> str | None:
    """Create root/parts as needed, checking each folder before anything is made inside it; why
    they may not be used, or None when they may."""
    try:
        make_private_dirs(root)
        problem = unsafe_reason(root)
        for n in range(1, len(parts) + 1):
            if problem is not None:
                return problem
            folder = root.joinpath(*parts[:n])
            make_private_dirs(folder)
            problem = _owned_and_private(folder)
    except OSError as error:
        return f"{error.filename or root} cannot be created ({error.strerror})"
    return problem


def make_private_dirs(folder: Path) -> None:
    """`mkdir -p` that gives every folder it creates mode 0o700 (Path.mkdir's mode covers the
    last one only): no other user may list or write the cache."""
    missing = []
    while not folder.exists():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    for path in reversed(missing):
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:  # another process created it in between
            pass


def unsafe_reason(root: Path, uid: int | None = None, root_may_own: bool = False) -> str | None:
    """Why shared libraries may not be loaded from the cache directory `root`, or None.

    `root` must be owned by `uid` (the current user's by default; or by root, with `root_may_own`:
    a system-wide installation's folder) and writable by no one else;
    each folder above it must be writable by no other user, unless it is sticky and owned by root
    or `uid` (in a sticky folder such as /tmp, others cannot rename or replace what they do not own).

    Example::

        unsafe_reason(Path("/tmp/shared"))   # "/tmp/shared is writable by other users (mode 0o777)"
    """
    uid = os.geteuid() if uid is None else uid
    problem = _owned_and_private(root, 0 if root_may_own and root.stat().st_uid == 0 else uid)
    if problem is not None:
        return problem
    # Both the folders the path names and the ones a symlink in it leads to.
    above = {*root.absolute().parents, *root.resolve().parents}
    for folder in sorted(above, key=lambda p: -len(p.parts)):
        info = folder.stat()
        sticky = info.st_mode & stat.S_ISVTX and info.st_uid in (0, uid)
        if info.st_mode & 0o022 and not sticky:
            return f"{folder}, above it, is writable by other users (mode {oct(stat.S_IMODE(info.st_mode))})"
    return None


def _owned_and_private(folder: Path, uid: int | None = None) -> str | None:
    uid = os.geteuid() if uid is None else uid
    info = folder.stat()
    if info.st_uid != uid:
        return f"{folder} is owned by another user (uid {info.st_uid})"
    if info.st_mode & 0o022:
        return f"{folder} is writable by other users (mode {oct(stat.S_IMODE(info.st_mode))})"
    return None


def _refuse(wanted: Path, problem: str) -> Path:
    private = Path(tempfile.mkdtemp(prefix="kiln-cache-"))  # mode 0o700, owned by this user
    atexit.register(shutil.rmtree, private, ignore_errors=True)
    _REFUSED[wanted] = private
    message = (f"kiln will not use the cache directory {wanted}: {problem}, and kiln loads compiled "
               f"code from it, so another user could run code in this process. This process compiles "
               f"into a private temporary directory instead ({private}, removed at exit), so nothing "
               f"is reused between runs. Fix: `chmod go-w` the folder named (and make it yours), or "
               f"set KILN_CACHE_DIR to a directory only you can write.")
    logs.log("cache", "%s", message)
    warnings.warn(message, RuntimeWarning, stacklevel=2)
    return private


# --- writing and reading ---------------------------------------------------------------------

_held = threading.local()  # lock files this thread holds: flock is per open file, not per process


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the advisory lock of entry `path` (`<path>.lock`) against other processes and threads.
    Re-entrant in one thread. Where the lock file cannot be made (a read-only cache), runs
    unlocked: a race then costs a miss, never a wrong read."""
    held = _held.__dict__.setdefault("paths", set())
    name = str(path) + ".lock"
    if name in held:
        yield
        return
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if this process dies
        held.add(name)
        yield
    finally:
        held.discard(name)
        os.close(fd)  # closing the file releases the lock


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def intact(path: Path) -> bool:
    """The file exists and matches the digest written after it was complete."""
    return read(path) is not None


def sealed_here(path: Path) -> bool:
    """`intact`, asking this machine's disk only (never the remote tier, never writing): for
    folders kiln reads but does not fill at run time (`kiln prebuild`'s)."""
    return _read_here(path) is not None


def _read_here(path: Path) -> bytes | None:
    """The entry's bytes from this machine's disk when they match their digest, else None."""
    try:
        check = _digest_path(path).read_text()
        data = path.read_bytes()
    except OSError:
        return None
    return data if hashlib.sha256(data).hexdigest() == check else None


def _replace_atomically(path: Path, data: bytes) -> None:
    make_private_dirs(path.parent)
    # A unique temporary name in the same folder, so concurrent writers never share one and the
    # rename is atomic: a reader sees the old file or the new one, never part of either.
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def seal(path: Path, remote: bool = True) -> None:
    """Mark a complete file valid by writing its digest (the last step of every write). Call it
    holding `locked(path)`, so the digest written is that of the file another writer left. The
    entry then goes to the remote tier, if one is set (kiln/remote_cache.py) and `remote`."""
    with locked(path):
        data = path.read_bytes()
        _replace_atomically(_digest_path(path), hashlib.sha256(data).hexdigest().encode())
    if remote:
        _offer_remote(path, data)


def write(path: Path, data: bytes) -> None:
    _write_local(path, data)
    _offer_remote(path, data)


def _write_local(path: Path, data: bytes) -> None:
    with locked(path):
        _replace_atomically(path, data)
        _replace_atomically(_digest_path(path), hashlib.sha256(data).hexdigest().encode())


def remove(path: Path) -> None:
    """Forget an entry found bad after it was written (a compiled graph whose kernel failed at its
    first launch): the file, its digest, and the remote tier's index of it, if one is set."""
    with locked(path):
        for file in (path, _digest_path(path)):
            with contextlib.suppress(FileNotFoundError):
                file.unlink()
    tier = remote_cache.tier()
    if tier is not None:
        tier.delete(_remote_name(path))


def read(path: Path) -> bytes | None:
    """The entry's bytes, or None when missing or not intact. The file is read once and those
    bytes are checked, so a writer replacing it meanwhile cannot make a check pass for other bytes.
    A local miss asks the remote tier, if one is set; what it gives (verified there) is written
    locally."""
    data = _read_here(path)
    if data is not None:
        return data
    tier = remote_cache.tier()
    data = tier.get(_remote_name(path)) if tier is not None else None
    if data is not None:
        _write_local(path, data)
    return data


def _remote_name(path: Path) -> str:
    """`<kind>/<file name>` of an entry at <cache dir>/<kind>/<key[:2]>/<file name> (`entry`)."""
    return f"{path.parent.parent.name}/{path.name}"


def _offer_remote(path: Path, data: bytes) -> None:
    tier = remote_cache.tier()
    if tier is not None:
        tier.put(_remote_name(path), data)


# --- what keys are made of --------------------------------------------------------------------
# An entry is used only where what produced it is the same: kiln's own source (every key of a
# compiled graph) and, in every entry that holds a machine's decisions (autotuning answers, the
# AOT graphs that carry them), the CPU. The remote tier (kiln/remote_cache.py) stores entries under
# these same keys, so a machine never reads another kind of machine's decisions from it.


@functools.cache
def kiln_fingerprint() -> str:
    """A hash of kiln's own source: any change to the compiler, its runtime's C++ included,
    invalidates what it cached."""
    return fingerprint(Path(__file__).resolve().parent)  # the kiln package


def fingerprint(root: Path) -> str:
    """A hash of the names and contents of `source_files(root)`."""
    h = hashlib.sha256()
    for path in source_files(root):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def source_files(root: Path) -> list[Path]:
    """Every file under `root` but Python's bytecode and hidden files (an editor's swap files),
    sorted. Not a list of suffixes: one kept by suffix (.py and .h) left out the runtime's .cpp
    sources and its linker map, so a change to them reused graphs built against the old runtime;
    a new kind of source file is now counted without a change here."""
    def counted(path: Path) -> bool:
        parts = path.relative_to(root).parts
        return ("__pycache__" not in parts and path.suffix not in (".pyc", ".pyo")
                and not any(part.startswith(".") for part in parts) and path.is_file())

    return sorted(path for path in root.rglob("*") if counted(path))


# The /proc/cpuinfo flags that decide which kernel is fastest: vector width and FMA, bfloat16 dot
# products and matrix units on x86; NEON, SVE and bfloat16 on aarch64. Two CPUs sold under one
# model string (a cloud's "Intel Xeon Processor", with or without AMX) must not share answers.
ISA_FLAGS = ("fma", "avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "asimd", "sve", "sve2", "bf16")

# Lines naming the CPU: x86's model name, and its family and model numbers (clouds sell several
# generations as "Intel(R) Xeon(R) Processor"); aarch64 has no name, only implementer and part.
_MODEL_FIELDS = ("model name", "vendor_id", "cpu family", "model", "CPU implementer", "CPU part", "CPU variant")


def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return info.read()
    except OSError:
        return ""


def cpu_description(cpuinfo: str) -> str:
    """The CPU's model and speed-deciding ISA flags from /proc/cpuinfo text (the first processor's
    line of each field: they are all alike).

        cpu_description(open("/proc/cpuinfo").read())
        # "Intel(R) Xeon(R) Processor GenuineIntel 6 167|fma avx2 avx512f avx512_bf16 amx_bf16 amx_tile"
    """
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        name, sep, value = line.partition(":")
        if sep:
            fields.setdefault(name.strip(), value.strip())
    model = " ".join(fields[f] for f in _MODEL_FIELDS if f in fields) or platform.processor()
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return f"{model}|{' '.join(f for f in ISA_FLAGS if f in flags)}"


@functools.cache
def cpu_identity() -> str:
    """This CPU as the keys of entries holding a machine's decisions name it: its model and ISA
    flags (`cpu_description`) and the kernels ATen dispatches to here (torch's CPU capability,
    which `ATEN_CPU_CAPABILITY` can lower), which decide what the autotuner measures.
    (C++ libraries are keyed by what `-march=native` resolves to instead, kiln/native/build.py:
    a library depends on the compiler's view of the CPU, not on its name.)"""
    return f"{cpu_description(_cpuinfo())}|{torch.backends.cpu.get_cpu_capability()}"
