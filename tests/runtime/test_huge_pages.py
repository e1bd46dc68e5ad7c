"""kiln's packed weights in memory advised as transparent huge pages (backend.huge_pages,
kiln_runtime.cpp `pack_empty`): in a fresh process, the first pack maps a chunk flagged `hg` in
/proc/self/smaps (madvise MADV_HUGEPAGE) with the setting on and nothing advised with it off; a
dropped pack's pages go back to the system at once, whole 2 MB pages only (a page another pack
lies on stays, unsplit); the product is the same either way."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
pytestmark = pytest.mark.skipif(not THP.exists(), reason="this kernel has no transparent huge pages")

SCRIPT = r"""
import json, sys
from pathlib import Path
import torch
from kiln.externs import native_ops
from kiln.native import libkiln

def advised(field="Size"):
    # bytes (`field`: mapped, or Rss: resident) of this process's mappings advised as huge pages
    total = value = 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line.startswith(field + ":"):
            value = int(line.split()[1]) * 1024
        elif line.startswith("VmFlags:") and "hg" in line.split()[1:]:
            total += value
    return total

torch.manual_seed(0)
a, weight = torch.randn(1, 1024), torch.randn(1024, 1024)
native_ops.load()
before = advised()
b = weight.t()  # (the packs are kept per tensor: this one's)
out = torch.ops.kiln.mm(a, b, None, "none", [], None, "kiln")  # kiln's GEMM: its 4 MB of panels packed now
mapped = advised() - before
resident = advised("Rss")
libkiln.drop_packs(b)  # the pack freed: its pages go back at once
freed = resident - advised("Rss")
# A small pack, then a large one after it on the same 2 MB page: dropping the small one gives back
# nothing (its page holds the other's start) and leaves the page whole (a 4 KB part of a huge page
# given back splits it, and khugepaged later makes it whole again: 2 MB resident at a random time).
small, large = torch.randn(256, 1024).t(), torch.randn(1024, 1024).t()
torch.ops.kiln.mm(a[:, :256], small, None, "none", [], None, "kiln")
torch.ops.kiln.mm(a, large, None, "none", [], None, "kiln")
shared = {"Rss": advised("Rss"), "AnonHugePages": advised("AnonHugePages")}
libkiln.drop_packs(small)
shared_after = {"Rss": advised("Rss"), "AnonHugePages": advised("AnonHugePages")}
json.dump({"mapped": mapped, "freed": freed, "out": out.flatten().tolist(), "eager": (a @ weight.t()).flatten().tolist(),
           "shared": shared, "shared_after": shared_after}, sys.stdout)
"""


def run_with_huge_pages(script: str, huge_pages: str) -> dict:
    """What `script` writes (JSON) when run in a fresh process with backend.huge_pages `huge_pages`."""
    env = {**os.environ, "KILN_HUGE_PAGES": huge_pages}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_packs_are_advised_as_huge_pages_only_with_the_setting_on():
    on, off = run_with_huge_pages(SCRIPT, "1"), run_with_huge_pages(SCRIPT, "0")
    assert on["mapped"] >= 4 << 20, on["mapped"]  # a chunk holding the 4 MB pack, advised
    assert on["freed"] >= 3 << 20, on["freed"]  # the pack's resident pages returned when it was dropped
    assert off["mapped"] == 0, off["mapped"]
    assert on["out"] == off["out"]  # the same kernel over the same panels: the same bits
    assert max(abs(x - y) for x, y in zip(on["out"], on["eager"])) < 1e-3
    assert on["shared_after"] == on["shared"], (on["shared"], on["shared_after"])  # the shared page kept, whole


LOADED_ALONE = r"""
import ctypes, os, sys
import torch
from kiln.native import libkiln
lib = ctypes.CDLL(libkiln.library_path(), mode=os.RTLD_GLOBAL | os.RTLD_NOW)  # not libkiln.library(): no settings handed over
sys.stdout.write(str(lib.kiln_huge_page_reads()))
"""


def test_the_runtime_loaded_alone_reads_packs_as_its_default_pages_want():
    """A host that never hands the runtime its settings (kiln-run, an exported model's library)
    gets the default: where packs lie on 2 MB pages (THP on) on AMD, one-row products read them in
    fewer runs (kiln_gemm.h `huge_page_packs`), as under Python."""
    done = subprocess.run([sys.executable, "-c", LOADED_ALONE], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    amd = "AuthenticAMD" in Path("/proc/cpuinfo").read_text()
    thp = any(f"[{mode}]" in THP.read_text() for mode in ("always", "madvise"))
    assert done.stdout == str(int(amd and thp)), done.stdout
