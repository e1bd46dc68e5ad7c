"""A GPU graph's Triton kernels compiled in parallel when it loads (kiln/runtime/triton_kernels.py
`precompile`), checked on a machine without a GPU: Triton's CUDA driver is the stand-in
(benchmarks/standin_driver.py), which names an H100 as the target and launches nothing, so the
kernels are really compiled for sm_90 and a launch shows whether it found its kernel compiled (it
reaches the stand-in's launcher) or had to compile it (Triton's `jit_cache_hook` sees it first)."""

import threading

import pytest
import torch

import kiln
from kiln.backend import watch
from benchmarks.standin_driver import standin_cuda
from kiln.runtime import triton_kernels
from tests.codegen.test_triton_models import _tiny_bert, _triton_graphs
from tests.kiln_backend import private_cache  # noqa: F401  (fixture)

import triton  # noqa: E402  (a test requirement)


@pytest.fixture
def h100_driver(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "binaries"))
    try:
        with standin_cuda(record=True) as gpu:
            yield gpu
    finally:
        triton.knobs.runtime.jit_cache_hook = None


def _bert_graph():
    torch.manual_seed(0)
    model, inputs, _ = _tiny_bert()
    with torch.no_grad(), kiln.config.patch({"backend.codegen": "triton"}), watch() as built:
        kiln.compile(model.eval())(*inputs)
    (graph,) = _triton_graphs(built)
    return graph


def _launch_each_kernel(graph, module, gpu) -> tuple[int, list[str]]:
    """(launchers whose launches found their kernels compiled, jit functions a launch had to compile)."""
    compiled_at_launch = []

    def hook(**kwargs):
        compiled_at_launch.append(kwargs["repr"])
        return True  # (do not compile: the test only asks whether it was needed)

    triton.knobs.runtime.jit_cache_hook = hook
    found = 0
    for kernel in graph.schedule.kernels:
        launcher = getattr(module, graph.stages.kernels.functions[kernel.name])
        tensors = [torch.empty_strided(tuple(int(s) for s in b.layout.size), tuple(int(s) for s in b.layout.stride),
                                       dtype=b.layout.dtype) for b in kernel.inputs + kernel.outputs]
        before = len(gpu.launches)
        launcher(*tensors)
        found += len(gpu.launches) > before
    return found, compiled_at_launch


def test_every_launch_finds_its_kernel_precompiled(h100_driver):
    graph = _bert_graph()
    source = graph.stages.kernels.source
    kernels = len(graph.schedule.kernels)
    # Without precompiling, every launch compiles its kernel (the test's control).
    module = triton_kernels.load_module(source, "cpu", interpret=False)
    found, compiled = _launch_each_kernel(graph, module, h100_driver)
    assert found == 0 and len(compiled) == kernels
    triton.knobs.runtime.jit_cache_hook = None
    module = triton_kernels.load_module(source, "cpu", interpret=False)  # fresh jit functions
    triton_kernels.precompile(module, workers=2)
    found, compiled = _launch_each_kernel(graph, module, h100_driver)
    assert compiled == [] and found == kernels


def test_a_compile_the_pool_loses_is_made_again_before_the_first_launch(h100_driver, monkeypatch):
    """CPython 3.11's ast.parse can fail when two threads parse at once (a SystemError): the
    pool's compile of that kernel is lost, and precompile's serial pass makes it."""
    graph = _bert_graph()
    module = triton_kernels.load_module(graph.stages.kernels.source, "cpu", interpret=False)
    lost = []
    compile_on_this_thread = triton.compiler.compile

    def compile(*args, **kwargs):  # (a jit function takes it from triton.compiler when first called)
        if threading.current_thread() is not threading.main_thread():
            lost.append(1)
            raise SystemError("AST constructor recursion depth mismatch (before=33, after=140)")
        return compile_on_this_thread(*args, **kwargs)

    monkeypatch.setattr(triton.compiler, "compile", compile)
    triton_kernels.precompile(module, workers=2)
    found, compiled = _launch_each_kernel(graph, module, h100_driver)
    assert len(lost) == len(module.KILN_PRECOMPILE)  # (every pool compile failed ...)
    assert compiled == [] and found == len(graph.schedule.kernels)  # (... and was made again)


