"""kiln's backends made known to `torch.compile(model, backend=...)`.

This module only adapts Dynamo's calling convention: Dynamo calls a backend with a torch-level
`fx.GraphModule` and example inputs, which is already how kiln's backends are called
(kiln/backend/backends.py), so naming them is all there is to do. Dynamo finds them through the
`torch_dynamo_backends` entry point (pyproject.toml), so `torch.compile(model, backend="kiln")`
works without importing kiln first; `register()` names them explicitly where entry points are
not installed.
"""

from __future__ import annotations

from kiln.backend.backends import kiln, kiln_aot_eager

__all__ = ["kiln", "kiln_aot_eager", "register"]


def register() -> None:
    """Make kiln's backends known to torch.compile by name (idempotent)."""
    from torch._dynamo import list_backends, register_backend

    known = set(list_backends(exclude_tags=()))
    for name, backend in {"kiln": kiln, "kiln_aot_eager": kiln_aot_eager}.items():
        if name not in known:
            register_backend(name=name)(backend)
