"""A graph's Triton module, written to the cache and imported; its launchers are the kernels the
wrapper calls.

`triton.jit` reads a kernel's source from its file, so the module is a real file, named by the
hash of its text (<cache dir>/triton/<key[:2]>/<key>.py, written with its digest as every cache
entry: a torn or edited file is written again, never imported). Triton compiles each kernel for
the GPU at its first launch and keeps the binary in its own cache.

Graphs on CPU tensors run under Triton's interpreter (how CI checks the Triton printer without a
GPU): the module is imported with `TRITON_INTERPRET=1`, which makes each `@triton.jit` function
an interpreted one, and its `libdevice` is kiln/runtime/triton_math.py's stand-in.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
import hashlib
import time
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterator

import torch

from kiln import config, disk_cache, logs
from kiln.native.build import workers


def module_path(source: str) -> Path:
    """The cache file holding `source`, written now when missing or not intact."""
    key = hashlib.sha256(source.encode()).hexdigest()
    path = disk_cache.entry("triton", key, ".py")
    if disk_cache.read(path) != source.encode():
        disk_cache.write(path, source.encode())
    return path


@contextlib.contextmanager
def _interpreting(on: bool) -> Iterator[None]:
    """TRITON_INTERPRET set to 1 (on) or unset (off) while `triton.jit` decorates the module."""
    before = os.environ.get("TRITON_INTERPRET")
    if on:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = before


def load_module(source: str, device: str, interpret: bool | None = None, direct: bool | None = None) -> ModuleType:
    """The module of `source` imported for graphs on `device` ("cpu": interpreted), with its
    `libdevice`, its index-error flag (a one-element int32 tensor on the device) and its
    launches' kind bound. `interpret=False` imports it for Triton's compiler on a CPU machine
    (tests building kernels for a GPU target, under a stand-in driver). `direct`: launches
    resolved once to their compiled binaries (kiln/runtime/triton_launch.py), the default for
    compiled modules under `backend.triton_direct_launch`; never under the interpreter, whose
    kernels have no binary."""
    from triton.language.extra import libdevice

    from kiln.runtime.triton_launch import DirectLaunch, TritonLaunch
    from kiln.runtime.triton_math import INTERPRETER_LIBDEVICE

    interpret = device == "cpu" if interpret is None else interpret
    direct = not interpret and (config.backend.triton_direct_launch if direct is None else direct)
    path = module_path(source)
    kind = "interpreted" if interpret else "direct" if direct else "compiled"
    name = f"kiln_triton_{path.stem}_{kind}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    module.libdevice = INTERPRETER_LIBDEVICE if interpret else libdevice
    module.kiln_error_flag = torch.zeros(1, dtype=torch.int32, device=device)
    module.kiln_do_bench = host_timer if device == "cpu" else short_gpu_bench
    module.kiln_choose_gemm = choose_gemm
    module.kiln_launch = DirectLaunch if direct else TritonLaunch
    # linecache and inspect find a jit function's source through its module in sys.modules.
    sys.modules[name] = module
    with _interpreting(interpret):
        spec.loader.exec_module(module)
    if device != "cpu":
        # Triton's binaries go under kiln's cache for the rest of the process (unless
        # TRITON_CACHE_DIR is set): a kernel precompile missed compiles at its first launch.
        os.environ.setdefault("TRITON_CACHE_DIR", str(disk_cache.folder("triton_binaries")))
        precompile(module, workers())
    return module


def precompile(module: ModuleType, workers: int) -> None:
    """Compile every kernel of a GPU graph's module now, `workers` at a time, rather than one by
    one at their first launches. Worker processes compile them first, into Triton's on-disk
    cache (kiln/runtime/triton_compile_workers.py). Then each launch's `warmup` call
    (kiln/codegen/triton/kernel.py) runs here, under Triton's asynchronous compile mode, which
    hands each compilation to a thread pool and puts the results in the jit functions' own
    caches -- loaded from the disk cache where the workers compiled them: a launch then finds
    its kernel there when its arguments specialize as the warm-up's did (tensors 16-byte
    aligned, as the caching allocator's are; a launch that differs compiles then, as before)."""
    functions = getattr(module, "KILN_PRECOMPILE", [])
    try:
        from triton.runtime._async_compile import AsyncCompileMode  # Triton 3.5 and later
    except ImportError:
        return  # (each kernel compiles at its first launch)
    started = time.perf_counter()
    _compile_in_workers(module, functions, workers)
    try:
        with ThreadPoolExecutor(max(1, workers)) as pool, AsyncCompileMode(pool, ignore_errors=True):
            for warm_up in functions:
                _warm_up_logged(warm_up)
        # A compile that failed left no kernel behind (`ignore_errors`). Some such failures are
        # the pool's own: CPython 3.11's `ast.parse`, which Triton calls for every kernel it
        # compiles, keeps its recursion depth per interpreter, not per thread, so two threads
        # parsing at once can raise "AST constructor recursion depth mismatch" (a SystemError;
        # CPython issue 106905's family) -- in a pool thread, or in this one, whose warm-up
        # parses while the pool's threads do. A second, serial pass over every kernel, with no
        # other thread parsing, finds each compiled in its jit function's cache or compiles it
        # now; a real error is raised again there and logged.
        for warm_up in functions:
            _warm_up_logged(warm_up)
    except Exception as error:  # noqa: BLE001 - an optimization: never the reason a graph fails to load
        logs.log("triton", "precompiling failed (%s: %s); kernels compile at their first launch", type(error).__name__, error)
        return
    logs.log("triton", "%d kernels precompiled in %.2f s, %d workers", len(functions), time.perf_counter() - started, workers)


