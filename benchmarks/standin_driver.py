"""A stand-in CUDA driver for Triton: Triton believes an H100 (sm_90) is the current GPU, compiles
kernels for it with its real compiler, and "launches" them through a launcher that does nothing.

    with standin_cuda() as gpu:
        module = load_module(source, "cpu", interpret=False)
        getattr(module, launcher)(*cpu_tensors)   # compiled for sm_90, launched nowhere
        gpu.launches                              # what reached the launcher (record=True)

What it is for: measuring and testing the HOST side of a GPU launch on a machine without a GPU --
Triton's binder and kiln's direct launches (kiln/runtime/triton_launch.py) run as on a GPU up to
the launcher, and there nothing happens. CPU tensors stand in for device tensors: their
`data_ptr()` is all the launch path reads (Triton's binder specializes on its 16-byte alignment).

It lives in benchmarks/, not tests/, because `kiln bench-launch` (benchmarks/launch_cost.py) uses
it as well as the tests. It only ever replaces Triton's *active* driver (`driver.set_active`, in
Triton 3.6 through 3.9), never kiln's code paths.

What it does not measure: the real launcher (Triton's `CudaLauncher.__call__`, a Python wrapper
around a C function that calls `cuLaunchKernelEx`), the driver's own launch cost, and anything
the GPU does. On a GPU, `kiln bench-launch` runs without it.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from kiln.runtime.triton_compile_workers import CompileOnlyDriver

# What Triton reads of an H100 SXM's properties (CUDA's cudaDeviceProp, as Triton's driver names
# them): shared memory per block with the opt-in (227 KiB) is the one a launch checks.
H100_PROPERTIES = {
    "max_shared_mem": 232448,
    "max_num_regs": 65536,
    "multiprocessor_count": 132,
    "warpSize": 32,
    "sm_clock_rate": 1980000,
    "mem_clock_rate": 2619000,
    "mem_bus_width": 5120,
}
STREAM = 0x5EA  # the stand-in's "current stream": any integer, as a cudaStream_t would be


@dataclass
class Launch:
    """One launch that reached the stand-in's launcher: what a real launcher would pass to
    `cuLaunchKernelEx` (kernel arguments still as Python objects, constexprs included)."""

    kernel: str  # the compiled kernel's name
    grid: tuple[int, int, int]
    stream: int
    function: int  # the handle `load_binary` gave the kernel
    arguments: tuple = field(repr=False)


class _NoOpLauncher:
    """Triton's `launcher_cls` protocol: built once per compiled kernel, called per launch with
    (gridX, gridY, gridZ, stream, function, packed metadata, launch metadata, enter hook, exit
    hook, *arguments) -- the same in Triton 3.6 and 3.9. It does nothing."""

    def __init__(self, src: Any, metadata: Any) -> None:
        self.name = metadata.name

    def __call__(self, *args: Any) -> None:
        pass


class _RecordingLauncher(_NoOpLauncher):
    """A no-op launcher that also writes down each launch (tests; costs a list append)."""

    driver: "StandInCudaDriver"

    def __call__(self, grid_x, grid_y, grid_z, stream, function, packed, launch_metadata, enter, exit_, *args) -> None:
        self.driver.launches.append(Launch(self.name, (grid_x, grid_y, grid_z), stream, function, args))


class StandInModule:
    """The module handle `load_binary` gives a kernel (a CUmodule on a GPU)."""


class _StandInUtils:
    """`driver.utils`: device properties and binaries; `load_binary` returns a fresh integer as
    the function handle (a CUfunction on a GPU)."""

    def __init__(self) -> None:
        self._handles = itertools.count(0x1000)
        self.loaded = 0

    def get_device_properties(self, device: int) -> dict[str, int]:
        return dict(H100_PROPERTIES)

    def load_binary(self, name: str, binary: bytes, shared: int, device: int) -> tuple:
        self.loaded += 1
        # (module, function, registers, spilled registers, max threads per block)
        return StandInModule(), next(self._handles), 32, 0, 1024

    def unload_module(self, module: Any) -> None:
        pass


def _forget_standin_modules() -> None:
    """Every compiled kernel loaded by a stand-in made to forget its module handle. Triton 3.9's
    `CompiledKernel.__del__` unloads a kernel's module through whatever driver is active when the
    kernel is collected, which after the stand-in has gone is Triton's real one: on a machine
    without a GPU, creating it raises (inside `__del__`, printed, not raised). A kernel without a
    module loads again at its next launch, under the next stand-in."""
    from triton.compiler import CompiledKernel

    for thing in gc.get_objects():
        if type(thing) is CompiledKernel and type(thing.module) is StandInModule:
            thing.module, thing.function, thing._run = None, None, None


class StandInCudaDriver(CompileOnlyDriver):
    """Triton's driver protocol (`DriverBase`) for an H100 that is not there: what compiling
    needs (kiln's compile workers' driver: the sm_90 target, current device 0, which
    `set_current_device` changes), and one stream, an H100's properties, binaries loaded as fake
    handles, no launches. `record=True` keeps each launch in `launches`."""

    def __init__(self, record: bool = False, capability: int = 90) -> None:
        super().__init__(capability)
        self.record, self.launches = record, []
        self.utils = _StandInUtils()
        if record:
            self.launcher_cls = type("Recording", (_RecordingLauncher,), {"driver": self})
        else:
            self.launcher_cls = _NoOpLauncher

    def get_current_stream(self, device: int | None = None) -> int:
        return STREAM

    def get_device_capability(self, device: int = 0) -> tuple[int, int]:
        return divmod(self.capability, 10)

    def get_device_interface(self) -> Any:
        raise RuntimeError("the stand-in CUDA driver has no device interface (no CUDA events, no streams)")

    def get_benchmarker(self):
        from kiln.runtime.triton_kernels import host_timer

        return host_timer  # (kiln's kernels pass their own `do_bench`; this is for any other)


@contextlib.contextmanager
def standin_cuda(record: bool = False, capability: int = 90) -> Iterator[StandInCudaDriver]:
    """Triton's active driver replaced by a `StandInCudaDriver` for the block, then put back.

    Example::

        with standin_cuda(record=True) as gpu:
            kernel[(4,)](x, y, 1024, BLOCK=256)
        assert gpu.launches[0].grid == (4, 1, 1)
    """
    from triton.runtime import driver

    standin = StandInCudaDriver(record, capability)
    # The previous active driver is put back as it was: `driver.reset_active()` would create
    # Triton's default driver, which raises on a machine without a GPU.
    before = driver._active
    driver.set_active(standin)
    try:
        yield standin
    finally:
        if standin.utils.loaded:
            _forget_standin_modules()
        driver._active = before
