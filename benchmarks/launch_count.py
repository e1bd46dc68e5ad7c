"""Kernel launches and host waits per call of a GPU step, counted from the CUDA runtime and driver
calls torch.profiler records: what issue 50 asks a GPU run to report beside the times (a compiled
call that launches fewer kernels, or never waits for the GPU, lets the host run ahead).

A launch is a runtime or driver launch call (cudaLaunchKernel, cuLaunchKernel, ...) or one CUDA
graph replay (cudaGraphLaunch: one launch however many kernels it holds); a wait is a call that
blocks the host until the GPU is done (stream, device or event synchronize, a blocking copy)."""

from __future__ import annotations

from typing import Any, Callable, Iterable

LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
            "cuGraphLaunch", "cudaLaunchCooperativeKernel")
WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cuStreamSynchronize",
         "cuCtxSynchronize", "cuEventSynchronize", "cudaMemcpy", "cuMemcpyDtoH")


def is_wait(name: str) -> bool:
    """A runtime or driver call that blocks the host until the GPU is done. Asynchronous copies
    (cudaMemcpyAsync) are not waits; a plain cudaMemcpy is."""
    return name in WAITS or name.startswith(("cudaMemcpy2D ", "cudaMemcpy "))


def tally(events: Iterable[tuple[str, int]], calls: int) -> tuple[float, float]:
    """(launches, waits) per call from (event name, count) pairs over `calls` calls (`is_wait`)."""
    launches = waits = 0
    for name, count in events:
        if name in LAUNCHES:
            launches += count
        elif is_wait(name):
            waits += count
    return launches / calls, waits / calls


STEP = "launch_count.step"  # the profiler range around each counted call


def inside_steps(events: Iterable[Any], step: str = STEP) -> list[tuple[str, int]]:
    """(name, 1) for each profiler event (`.name`, `.time_range`) that starts inside a range
    named `step`: what the calls did, not what the profiler itself does around them (it
    synchronizes the device when it stops, which counted as a wait every third call on an H200)."""
    events = list(events)
    ranges = [(e.time_range.start, e.time_range.end) for e in events if e.name == step]
    return [(e.name, 1) for e in events
            if e.name != step and any(start <= e.time_range.start <= end for start, end in ranges)]


def count_per_call(step: Callable[[], Any], calls: int = 3) -> tuple[float, float]:
    """(launches, waits) per call of `step` on the GPU, over `calls` profiled calls after one
    unprofiled call (so nothing compiles inside the profile); only the CUDA calls made inside a
    call count."""
    import torch

    step()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(calls):
            with torch.profiler.record_function(STEP):
                step()
    return tally(inside_steps(profile.events()), calls)