def _compile_in_workers(module: ModuleType, functions: list, workers: int) -> None:
    """The module's warm-ups compiled by worker processes for this process's GPU; logged, never
    raised: what they did not compile, the warm-ups here compile."""
    from triton.runtime import driver

    from kiln.runtime import triton_compile_workers

    try:
        target = driver.active.get_current_target()  # (the GPU's; in tests, a stand-in's)
        errors = triton_compile_workers.compile_module(Path(module.__file__), [f.__name__ for f in functions],
                                                       target.arch, workers)
    except Exception as error:  # noqa: BLE001 - an optimization: never the reason a graph fails to load
        errors = [f"{type(error).__name__}: {error}"]
    for error in errors[:3]:
        logs.log("triton", "a compile worker failed (%s); the kernel compiles here", error)


def _warm_up_logged(warm_up) -> bool:
    """Run a kernel's warm-up; False (logged) when it raised: the launch compiles the kernel, and
    reports its error, itself."""
    try:
        warm_up()
    except Exception as error:  # noqa: BLE001 - see above
        logs.log("triton", "precompile of %s failed (%s: %s); it compiles at its first launch",
                 warm_up.__name__, type(error).__name__, error)
        return False
    return True


@contextlib.contextmanager
def binary_cache() -> Iterator[None]:
    """Triton's compiled kernels go to <kiln cache>/triton_binaries (not ~/.triton) while Triton
    compiles, unless the user chose TRITON_CACHE_DIR."""
    if "TRITON_CACHE_DIR" in os.environ:
        yield
        return
    os.environ["TRITON_CACHE_DIR"] = str(disk_cache.folder("triton_binaries"))
    try:
        yield
    finally:
        os.environ.pop("TRITON_CACHE_DIR", None)


# Milliseconds of warm-up and of timed runs per config when Triton's autotuner times a GPU
# kernel's block sizes (Triton's own default is 25 and 100: with 3-4 configs for each of a model's
# reductions and products, seconds of a first call went to timing alone).
GPU_BENCH_WARMUP_MS, GPU_BENCH_RUNS_MS = 3, 15


def short_gpu_bench(fn, quantiles=None, **_: object):
    """Triton's autotuner's `do_bench` for GPU kernels: Triton's own (CUDA events, the L2 cache
    cleared between runs), over a few milliseconds instead of a hundred."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=GPU_BENCH_WARMUP_MS, rep=GPU_BENCH_RUNS_MS, quantiles=quantiles)


def host_timer(fn, quantiles=None, **_: object):
    """Triton's autotuner's `do_bench` for interpreted kernels (CUDA events need a GPU): one
    wall-clock run, in milliseconds (an interpreted kernel's time says nothing about a GPU's;
    this only lets tests run the autotuner's path)."""
    start = time.perf_counter()
    fn()
    elapsed = (time.perf_counter() - start) * 1e3
    return [elapsed] * len(quantiles) if quantiles else elapsed


def choose_gemm(kernel: str, shape: tuple, forms: dict[str, Callable[..., None]], tensors: tuple,
                outputs: int) -> Callable[..., None]:
    """The faster form of a product kernel (kiln/codegen/triton/kernel.py, `_timed_gemm`): each
    run on the call's own tensors by kiln's autotuner (interleaved rounds, medians; on a GPU the
    GPU's time by CUDA events, never the host's, which would favour the form with fewer launches
    over the faster kernels), the answer kept in kiln's autotune cache under the kernel's name
    (a hash of its text, which holds the sizes) and the device's. The outputs are put back as
    they were before the timing: a kernel that writes over one of its inputs reads it again."""
    from kiln.autotune.choose import choose
    from kiln.autotune.timing import gpu_seconds, host_seconds

    device = tensors[0].device
    written = tensors[len(tensors) - outputs:]
    before = [t.clone() for t in written]

    def timed(form: Callable[..., None]) -> Callable[[], None]:
        return lambda: form(*tensors)

    on_gpu = device.type == "cuda"
    where = torch.cuda.get_device_name(device) if on_gpu else "triton interpreter"
    chosen = choose("triton_gemm", (kernel, shape, where, "gpu time"), {name: timed(form) for name, form in forms.items()},
                    budget_s=0.05, timer=gpu_seconds if on_gpu else host_seconds)
    for tensor, saved in zip(written, before):
        tensor.copy_(saved)
    return forms[chosen]


def build_for_gpu(source: str, functions: list, capability: int = 90, warp_size: int = 32) -> dict[str, bytes]:
    """Compile every jit function of the module `source` for an NVIDIA GPU of compute capability
    `capability` (90: H100) without one, down to its cubin; `functions` are the printer's
    JitFunctions (their argument types). Triton's compiler rejects code its interpreter runs,
    so tests compile each kernel they generate this way. Returns name -> cubin."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module = load_module(source, "cpu", interpret=False)
    target = GPUTarget("cuda", capability, warp_size)
    built = {}
    for function in functions:
        jit = getattr(module, function.name)
        if isinstance(jit, triton.runtime.Autotuner):  # an autotuned kernel: built with its first config
            jit = jit.fn
        with binary_cache():
            compiled = triton.compile(ASTSource(jit, function.signature, function.constexprs), target=target)
        built[function.name] = compiled.asm["cubin"]
    return built
