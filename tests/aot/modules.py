"""Check one `module_db` entry through torch.compile(backend="kiln_aot_eager") against eager:
outputs, input gradients and parameter gradients (and buffers, e.g. running statistics)."""

from __future__ import annotations

import copy

import torch
from torch.nn.parameter import is_lazy
from torch.utils import _pytree as pytree

from tests.aot.opinfo import CountingBackend, Outcome, raised

RANDOM_MODULES = {"FractionalMaxPool2d", "FractionalMaxPool3d", "RReLU"}


def _tensors(tree) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def _clone_inputs(forward_input):
    return pytree.tree_map(
        lambda t: t.detach().clone().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t,
        (forward_input.args, forward_input.kwargs),
    )


def _run(module, args, kwargs, backward: bool):
    out = module(*args, **kwargs)
    grads = []
    if backward:
        outs = [t for t in _tensors(out) if t.requires_grad]
        wants = [t for t in (*_tensors((args, kwargs)), *module.parameters()) if t.requires_grad]
        if outs and wants:
            gen = torch.Generator().manual_seed(0)
            cot = [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in outs]
            grads = list(torch.autograd.grad(outs, wants, cot, allow_unused=True))
    return out, grads


def check_module(module_info, module_input, training: bool) -> Outcome:
    backward = module_input.forward_input is not None and training
    try:
        torch.manual_seed(0)
        module = module_info.module_cls(*module_input.constructor_input.args, **module_input.constructor_input.kwargs)
        module.train(training)
        if any(is_lazy(p) for p in module.parameters()):
            # Lazy modules draw their weights on the first call: draw them once, before the copy.
            with torch.no_grad():
                module(*_clone_inputs(module_input.forward_input)[0], **_clone_inputs(module_input.forward_input)[1])
        twin = copy.deepcopy(module)
        args, kwargs = _clone_inputs(module_input.forward_input)
        expected, expected_grads = _run(module, args, kwargs, backward)
    except Exception as e:  # noqa: BLE001 - eager rejects it: says nothing about kiln
        return Outcome("eager-error", f"{type(e).__name__}: {e}")
    backend = CountingBackend()
    args, kwargs = _clone_inputs(module_input.forward_input)
    try:
        actual, actual_grads = _run(torch.compile(twin, backend=backend), args, kwargs, backward)
    except Exception as e:  # noqa: BLE001
        return raised(e)
    if (unjudged := backend.verdict()) is not None:
        return unjudged
    if module_info.module_cls.__name__ in RANDOM_MODULES:
        return Outcome("pass")
    try:
        tol = dict(equal_nan=True, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(actual, expected, **tol)
        torch.testing.assert_close(actual_grads, expected_grads, **tol)
        torch.testing.assert_close(dict(twin.named_buffers()), dict(module.named_buffers()), **tol)
    except AssertionError as e:
        return Outcome("fail", str(e).strip().splitlines()[0])
    return Outcome("pass")
