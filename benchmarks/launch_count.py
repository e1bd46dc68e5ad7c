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


def tally(events: Iterable[tuple[str, int]], calls: int) -> tuple[float, float]:
    """(launches, waits) per call from (event name, count) pairs over `calls` calls. Asynchronous
    copies (cudaMemcpyAsync) are not waits; a plain cudaMemcpy is."""
    launches = waits = 0
    for name, count in events:
        if name in LAUNCHES:
            launches += count
        elif name in WAITS or name.startswith(("cudaMemcpy2D ", "cudaMemcpy ")):
            waits += count
    return launches / calls, waits / calls


def count_per_call(step: Callable[[], Any], calls: int = 3) -> tuple[float, float]:
    """(launches, waits) per call of `step` on the GPU, over `calls` profiled calls after one
    unprofiled call (so nothing compiles inside the profile)."""
    import torch

    step()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(calls):
            step()
    return tally(((row.key, row.count) for row in profile.key_averages()), calls)
