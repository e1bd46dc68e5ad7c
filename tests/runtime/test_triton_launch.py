"""Triton launches on a machine without a GPU, through the stand-in CUDA driver
(benchmarks/standin_driver.py): kernels really compiled for an H100 (sm_90), launched through a
launcher that does nothing but write down what reached it."""

import re

import pytest
import torch

import kiln
from benchmarks.launch_cost import printed_for_a_gpu
from benchmarks.standin_driver import STREAM, standin_cuda
from kiln.runtime import triton_kernels
from kiln.runtime.triton_launch import DirectLaunch, TritonLaunch

import triton  # noqa: E402  (a test requirement)
import triton.language as tl  # noqa: E402
from triton import knobs  # noqa: E402
from triton.runtime import JITFunction  # noqa: E402


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


# -- kiln's launches: through Triton once, then straight to the binary ------------------------------

@pytest.fixture(scope="module")
def printed(tmp_path_factory):
    """A few graphs' modules as kiln prints them for a GPU graph, compiled once for the file in
    a private cache: name -> (module source, [(launcher, its tensors)])."""
    torch.manual_seed(0)
    graphs = {
        "pointwise": (lambda x: (x * 2).sin(), [torch.randn(1000)], None),
        "split sum": (lambda x: x.sum(), [torch.randn(70000)], None),  # (split from 65536 elements)
        "autotuned norm": (lambda x, w, b: torch.softmax(torch.layer_norm(x, (64,), w, b) * 2, -1),
                           [torch.randn(64, 64), torch.randn(64), torch.randn(64)], "default"),
    }
    printed = {}
    with kiln.config.patch({"cache.dir": str(tmp_path_factory.mktemp("cache"))}):
        for name, (fn, inputs, tune) in graphs.items():
            (graph,) = printed_for_a_gpu(fn, inputs, tune)
            printed[name] = graph.source, graph.launchers
    return printed


@pytest.fixture
def triton_runs(monkeypatch):
    """Calls of Triton's `JITFunction.run` (its binder: every launch through Triton, the
    autotuner's included), counted."""
    calls = []
    run = JITFunction.run

    def counted(self, *args, **kwargs):
        calls.append(self)
        return run(self, *args, **kwargs)

    monkeypatch.setattr(JITFunction, "run", counted)
    return calls


def _loaded(source: str, direct: bool = True):
    return triton_kernels.load_module(source, "cpu", interpret=False, direct=direct)


def test_a_launch_goes_through_triton_once_then_straight_to_its_binary(printed, binaries, triton_runs):
    source, [(name, tensors)] = printed["pointwise"]
    with standin_cuda(record=True) as gpu:
        module = _loaded(source)
        site = getattr(module, f"{name}_launch0")
        getattr(module, name)(*tensors)
        assert len(triton_runs) == 1 and site.resolved is not None
        getattr(module, name)(*tensors)
        assert len(triton_runs) == 1  # the second launch did not go through Triton
        through_triton, direct = gpu.launches
        assert site.resolved.function == through_triton.function == direct.function
    assert direct.grid == through_triton.grid == (1, 1, 1)  # 1000 elements, one block of 1024
    assert direct.stream == STREAM
    assert all(a is b for a, b in zip(direct.arguments, tensors))
    assert direct.arguments[len(tensors):] == through_triton.arguments[len(tensors):] == (1000, 1024)


def test_an_unaligned_tensor_is_launched_through_triton(printed, binaries, triton_runs):
    """Triton compiled the resolved binary for 16-byte-aligned pointers: a tensor that is not
    (a view one float in) goes through Triton, which compiles a binary for it; aligned ones
    go straight to the first binary again."""
    source, [(name, (x, out))] = printed["pointwise"]
    unaligned = torch.zeros(1001)[1:]
    assert unaligned.data_ptr() % 16 != 0
    with standin_cuda(record=True) as gpu:
        module = _loaded(source)
        launcher, site = getattr(module, name), getattr(module, f"{name}_launch0")
        launcher(unaligned, out)
        assert site.resolved is None  # not resolved from an unaligned call
        launcher(x, out)
        resolved = site.resolved.function
        launcher(unaligned, out)
        launcher(x, out)
        assert len(triton_runs) == 3
        first, second, third, fourth = gpu.launches
    assert first.function == third.function != resolved  # the unaligned binary, found by Triton
    assert second.function == fourth.function == resolved
    assert third.arguments[0] is unaligned


