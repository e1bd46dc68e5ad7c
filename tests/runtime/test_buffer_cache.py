"""The freed blocks kiln's runtime keeps for the tensors it makes itself (runtime.buffer_cache_mb,
kiln_runtime.cpp `buffer_cache`): a C++ wrapper's buffers and kiln's operators' outputs come back
from them on the next call, within the limit, with the same results; a tensor still alive keeps
its block; 0 keeps nothing."""

import pytest
import torch

import kiln
from kiln.externs import native_ops
from kiln.native import libkiln
from tests.runtime.test_huge_pages import THP, run_with_huge_pages


@pytest.fixture
def runtime():
    lib = libkiln.library()
    yield lib
    libkiln.apply_settings()  # (the setting's own limit again)


def _step(x, w):
    # A pointwise kernel's buffer (kiln_empty_strided) and kiln's GEMM's output (kiln::mm).
    h = torch.tanh(x * 2 + 1)
    return torch.ops.kiln.mm(h, w, None, "none", [], None, "kiln") + 1


def _compiled_step():
    """(`_step` compiled, its inputs, eager's result)."""
    native_ops.load()
    kiln.reset()
    x, w = torch.randn(8, 64), torch.randn(64, 96)
    return kiln.compile(_step), x, w, _step(x, w)


def test_kept_blocks_are_used_again_with_the_same_results(runtime):
    compiled, x, w, want = _compiled_step()
    runtime.kiln_set_buffer_cache(32 << 20)
    first = compiled(x, w)  # (held: its output's block stays with it)
    assert 0 < runtime.kiln_buffer_cache_kept() <= 32 << 20
    torch.testing.assert_close(compiled(x, w), want)
    kept = runtime.kiln_buffer_cache_kept()
    for _ in range(3):
        torch.testing.assert_close(compiled(x, w), want)
        # each call takes its blocks from those kept and leaves as many (nothing grows call to call)
        assert runtime.kiln_buffer_cache_kept() == kept
    # An output still held keeps its block: later calls do not write into it.
    torch.testing.assert_close(first, want)
    other = compiled(x * -1, w)
    torch.testing.assert_close(first, want)
    torch.testing.assert_close(other, _step(x * -1, w))


def test_the_limit_bounds_what_is_kept_and_zero_keeps_nothing(runtime):
    compiled, x, w, want = _compiled_step()
    runtime.kiln_set_buffer_cache(4096)
    for _ in range(2):
        torch.testing.assert_close(compiled(x, w), want)
        assert runtime.kiln_buffer_cache_kept() <= 4096
    runtime.kiln_set_buffer_cache(0)
    assert runtime.kiln_buffer_cache_kept() == 0
    torch.testing.assert_close(compiled(x, w), want)
    assert runtime.kiln_buffer_cache_kept() == 0


def test_the_setting_reaches_the_runtime(runtime):
    with kiln.config.patch({"runtime.buffer_cache_mb": 0}):
        libkiln.apply_settings()
        kiln.reset()
        compiled = kiln.compile(_step)
        native_ops.load()
        compiled(torch.randn(8, 64), torch.randn(64, 96))
        assert runtime.kiln_buffer_cache_kept() == 0


ARENA = r"""
import json, sys
from pathlib import Path
import torch
import kiln
from kiln.externs import native_ops
from kiln.native import libkiln

def advised():
    # bytes mapped in this process's mappings advised as huge pages (VmFlags `hg`)
    total = value = 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line.startswith("Size:"):
            value = int(line.split()[1]) * 1024
        elif line.startswith("VmFlags:") and "hg" in line.split()[1:]:
            total += value
    return total

def step(x, w):
    h = torch.tanh(x * 2 + 1)
    return torch.ops.kiln.mm(h, w, None, "none", [], None, "kiln") + 1

native_ops.load()
lib = libkiln.library()
before = advised()
x, w = torch.randn(8, 64), torch.randn(64, 96)
compiled = kiln.compile(step)
want = step(x, w)
same = all(torch.allclose(compiled(x, w), want, atol=1e-5) for _ in range(3))  # (each output freed first)
carved = lib.kiln_buffer_arena_bytes()
lib.kiln_set_buffer_cache(256)  # a limit under every block: the arena's freed blocks are its spares
same = same and all(torch.allclose(compiled(x, w), want, atol=1e-5) for _ in range(3))
json.dump({"carved": carved, "carved_after": lib.kiln_buffer_arena_bytes(), "mapped": advised() - before,
           "kept": lib.kiln_buffer_cache_kept(), "same": same}, sys.stdout)
"""


@pytest.mark.skipif(not THP.exists(), reason="this kernel has no transparent huge pages")
def test_blocks_are_carved_from_an_arena_of_huge_pages_with_the_setting_on():
    """backend.huge_pages: the runtime's buffers come from an arena advised as 2 MB pages (the
    packs' own setting), nothing advised with it off; blocks freed past the cache's limit go back
    to the arena and are used again there (it grows no further), with the same results."""
    on, off = run_with_huge_pages(ARENA, "1"), run_with_huge_pages(ARENA, "0")
    assert on["carved"] > 0 and on["mapped"] >= 32 << 20, on  # the arena, advised
    assert on["carved_after"] == on["carved"] and on["kept"] <= 256, on  # spares used again, none kept
    assert off["carved"] == off["carved_after"] == 0 and off["mapped"] == 0, off
    assert on["same"] and off["same"]
