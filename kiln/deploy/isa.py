"""Whether this CPU can run code built with `-march=native` on another: the instruction-set
extensions the CPU that built an artifact has, and which of them this one lacks.

`-march=native` lets the compiler use every extension of the building CPU, so the artifact runs on
any CPU of the same architecture that has all of them: another model of the same family, a newer
one. The extensions are read from `/proc/cpuinfo` (x86's `flags`, aarch64's `Features`), which
needs no compiler: a machine that only runs artifacts has none (the older check, a digest of
what `-march=native` resolves to, needed g++ and refused a CPU that differs only in its caches).

    missing(metadata["isa_flags"])  # [] where the artifact runs; else the extensions this CPU lacks
"""

from __future__ import annotations

import platform
import re
from pathlib import Path

# x86 flags naming instruction-set extensions a compiler may use; the others (`constant_tsc`,
# `hypervisor`, ...) describe the machine and differ between hosts of one CPU model.
_X86_EXTENSION = re.compile(r"^(sse|ssse3|avx|fma|f16c|bmi|popcnt|abm|lzcnt|movbe|aes|pclmulqdq|sha_ni|vaes|"
                            r"vpclmulqdq|gfni|adx|amx|cx16|rdrand|rdseed|xsave|clflushopt|clwb|movdir|serialize|"
                            r"3dnowprefetch|fsgsbase|prefetchw|waitpkg|cldemote|avx512)")


def flags(cpuinfo: str | None = None) -> list[str]:
    """This CPU's instruction-set extensions, sorted (empty where /proc/cpuinfo cannot say)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return sorted(f for f in value.split() if _X86_EXTENSION.match(f))
        if key.strip() == "Features":  # aarch64: every entry is an extension
            return sorted(value.split())
    return []


def cpu_name() -> str:
    """The CPU's model name ("AMD EPYC"), as metadata.json records it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def missing(recorded: list[str], arch: str | None = None) -> list[str]:
    """The extensions in `recorded` (an artifact's `isa_flags`) this CPU lacks; the architecture
    itself first when `arch` differs from this machine's."""
    if arch is not None and arch != platform.machine():
        return [f"the {arch} architecture (this machine is {platform.machine()})"]
    here = set(flags())
    return [f for f in recorded if f not in here]
