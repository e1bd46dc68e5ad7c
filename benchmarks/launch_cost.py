"""What a Triton kernel launch costs the host: kiln's GPU graphs' launches through Triton's
`fn[grid](...)` beside kiln's direct launches (kiln/runtime/triton_launch.py).

    kiln bench-launch [--graphs pointwise,norms,mlp] [--passes 200] [--rounds 7]

Each graph is compiled by kiln with Triton kernels on CPU tensors; its kernels are printed again
as for a GPU graph (block sizes chosen by Triton's autotuner among `backend.autotune`'s configs,
a product fused with its epilogue as under `backend.triton_gemm=always`: the timed choice against
cuBLAS is left out), and the module is loaded twice, its launches through Triton in one, direct
in the other. A pass calls every kernel's launcher once, in the schedule's order, with tensors
made for it; after a warm-up (compiles, the autotuner's choice, each direct launch's first call),
rounds time `--passes` passes of each module in turn, the best round kept.

Without a GPU, Triton's driver is the stand-in (benchmarks/standin_driver.py): kernels compiled
for an H100 by Triton's compiler, CPU tensors, a launcher that does nothing. The time is the host
cost of the launch path up to Triton's launcher, and not the launcher itself (on a GPU, Triton's
`CudaLauncher.__call__` and `cuLaunchKernelEx`, which both paths pay).

On a GPU (`torch.cuda.is_available()`), the same passes launch for real on the current stream:
host time is the time to issue them, with no synchronization inside the timed span (the GPU is
idle when it starts), and GPU time the span's CUDA events, per launch.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

import kiln
from kiln import config

PATHS = ("through Triton", "direct")


def _pointwise(x: torch.Tensor, y: torch.Tensor) -> tuple:
    a = torch.sigmoid(x) * y + 1
    b = (a.t() * 2).exp()
    return torch.cat([a, b], 0).tanh().relu(), a.sum(0)


def _norms(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple:
    h = torch.layer_norm(x, (x.shape[-1],), w, b)
    s = torch.softmax(h * 0.125, -1) + x
    t = torch.softmax(s.t(), -1)
    return torch.layer_norm(t, (t.shape[-1],)), s.amax(0)


class _FeedForward(nn.Module):
    """Two transformer feed-forward blocks: linear, GELU, linear, residual, layer norm."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
                                    for _ in range(2))
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block, norm in zip(self.blocks, self.norms):
            x = norm(block(x) + x)
        return x


GRAPHS: dict[str, Callable[[], tuple[Callable, list[torch.Tensor]]]] = {
    "pointwise": lambda: (_pointwise, [torch.randn(64, 64), torch.randn(64, 64)]),
    "norms": lambda: (_norms, [torch.randn(128, 128), torch.randn(128), torch.randn(128)]),
    # products fused with their epilogues (GELU; the residual and the layer norm)
    "mlp": lambda: (_FeedForward().eval(), [torch.randn(32, 64)]),
}


@dataclass
class PrintedGraph:
    """A graph's Triton module as kiln prints it for a GPU graph, and what a pass launches."""

    source: str
    launchers: list[tuple[str, list[torch.Tensor]]]  # (launcher, its tensors), in the schedule's order

    def on(self, device: str) -> "PrintedGraph":
        return PrintedGraph(self.source, [(name, [t.to(device) for t in tensors]) for name, tensors in self.launchers])