def test_an_autotuned_kernel_resolves_to_its_best_config(printed, binaries, triton_runs, monkeypatch):
    """Triton's autotuner times each config at the first call; the site resolves to the one it
    chose (made the last config here, not the first), its grid and its block sizes."""
    source, [(name, tensors)] = printed["autotuned norm"]
    assert "@triton.autotune(" in source
    times = iter(range(100, 0, -1))  # each config timed faster than the one before
    monkeypatch.setattr(triton_kernels, "host_timer", lambda fn, quantiles=None, **_: (fn(), next(times))[1])
    with standin_cuda(record=True) as gpu:
        module = _loaded(source)
        site = getattr(module, f"{name}_launch0")
        getattr(module, name)(*tensors)
        tuner = site.fn
        assert len(tuner.configs) > 1 and tuner.best_config is tuner.configs[-1]
        timed = len(triton_runs)
        launched_by_triton = gpu.launches[-1]
        getattr(module, name)(*tensors)
        assert len(triton_runs) == timed
        direct = gpu.launches[-1]
    best = tuner.best_config.kwargs
    assert site.resolved.after_tensors == (64, best["XBLOCK"], best["RBLOCK"])
    assert direct.grid == launched_by_triton.grid == (-(-64 // best["XBLOCK"]), 1, 1)
    assert direct.function == launched_by_triton.function
    assert direct.arguments[len(tensors):] == launched_by_triton.arguments[len(tensors):]


def test_a_split_reduction_launches_both_of_its_kernels_directly(printed, binaries, triton_runs):
    source, [(name, tensors)] = printed["split sum"]
    with standin_cuda(record=True) as gpu:
        module = _loaded(source)
        getattr(module, name)(*tensors)
        assert len(triton_runs) == 2
        getattr(module, name)(*tensors)
        assert len(triton_runs) == 2 and len(gpu.launches) == 4
    partial, fold = gpu.launches[2:]
    assert partial.kernel.endswith("_partial") and partial.grid[0] > 1 and fold.grid == (1, 1, 1)
    assert partial.arguments[2] is fold.arguments[2]  # the partials buffer the launcher allocated


def test_a_launch_hook_or_another_device_sends_launches_through_triton(printed, binaries, triton_runs):
    source, [(name, tensors)] = printed["pointwise"]
    seen = []
    with standin_cuda(record=True) as gpu:
        module = _loaded(source)
        launcher = getattr(module, name)
        launcher(*tensors)
        knobs.runtime.launch_enter_hook.add(seen.append)
        try:
            launcher(*tensors)
        finally:
            knobs.runtime.launch_enter_hook.remove(seen.append)
        assert len(triton_runs) == 2
        gpu.set_current_device(1)
        launcher(*tensors)
        assert len(triton_runs) == 3


def test_modules_launch_through_triton_under_the_interpreter_or_when_asked(printed):
    source, _ = printed["pointwise"]
    assert triton_kernels.load_module(source, "cpu").kiln_launch is TritonLaunch
    assert _loaded(source, direct=False).kiln_launch is TritonLaunch
    with kiln.config.patch({"backend.triton_direct_launch": False}):
        assert triton_kernels.load_module(source, "cpu", interpret=False).kiln_launch is TritonLaunch
    assert triton_kernels.load_module(source, "cpu", interpret=False).kiln_launch is DirectLaunch


def test_each_launch_is_printed_once_beside_its_launcher(printed):
    source, [(name, _)] = printed["split sum"]
    launcher = source[source.index(f"{name}_launch0 = "):source.index(f"def {name}_precompile")]
    assert re.fullmatch(
        rf"{name}_launch0 = kiln_launch\(triton_\w+_partial, \(\d+,\), 1, XBLOCK=1, RBLOCK=\d+, PARTS=\d+, CHUNK=\d+, "
        rf"num_warps=\d+\)\n"
        rf"{name}_launch1 = kiln_launch\(triton_\w+_main, \(1,\), 1, XBLOCK=1, PARTS=\d+, num_warps=1\)\n\n\n"
        rf"def {name}\(in0, out0\):\n"
        rf"    partials = torch.empty\(.*\)\n"
        rf"    {name}_launch0\(in0, out0, partials\)\n"
        rf"    {name}_launch1\(in0, out0, partials\)\n\n\n", launcher), launcher
