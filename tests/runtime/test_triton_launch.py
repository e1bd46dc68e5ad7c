"""Triton launches on a machine without a GPU, through the stand-in CUDA driver
(kiln/bench/standin_driver.py): kernels really compiled for an H100 (sm_90), launched through a
launcher that does nothing but write down what reached it."""

import pytest
import torch

from kiln.bench.standin_driver import STREAM, standin_cuda

import triton  # noqa: E402  (a test requirement)
import triton.language as tl  # noqa: E402


@triton.jit
def add_one(x, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + i, tl.load(x + i, mask=i < n) + 1, mask=i < n)


@pytest.fixture
def binaries(tmp_path, monkeypatch):
    """Triton's compiled kernels (and its autotuner's choices) in a folder of the test's own."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "binaries"))


def test_the_standin_compiles_for_an_h100_and_launches_nothing(binaries):
    from triton.runtime import driver

    before = driver._active
    x, out = torch.arange(100.0), torch.zeros(100)
    with standin_cuda(record=True) as gpu:
        kernel = add_one[(4,)](x, out, 100, BLOCK=32)
    assert driver._active is before
    assert kernel.metadata.target.arch == 90 and len(kernel.asm["cubin"]) > 0
    (launch,) = gpu.launches
    assert launch.kernel == "add_one" and launch.grid == (4, 1, 1) and launch.stream == STREAM
    assert launch.arguments[0] is x and launch.arguments[1] is out and launch.arguments[2:] == (100, 32)
    assert not out.any()  # nothing ran