def printed_for_a_gpu(fn: Callable, inputs: list[torch.Tensor], tune: str | None = "default") -> list[PrintedGraph]:
    """Each Triton graph of `fn` compiled by kiln on `inputs` (CPU tensors, parameters as inputs),
    its kernels printed again for "cuda" with `tune` (block sizes chosen by Triton's autotuner;
    None: the fixed rule), each launcher given zeroed tensors as large as its buffers' storage."""
    from kiln.backend import watch
    from kiln.codegen.triton.module import triton_kernels
    from kiln.runtime.compiled_graph import CompiledGraph, TritonModule
    from kiln.runtime.frozen import FrozenProgram

    # (Freezing off: frozen on a CPU, products become the CPU's prepacked externs, not Triton's template.)
    with config.patch({"backend.codegen": "triton", "backend.freezing": False}), watch() as built, torch.no_grad():
        kiln.compile(fn)(*inputs)
    graphs = [b.runtime if isinstance(b, FrozenProgram) else b for b in built]
    printed = []
    for graph in graphs:
        if not isinstance(graph, CompiledGraph) or not isinstance(graph.artifact.kernel_library, TritonModule):
            continue
        kernels = triton_kernels(graph.schedule.kernels, "cuda", tune)
        launchers = [(kernels.functions[k.name], [_storage(b) for b in k.inputs + k.outputs]) for k in graph.schedule.kernels]
        printed.append(PrintedGraph(kernels.source, launchers))
    return printed


def _storage(buffer: Any) -> torch.Tensor:
    """Zeros enough for every element a kernel may address in `buffer` (its offset included;
    kernels index from the storage's start)."""
    layout = buffer.layout
    elements = int(layout.offset) + 1 + sum((int(s) - 1) * abs(int(st)) for s, st in zip(layout.size, layout.stride))
    return torch.zeros(max(elements, 1), dtype=layout.dtype)


def launches_per_pass(module: Any, graph: PrintedGraph) -> int:
    """The launches a pass makes: each launcher's `kiln_launch` sites (a split reduction has two)."""
    return sum(len([n for n in vars(module) if re.fullmatch(rf"{name}_launch\d+", n)]) for name, _ in graph.launchers)


def _one_pass(modules: list[Any], graphs: list[PrintedGraph]) -> Callable[[], None]:
    """One call of every launcher of `graphs`, loaded as `modules`."""
    calls = [(getattr(module, name), tensors) for module, graph in zip(modules, graphs) for name, tensors in graph.launchers]

    def run() -> None:
        for launcher, tensors in calls:
            launcher(*tensors)

    return run


@dataclass
class LaunchCost:
    """One graph's launches timed by both paths: microseconds per launch."""

    graph: str
    kernels: int
    launches: int  # per pass
    host_us: dict[str, float]  # path -> host time per launch, best round
    gpu_us: dict[str, float] | None = None  # path -> GPU time per launch (CUDA events), best round


def _load(graph: PrintedGraph, direct: bool, on_gpu: bool) -> Any:
    """The module of `graph`, every kernel compiled (precompiled, as when a GPU graph loads)."""
    from kiln.native.build import workers
    from kiln.runtime.triton_kernels import load_module, precompile

    if on_gpu:
        return load_module(graph.source, "cuda", direct=direct)  # (precompiles)
    module = load_module(graph.source, "cpu", interpret=False, direct=direct)
    precompile(module, workers())
    return module


def _timed(run: Callable[[], None], passes: int, on_gpu: bool) -> tuple[float, float | None]:
    """(host seconds, GPU seconds or None) of `passes` calls of `run`. On a GPU the span starts
    with the device idle and the host clock stops before waiting for it."""
    if on_gpu:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    began = time.perf_counter()
    for _ in range(passes):
        run()
    host = time.perf_counter() - began
    if not on_gpu:
        return host, None
    end.record()
    end.synchronize()
    return host, start.elapsed_time(end) / 1e3


