"""The benchmark's modes: how one model gets compiled, and whether that is possible yet.

A mode that does not exist yet reports why (`unavailable_reason`) and is shown as "not available";
it is never replaced by something else under its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from torch import nn

# benchmarks measures the peer, Inductor, so it is one of the two places allowed to use torch._dynamo.


@dataclass(frozen=True)
class Mode:
    """One way to run a model.

    `compile(model, **options)` returns the callable to time (`options`, such as `dynamic=True`, go
    to torch.compile or kiln.compile). `unavailable_reason(train)` is None when the mode
    can run, else a sentence saying why not. `stats()` returns graph and break counts where known.
    """

    name: str
    help: str
    compile: Callable[..., Callable]
    unavailable_reason: Callable[[bool], str | None]
    stats: Callable[[], dict[str, int]]


def _always(train: bool) -> None:
    return None


def _no_stats() -> dict[str, int]:
    return {}


def _dynamo_stats() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {
        "graphs": int(counters["stats"]["unique_graphs"]),
        "graph_breaks": int(sum(counters["graph_break"].values())),
    }


def _kiln_dynamo_stats() -> dict[str, int]:
    from kiln.runtime.fallback import FALLBACKS

    return {**_dynamo_stats(), "fallbacks": len(FALLBACKS)}


def _kiln_capture_stats() -> dict[str, int]:
    """kiln.compile: compiled entries (graphs), frames run eagerly (graph breaks, issue 5 has no
    resuming breaks yet) and backend fallbacks."""
    from kiln.capture.break_records import BREAKS
    from kiln.capture.cache import all_caches
    from kiln.runtime.fallback import FALLBACKS

    caches = all_caches()
    return {
        "graphs": sum(len(c.entries) for c in caches),
        "graph_breaks": len(BREAKS),
        "fallbacks": len(FALLBACKS) + sum(c.fallback is not None for c in caches),
    }


def _torch_compile(backend: str = "inductor", freezing: bool = False, mode: str | None = None) -> Callable[..., Callable]:
    def compile(model: nn.Module, **options: Any) -> Callable:
        import torch
        import torch._dynamo

        torch._dynamo.reset()
        if freezing:
            import torch._inductor.config as inductor_config

            inductor_config.freezing = True
        return torch.compile(model, backend=backend, **({"mode": mode} if mode else {}), **options)

    return compile


def _freezing_reason(train: bool) -> str | None:
    return "Inductor freezes weights for inference only" if train else None


def _dynamo_backend_reason(backend: str, issue: str) -> Callable[[bool], str | None]:
    def reason(train: bool) -> str | None:
        import torch._dynamo

        import kiln  # noqa: F401  (registers kiln's backends, once they exist)

        if backend in torch._dynamo.list_backends(exclude_tags=()):
            return None
        return f'torch.compile backend "{backend}" is not registered yet ({issue})'

    return reason


def _kiln_compile(backend: str, mode: str | None = None) -> Callable[..., Callable]:
    def compile(model: nn.Module, **options: Any) -> Callable:
        import kiln

        return kiln.compile(model, backend=backend, **({"mode": mode} if mode else {}), **options)

    return compile


def _kiln_compile_reason(train: bool) -> str | None:
    import kiln

    if callable(getattr(kiln, "compile", None)):
        return None
    return "kiln.compile (kiln's own capture, issue 5) has not landed yet"


def _kiln_mode_reason(mode: str) -> Callable[[bool], str | None]:
    def reason(train: bool) -> str | None:
        from kiln import api

        if mode in getattr(api, "MODES", ()):
            return _kiln_compile_reason(train)
        return f"kiln.compile does not accept mode={mode!r} yet"

    return reason


MODES: dict[str, Mode] = {
    m.name: m
    for m in [
        Mode("eager", "plain PyTorch (timed against itself: the noise floor)", lambda m: m, _always, _no_stats),
        Mode("inductor", 'torch.compile(model) with its defaults', _torch_compile(), _always, _dynamo_stats),
        Mode(
            "inductor-freeze",
            "torch.compile with Inductor's freezing (inference only)",
            _torch_compile(freezing=True),
            _freezing_reason,
            _dynamo_stats,
        ),
        Mode(
            "inductor-max-autotune",
            'torch.compile(mode="max-autotune") with Inductor\'s freezing (inference only; on CPU it times '
            "Inductor's C++ GEMM templates against the libraries, so compiling can take many minutes)",
            _torch_compile(freezing=True, mode="max-autotune"),
            _freezing_reason,
            _dynamo_stats,
        ),
        Mode(
            "inductor-reduce-overhead",
            'torch.compile(model, mode="reduce-overhead"): Inductor replaying CUDA graphs (on CPU the same as inductor)',
            _torch_compile(mode="reduce-overhead"),
            _always,
            _dynamo_stats,
        ),
        Mode("kiln", "kiln.compile(model): kiln's capture and backend", _kiln_compile("kiln"), _kiln_compile_reason, _kiln_capture_stats),
        Mode(
            "kiln-reduce-overhead",
            'kiln.compile(model, mode="reduce-overhead"): kiln replaying CUDA graphs (on CPU the same as kiln)',
            _kiln_compile("kiln", mode="reduce-overhead"),
            _kiln_mode_reason("reduce-overhead"),
            _kiln_capture_stats,
        ),
        Mode(
            "kiln-dynamo",
            'torch.compile(model, backend="kiln"): Dynamo capture, kiln backend',
            _torch_compile("kiln"),
            _dynamo_backend_reason("kiln", "issue 4"),
            _kiln_dynamo_stats,
        ),
        Mode(
            "kiln-eager",
            'kiln.compile(model, backend="eager"): kiln capture only (debug)',
            _kiln_compile("eager"),
            _kiln_compile_reason,
            _kiln_capture_stats,
        ),
        Mode(
            "dynamo-eager",
            'torch.compile(model, backend="eager"): Dynamo capture only (the peer of kiln-eager)',
            _torch_compile("eager"),
            _always,
            _dynamo_stats,
        ),
        Mode(
            "kiln-aot-eager",
            'torch.compile(model, backend="kiln_aot_eager"): Dynamo capture + kiln AOT (debug)',
            _torch_compile("kiln_aot_eager"),
            _dynamo_backend_reason("kiln_aot_eager", "issue 3"),
            _kiln_dynamo_stats,
        ),
    ]
}