def test_a_warm_up_that_fails_on_this_thread_while_the_pool_runs_is_made_again(h100_driver):
    """The parse race above can hit the loading thread too, whose warm-up parses while the pool's
    threads do: that kernel is compiled in the serial pass, not left to its launch."""
    graph = _bert_graph()
    module = triton_kernels.load_module(graph.stages.kernels.source, "cpu", interpret=False)
    first, calls = module.KILN_PRECOMPILE[0], []

    def racing():
        calls.append(1)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=33, after=140)")
        return first()

    racing.__name__ = first.__name__
    module.KILN_PRECOMPILE[0] = racing
    triton_kernels.precompile(module, workers=2)
    found, compiled = _launch_each_kernel(graph, module, h100_driver)
    assert len(calls) == 2 and compiled == [] and found == len(graph.schedule.kernels)


def test_a_kernel_that_fails_to_precompile_is_left_to_its_launch(h100_driver):
    graph = _bert_graph()
    module = triton_kernels.load_module(graph.stages.kernels.source, "cpu", interpret=False)
    first = module.KILN_PRECOMPILE[0]

    def broken():
        raise ValueError("not this one")

    broken.__name__ = first.__name__
    module.KILN_PRECOMPILE[0] = broken
    triton_kernels.precompile(module, workers=2)  # no error: the others are compiled
    found, compiled = _launch_each_kernel(graph, module, h100_driver)
    assert len(compiled) >= 1 and found == len(graph.schedule.kernels) - 1


def test_gpu_autotuning_times_each_config_briefly(monkeypatch):
    import triton.testing

    from kiln.runtime import triton_kernels

    asked = {}
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kwargs: asked.update(kwargs) or [1.0])
    assert triton_kernels.short_gpu_bench(lambda: None, quantiles=(0.5,)) == [1.0]
    assert asked == {"warmup": 3, "rep": 15, "quantiles": (0.5,)}  # not Triton's 25 + 100 ms per config


def test_worker_processes_compile_the_kernels_the_parent_then_loads(h100_driver, tmp_path):
    import os
    from pathlib import Path

    from kiln.runtime import triton_compile_workers

    graph = _bert_graph()
    module = triton_kernels.load_module(graph.stages.kernels.source, "cpu", interpret=False)
    names = [f.__name__ for f in module.KILN_PRECOMPILE]
    binaries = tmp_path / "binaries"
    try:
        assert triton_compile_workers.compile_module(Path(module.__file__), names, 90, 2) == []
        compiled_by_workers = set(os.listdir(binaries))
        assert len(compiled_by_workers) >= len(names)
        for warm_up in module.KILN_PRECOMPILE:  # the parent's own warm-ups, on the same jit functions' sources
            warm_up()
        assert set(os.listdir(binaries)) == compiled_by_workers  # every one a hit in Triton's cache
        found, compiled = _launch_each_kernel(graph, module, h100_driver)
        assert compiled == [] and found == len(graph.schedule.kernels)
    finally:
        triton_compile_workers.workers(1).close()


def test_a_worker_computes_tritons_own_key_before_its_first_task():
    # Every compile's cache key includes `triton_key` (a hash of Triton's sources and library,
    # once per process): a worker computes it while it waits, not in its first task's compile.
    from triton.runtime.cache import triton_key

    from kiln.runtime import triton_compile_workers

    triton_key.cache_clear()
    triton_compile_workers._import_compiler()
    assert triton_key.cache_info().currsize == 1


def test_a_gpu_graph_starts_the_compile_workers_before_the_aot_layer(monkeypatch):
    from kiln.backend import backends, codegens
    from kiln.runtime import triton_compile_workers

    started, stages = [], []
    monkeypatch.setattr(triton_compile_workers, "workers", lambda count: started.append(count))
    monkeypatch.setattr(backends, "with_aot", lambda *args, **kwargs: stages.append(list(started)))
    gpu = torch.empty(2)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: t is gpu))
    backends.kiln(torch.fx.symbolic_trace(lambda x: x + 1), [gpu])
    assert stages == [[codegens.workers()]]  # started, then the AOT layer
    started.clear()
    backends.kiln(torch.fx.symbolic_trace(lambda x: x + 1), [torch.empty(2)])
    assert started == []  # a CPU graph starts none
