"""Where `runtime.keep_freed_mb` asks for it, the first compiled graph of a process asks glibc's
malloc to keep freed memory for the next call (kiln/heap.py): without it, a call's large
buffers can be handed back to the system and page-faulted in again by every later call. By
default kiln leaves malloc alone: the thresholds are the whole process's."""

import json
import os
import subprocess
import sys

import pytest

import kiln
from kiln import heap

# Run in a fresh process: a 30 MB block allocated, touched and freed, then rounds of three 8 MB
# blocks. glibc's mallinfo2 says where the 30 MB block came from: a mapping of its own (hblkhd)
# or the heap (arena), and whether the heap kept it once freed.
_ROUNDS = """
import ctypes, resource, sys, torch
from kiln import heap
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
applied = heap.keep_freed_memory() if sys.argv[1] == "kiln" else None
start = libc.mallinfo2()
big = torch.empty(30 << 18).fill_(1)
held = libc.mallinfo2()
del big
freed = libc.mallinfo2()
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
counts = []
for _ in range(6):
    before = faults()
    blocks = [torch.empty(2 << 20).fill_(1) for _ in range(3)]
    del blocks
    counts.append(faults() - before)
print(applied, (held.hblkhd - start.hblkhd) >> 20, (freed.arena - start.arena) >> 20, *counts)
"""


def _fresh_env(**settings: str) -> dict[str, str]:
    """This process's environment without malloc's knobs or kiln's setting, plus `settings`."""
    env = {k: v for k, v in os.environ.items() if k not in (*heap._USERS_KNOBS, "KILN_KEEP_FREED_MB")}
    return {**env, **settings}


def _rounds(which: str) -> tuple[str, int, int, list[int]]:
    """Whether kiln set the thresholds, the MiB mapped apart for the 30 MB block, the MiB the heap
    grew by and kept after its free, and the page faults of each round."""
    done = subprocess.run([sys.executable, "-c", _ROUNDS, which], capture_output=True, text=True, check=True,
                          env=_fresh_env(KILN_KEEP_FREED_MB="256"))
    applied, mapped, heap_mb, *counts = done.stdout.split()
    return applied, int(mapped), int(heap_mb), [int(c) for c in counts]


@pytest.mark.skipif(heap._glibc_mallopt() is None, reason="glibc's malloc only")
def test_large_buffers_come_from_the_heap_and_stay_there_once_freed():
    applied, mapped, kept, counts = _rounds("kiln")
    assert applied == "True"
    # From the heap, and kept after the free (the heap grows by less where free memory was at its top).
    assert mapped == 0 and kept >= 20
    # 24 MB is 6,144 pages: no round faults them in again (a few hundred faults are other memory,
    # such as a thread pool started meanwhile).
    assert max(counts[1:]) < 1500, counts
    # glibc's own policy maps a block that size apart and unmaps it at the free: every such
    # buffer is page-faulted in afresh.
    applied, mapped, kept, counts = _rounds("plain")
    assert mapped >= 30 and kept < 20


@pytest.fixture
def undecided(monkeypatch):
    """A process where nothing was decided yet, with a stand-in mallopt that records its calls."""
    calls = []
    monkeypatch.setattr(heap, "_decision", None)
    monkeypatch.setattr(heap, "MALLOPT_CALLS", [])
    monkeypatch.setattr(heap, "_glibc_mallopt", lambda: lambda param, value: calls.append((param, value)) or 1)
    for knob in heap._USERS_KNOBS:
        monkeypatch.delenv(knob, raising=False)
    return calls


def test_thresholds_are_set_once_per_process(undecided):
    with kiln.config.patch({"runtime.keep_freed_mb": 100}):
        assert heap.keep_freed_memory() and heap.keep_freed_memory()
    assert undecided == [(heap._M_MMAP_THRESHOLD, 32 << 20), (heap._M_TRIM_THRESHOLD, 100 << 20)]


def test_left_alone_by_default(undecided):
    assert kiln.config.runtime.keep_freed_mb == 0
    assert "left alone (runtime.keep_freed_mb = 0, the default" in heap.describe()
    assert not heap.keep_freed_memory()
    assert undecided == [] and heap.MALLOPT_CALLS == []
    assert heap.decision() == heap.Decision(False, 0, "off")


def test_left_alone_when_the_user_tuned_malloc(undecided, monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000000")
    with kiln.config.patch({"runtime.keep_freed_mb": 100}):
        assert not heap.keep_freed_memory()
        assert heap.describe() == ("left alone although asked for (runtime.keep_freed_mb = 100): "
                                   "the user set MALLOC_TRIM_THRESHOLD_")
    assert undecided == []


def test_what_was_done_is_said(undecided):
    with kiln.config.patch({"runtime.keep_freed_mb": 100}):
        assert heap.describe().startswith("not changed yet: the first compiled graph keeps up to 100 MiB")
        heap.keep_freed_memory()
        assert "up to 100 MiB of freed heap kept (runtime.keep_freed_mb = 100)" in heap.describe()
    assert heap.describe().endswith("the setting's later value 0 does not apply")


# A fresh process compiles a small model through kiln.compile, then says what kiln did to malloc.
_COMPILE = """
import json, torch, kiln
from kiln import heap
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
x = torch.randn(4, 16)
with torch.no_grad():
    torch.testing.assert_close(kiln.compile(model)(x), model(x))
done = heap.decision()
print(json.dumps({"decided": done is not None, "applied": done.applied, "calls": heap.MALLOPT_CALLS}))
"""


def _compile_in_a_fresh_process(**settings: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, env=_fresh_env(**settings))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_compile_leaves_malloc_alone_unless_asked():
    assert _compile_in_a_fresh_process() == {"decided": True, "applied": False, "calls": []}


@pytest.mark.skipif(heap._glibc_mallopt() is None, reason="glibc's malloc only")
def test_a_compile_sets_the_thresholds_when_asked():
    assert _compile_in_a_fresh_process(KILN_KEEP_FREED_MB="64") == {
        "decided": True, "applied": True, "calls": [[heap._M_MMAP_THRESHOLD, 32 << 20], [heap._M_TRIM_THRESHOLD, 64 << 20]]}
