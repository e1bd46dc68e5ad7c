"""`torch.autograd.Function.apply` under capture, in inference.

HF models wrap ops in their own `autograd.Function`s (BLOOM's GeLU, some quantized and fused
layers). `Function.apply` ends in `_FunctionBase.apply`, written in C: calling it while capturing
ends the graph. With gradients off (`torch.no_grad()`, inference — what kiln compiles and
benchmarks) no backward will run, and `apply` computes exactly `forward`: capture inlines
`cls.forward(ctx, *args)` with a context that keeps what forward saves and is never read, so the
Function's ops join the graph. With gradients on, `apply` stays a graph break (the backward is
the Function's own Python, which kiln's AOT layer does not trace).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from kiln.capture.break_records import unsupported
from kiln.capture.variables.base import Variable

PY_APPLY = torch.autograd.Function.__dict__["apply"]  # `MyFunction.apply`, as the class holds it
C_APPLY = torch._C._FunctionBase.__dict__["apply"]  # what `super().apply` reaches from a Python apply


class InferenceContext:
    """The `ctx` a Function's forward gets when no backward will run: the calls forward makes on
    it are accepted and change nothing that matters."""

    def save_for_backward(self, *tensors: Any) -> None:
        self.saved_tensors = tensors

    def save_for_forward(self, *tensors: Any) -> None:
        pass

    def mark_dirty(self, *tensors: Any) -> None:
        pass

    def mark_non_differentiable(self, *tensors: Any) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        pass


class FunctionApplyVariable(Variable):
    """`_FunctionBase.apply` bound to an `autograd.Function` subclass `cls`."""

    def __init__(self, cls: type) -> None:
        super().__init__(None)
        self.cls = cls

    def python_type(self) -> type:
        return type(self.cls.apply)

    def describe(self) -> str:
        return f"{self.cls.__qualname__}.apply"

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        from kiln.capture.variables.objects import ClassVariable  # objects.py imports this module

        if tx.output.graph_grad:
            raise unsupported("unsupported_call", f"calling autograd.Function {self.cls.__qualname__}.apply with gradients on",
                              "kiln inlines an autograd.Function's forward in inference (under torch.no_grad()); with "
                              "gradients on its backward is the Function's own Python, run eagerly at this graph break")
        forward = ClassVariable(self.cls).getattr(tx, "forward")
        if _has_setup_context(self.cls):  # the newer form: forward(*args), the context set up apart
            return forward.call(tx, list(args), kwargs)
        ctx = ClassVariable(InferenceContext).call(tx, [], {})
        return forward.call(tx, [ctx, *args], kwargs)


def _has_setup_context(cls: type) -> bool:
    base = torch.autograd.function._SingleLevelFunction.setup_context
    return getattr(cls, "setup_context", base) is not base