def measure(name: str, passes: int, rounds: int, on_gpu: bool) -> LaunchCost:
    """`name`'s launches, through Triton and direct, timed in interleaved rounds (a noisy spell
    of the machine reaches both paths alike); the best round of each."""
    torch.manual_seed(0)
    fn, inputs = GRAPHS[name]()
    graphs = printed_for_a_gpu(fn, inputs)
    if on_gpu:
        graphs = [g.on("cuda") for g in graphs]
    modules = {path: [_load(g, path == "direct", on_gpu) for g in graphs] for path in PATHS}
    passes_of = {path: _one_pass(loaded, graphs) for path, loaded in modules.items()}
    launches = sum(launches_per_pass(m, g) for m, g in zip(modules["direct"], graphs))
    for run in passes_of.values():
        for _ in range(3):  # compiles, autotuning, each direct launch's first call
            run()
    host = dict.fromkeys(PATHS, float("inf"))
    gpu = dict.fromkeys(PATHS, float("inf"))
    for _ in range(rounds):
        for path, run in passes_of.items():
            host_s, gpu_s = _timed(run, passes, on_gpu)
            host[path] = min(host[path], host_s / (passes * launches) * 1e6)
            if gpu_s is not None:
                gpu[path] = min(gpu[path], gpu_s / (passes * launches) * 1e6)
    kernels = sum(len(g.launchers) for g in graphs)
    return LaunchCost(name, kernels, launches, host, gpu if on_gpu else None)


def table(costs: list[LaunchCost]) -> str:
    """The results as a small text table, µs per launch."""
    gpu = costs and costs[0].gpu_us is not None
    header = f"  {'graph':<11}{'kernels':>8}{'launches':>10}" + "".join(f"{'host ' + p:>22}" for p in PATHS)
    header += f"{'host ratio':>12}" + ("".join(f"{'GPU ' + p:>21}" for p in PATHS) if gpu else "")
    lines = [header]
    for c in costs:
        line = f"  {c.graph:<11}{c.kernels:>8}{c.launches:>10}" + "".join(f"{c.host_us[p]:>22.2f}" for p in PATHS)
        line += f"{c.host_us['through Triton'] / c.host_us['direct']:>11.1f}x"
        if gpu:
            line += "".join(f"{c.gpu_us[p]:>21.2f}" for p in PATHS)
        lines.append(line)
    return "\n".join(lines)


def _where(on_gpu: bool) -> str:
    import triton

    from benchmarks.machine import cpu_model, gpu_model

    device = gpu_model() if on_gpu else "no GPU: the stand-in CUDA driver (sm_90, launches do nothing)"
    return f"{device}; CPU {cpu_model()}; torch {torch.__version__}, Triton {triton.__version__}"


def main(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    names = [n.strip() for n in args.graphs.split(",") if n.strip()]
    unknown = [n for n in names if n not in GRAPHS]
    if unknown or not names:
        parser.error(f"--graphs: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(GRAPHS)}")
    if args.passes < 1 or args.rounds < 1:
        parser.error("--passes and --rounds must be at least 1")
    on_gpu = torch.cuda.is_available()
    print(f"microseconds per kernel launch, best of {args.rounds} rounds of {args.passes} passes (the paths in turn)")
    print(f"  {_where(on_gpu)}")
    costs = []
    with tempfile.TemporaryDirectory(prefix="kiln-launch-") as cold, config.patch({"cache.dir": cold}), _driver(on_gpu):
        from kiln.runtime.triton_kernels import binary_cache

        with binary_cache():
            for name in names:
                costs.append(measure(name, args.passes, args.rounds, on_gpu))
    print(table(costs))
    return 0


def _driver(on_gpu: bool) -> contextlib.AbstractContextManager:
    """Triton's own driver on a GPU, the stand-in without one."""
    if on_gpu:
        return contextlib.nullcontext()
    from benchmarks.standin_driver import standin_cuda

    return standin_cuda()


def add_command(commands: Any) -> None:
    parser = commands.add_parser(
        "bench-launch", help="host microseconds per Triton kernel launch: through Triton beside kiln's direct launches",
        description="Times kiln's GPU graphs' Triton launches through Triton's fn[grid](...) and kiln's direct "
        "launches, interleaved; on a machine without a GPU, under a stand-in CUDA driver (host cost only).")
    parser.add_argument("--graphs", default=",".join(GRAPHS), help=f"comma-separated: {', '.join(GRAPHS)}")
    parser.add_argument("--passes", type=int, default=200, help="passes over a graph's launchers per round (default 200)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds, each path in turn; the best is kept (default 7)")
    parser.set_defaults(handler=main)
