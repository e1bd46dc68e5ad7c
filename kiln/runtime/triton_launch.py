"""A kernel module's launches: each `fn[grid](tensors..., constants..., **options)` of a launcher,
as an object made once when the module loads (kiln/codegen/triton/kernel.py prints them).

    kernel_ab12_launch0 = kiln_launch(triton_cd34_main, (16,), 4096, XBLOCK=256, num_warps=4)

    def kernel_ab12(in0, out0):
        kernel_ab12_launch0(in0, out0)

`TritonLaunch` (graphs on CPU tensors, under Triton's interpreter; and `backend.triton_direct_launch`
off) calls `fn[grid](...)` every time: Triton's whole Python path, which binds the arguments,
computes the specialization key, asks for the current device and stream, looks the binary up,
and for autotuned kernels goes through the Autotuner first -- about 10 µs of host time a launch.

`DirectLaunch` (GPU graphs) takes that path once, on its first call: the binary Triton returns
(`CompiledKernel`; for an autotuned kernel the best config's, chosen then), the grid for that
config and the arguments after the tensors are kept, and every later call hands them straight to
the binary's launcher, `CompiledKernel.run(grid, stream, function, packed metadata, ...)`, with
the current stream fetched per launch. What Triton's binder specializes on and a launch site
does not fix is checked on each call, and any change goes back through Triton:

- pointer alignment: Triton compiles for 16-byte-aligned pointers where the tensors given were
  (`tt.divisibility`); a site resolves only from a call whose tensors were all aligned, and a
  call with any tensor that is not (`data_ptr() % 16`: a view at an odd offset) goes through
  Triton, which picks or compiles the binary for it;
- the current device (the binary's function handle belongs to the device it was loaded on);
- Triton's launch hooks (a profiler such as Proton adds to them, and reads launch metadata).

What a site fixes by construction: the integers after the tensors and the constexprs are
literals of the generated text (so their `== 1` and divisibility-by-16 specializations never
change), and the tensors' dtypes are the graph's own, which its guards hold.

This module imports Triton: kiln/runtime/triton_kernels.py imports it when it loads a module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from triton import knobs


class TritonLaunch:
    """`fn` launched on `grid` with the call's tensors, then `constants` and `options`, through
    Triton's `fn[grid](...)` on every call.

    Example::

        launch = TritonLaunch(add_kernel, (4,), 1024, BLOCK=256)
        launch(x, y, out)  # add_kernel[(4,)](x, y, out, 1024, BLOCK=256)
    """

    __slots__ = ("fn", "grid", "constants", "options")

    def __init__(self, fn: Any, grid: tuple | Callable, *constants: Any, **options: Any) -> None:
        self.fn, self.grid, self.constants, self.options = fn, grid, constants, options

    def __call__(self, *tensors: torch.Tensor) -> None:
        self.fn[self.grid](*tensors, *self.constants, **self.options)

    def __repr__(self) -> str:
        arguments = [*(repr(c) for c in self.constants), *(f"{k}={v!r}" for k, v in self.options.items())]
        return f"{type(self).__name__}({getattr(self.fn, '__name__', self.fn)}, {self.grid!r}, {', '.join(arguments)})"


@dataclass(frozen=True)
class ResolvedLaunch:
    """What a direct launch hands the binary's launcher: Triton's `CompiledKernel.run` arguments
    except the stream and the tensors, fixed when the site resolved."""

    kernel: Any  # the CompiledKernel (kept alive with its function handle)
    run: Callable[..., None]  # its launcher: Triton's CudaLauncher on a GPU
    grid: tuple[int, int, int]
    function: int  # the CUfunction handle, loaded on `device`
    packed_metadata: Any
    after_tensors: tuple  # every argument after the tensors, constexprs included, as Triton passes them
    device: int
    current_device: Callable[[], int]
    current_stream: Callable[[int], int]


class DirectLaunch(TritonLaunch):
    """A `TritonLaunch` that goes through Triton once, then launches the binary Triton chose
    directly (this module's docstring says when it goes through Triton again). `resolved` is
    None until then."""

    __slots__ = ("resolved",)

    def __init__(self, fn: Any, grid: tuple | Callable, *constants: Any, **options: Any) -> None:
        super().__init__(fn, grid, *constants, **options)
        self.resolved: ResolvedLaunch | None = None

    def __call__(self, *tensors: torch.Tensor) -> None:
        resolved = self.resolved
        if resolved is not None and not _launch_hooks_set():
            device = resolved.current_device()
            if device == resolved.device and not _any_misaligned(tensors):
                grid_x, grid_y, grid_z = resolved.grid
                resolved.run(grid_x, grid_y, grid_z, resolved.current_stream(device), resolved.function,
                             resolved.packed_metadata, None, None, None, *tensors, *resolved.after_tensors)
                return
        kernel = self.fn[self.grid](*tensors, *self.constants, **self.options)
        if resolved is None and kernel is not None and not _any_misaligned(tensors):
            self.resolved = resolve(self, kernel, len(tensors))


def _launch_hooks_set() -> bool:
    """Whether a launch hook is set (Triton's `knobs.runtime.launch_enter_hook` and `_exit_hook`:
    `HookChain`s in Triton 3.6 to 3.9, empty unless a profiler such as Proton added to them).
    Triton passes the chains to every launch, empty or not; a direct launch passes None for both,
    so any hook set sends the launch through Triton, which computes the launch metadata the
    hooks read."""
    runtime = knobs.runtime
    return _hooked(runtime.launch_enter_hook) or _hooked(runtime.launch_exit_hook)


def _hooked(hook: Any) -> bool:
    # (a plain function assigned in place of a chain has no `calls`: set)
    return hook is not None and bool(getattr(hook, "calls", True))


def _any_misaligned(tensors: tuple) -> bool:
    """Whether a pointer argument is off Triton's 16-byte specialization (the loop is cheaper
    than any(...) over a generator: ~0.1 µs a tensor, all in `data_ptr`)."""
    for tensor in tensors:
        if tensor.data_ptr() & 15:
            return True
    return False


def resolve(launch: TritonLaunch, kernel: Any, tensors: int) -> ResolvedLaunch | None:
    """The direct form of `launch`, from the `CompiledKernel` its call through Triton just
    returned; None where the site must keep going through Triton: hooks Triton runs before a
    launch (a jit function's `pre_run_hooks`, a config's `pre_hook`; kiln sets none), or an
    argument it could not name."""
    from triton.runtime import JITFunction, driver
    from triton.runtime.autotuner import Autotuner

    fn, config_kwargs = launch.fn, {}
    if isinstance(fn, Autotuner):
        config = fn.best_config  # the config the call just ran with, chosen at this site's first call
        if config.pre_hook is not None:
            return None
        fn, config_kwargs = fn.fn, config.kwargs
    if not isinstance(fn, JITFunction) or fn.pre_run_hooks:
        return None
    named = {**dict(zip(fn.arg_names[tensors:], launch.constants)), **launch.options, **config_kwargs}
    if any(name not in named for name in fn.arg_names[tensors:]):
        return None
    grid = launch.grid(named) if callable(launch.grid) else launch.grid
    grid = (*grid, 1, 1)[:3]
    active = driver.active
    return ResolvedLaunch(kernel, kernel.run, grid, kernel.function, kernel.packed_metadata,
                          tuple(named[name] for name in fn.arg_names[tensors:]), active.get_current_device(),
                          _device_getter(active), active.get_current_stream)


def _device_getter(active: Any) -> Callable[[], int]:
    """The active driver's current-device function, or its cheaper equal: Triton's CUDA driver
    uses `torch.cuda.current_device`, which re-checks CUDA's lazy initialization on every call;
    once a kernel has launched CUDA is initialized, and `torch._C._cuda_getDevice` answers the same."""
    fast = getattr(torch._C, "_cuda_getDevice", None)
    if fast is not None and active.get_current_device is torch.cuda.current_device:
        return fast
    return active.get_current_device
