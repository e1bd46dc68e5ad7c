"""kiln's packed weights in memory advised as transparent huge pages (backend.huge_pages,
kiln_runtime.cpp `pack_empty`): in a fresh process, the first pack maps a chunk flagged `hg` in
/proc/self/smaps (madvise MADV_HUGEPAGE) with the setting on and nothing advised with it off; the
product is the same either way."""

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

def advised():
    total = size = 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line.startswith("Size:"):
            size = int(line.split()[1]) * 1024
        elif line.startswith("VmFlags:") and "hg" in line.split()[1:]:
            total += size
    return total

torch.manual_seed(0)
a, weight = torch.randn(1, 1024), torch.randn(1024, 1024)
native_ops.load()
before = advised()
out = torch.ops.kiln.mm(a, weight.t(), None, "none", [], None, "kiln")  # kiln's GEMM: its 4 MB of panels packed now
mapped = advised() - before
json.dump({"mapped": mapped, "out": out.flatten().tolist(), "eager": (a @ weight.t()).flatten().tolist()}, sys.stdout)
"""


def _run(huge_pages: str) -> dict:
    env = {**os.environ, "KILN_HUGE_PAGES": huge_pages}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_packs_are_advised_as_huge_pages_only_with_the_setting_on():
    on, off = _run("1"), _run("0")
    assert on["mapped"] >= 4 << 20, on["mapped"]  # a chunk holding the 4 MB pack, advised
    assert off["mapped"] == 0, off["mapped"]
    assert on["out"] == off["out"]  # the same kernel over the same panels: the same bits
    assert max(abs(x - y) for x, y in zip(on["out"], on["eager"])) < 1e-3
