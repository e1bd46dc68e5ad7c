"""autograd.Function under kiln's capture: in inference its forward is inlined (one graph, as HF
BLOOM's GeLU needs); with gradients on, `apply` is a graph break and the user's backward runs."""

import pytest
import torch

import kiln


class TanhGelu(torch.autograd.Function):
    """BLOOM's GeLUFunction's shape: forward(ctx, x) saving its input."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3.0  # deliberately not the derivative: the test sees whose backward ran


class ScaledSin(torch.autograd.Function):
    """The newer form: forward without ctx, setup_context apart, a default argument."""

    @staticmethod
    def forward(x, k=2.0):
        return x.sin() * k

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.k = inputs[1]

    @staticmethod
    def backward(ctx, grad):
        return grad * 5.0, None


def both(x):
    return ScaledSin.apply(TanhGelu.apply(x + 1)) * 2 + ScaledSin.apply(x, 3.0)


def test_in_inference_the_forward_joins_the_graph():
    kiln.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = kiln.compile(both, backend=backend, fullgraph=True)
    x = torch.randn(16)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), both(x))
    assert len(graphs) == 1 and kiln.capture.BREAKS == []
    targets = {getattr(n.target, "__name__", str(n.target)) for n in graphs[0].graph.nodes}
    assert {"tanh", "sin"} <= targets


def test_with_gradients_on_the_users_backward_runs():
    kiln.reset()
    x = torch.randn(16, requires_grad=True)
    expected = torch.autograd.grad(both(x).sum(), x)[0]
    compiled = kiln.compile(both)
    got = torch.autograd.grad(compiled(x).sum(), x)[0]
    torch.testing.assert_close(got, expected)  # the planted backwards (x3, x5), not tanh's and sin's derivatives
    assert any("with gradients on" in record.explanation for record in kiln.capture.BREAKS)
    with pytest.raises(kiln.CaptureError, match="with gradients on"):
        kiln.compile(both, fullgraph=True)(x)
