"""GPU convolutions (the `conv_layout` pass, given a CUDA target, on an ATen graph of CPU
tensors: ATen runs it on the CPU the same; tests/codegen/test_triton_models.py runs it end to end
through Triton kernels under the interpreter): frozen weights made channels-last once, so the values
between convolutions are channels-last, the graph's outputs keep eager's layout, and a
convolution's bias joins the kernel that reads its output. C++ graphs are not touched."""

import torch

from kiln.backend.codegens import CODEGENS
from kiln.ir.target import Target
from kiln.lowering.registry import LOWERINGS
from kiln.passes.conv_layout import conv_layout
from tests.kiln_backend import rewritten_until

aten = torch.ops.aten


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.norm = torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 1)

    def forward(self, x):
        h = torch.relu(self.norm(self.conv1(x)))
        return h + self.conv2(h)


def rewritten(model, x, codegen="triton"):
    """(the ATen graph after the passes up to conv_layout for a GPU, or C++, its output on x)."""
    return rewritten_until("conv_layout", model, x, codegen, {"backend.freezing": True})


def calls(gm, op):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is op]


def test_frozen_weights_become_channels_last_and_biases_join_the_next_kernel():
    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(2, 4, 10, 10)
    model.norm.running_mean.uniform_(-1, 1)
    gm, out = rewritten(model, x)
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
    convolutions = calls(gm, aten.convolution.default)
    assert len(convolutions) == 2 and all(c.args[2] is None for c in convolutions)  # biases in the adds
    weight = convolutions[0].args[1]  # (the 1x1 convolution's weight is channels-last as it is)
    assert weight.target is aten.clone.default and weight.kwargs["memory_format"] == torch.channels_last
    assert len(calls(gm, aten.clone.default)) == 1
    for conv in convolutions:
        assert conv.meta["val"].is_contiguous(memory_format=torch.channels_last)
    relu = calls(gm, aten.relu.default)[0]
    assert relu.meta["val"].is_contiguous(memory_format=torch.channels_last)  # kernels between them too
    output = next(n for n in gm.graph.nodes if n.op == "output").args[0][0]
    assert output.meta["val"].is_contiguous()  # what the graph returns: eager's layout


def test_a_bias_read_by_an_extern_stays_in_the_convolution():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 4, 3), torch.nn.ReLU()).eval()
    x = torch.randn(1, 3, 9, 9)
    gm, out = rewritten(model, x)
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
    first, second = calls(gm, aten.convolution.default)
    assert first.args[2] is not None and second.args[2] is None  # the first's reader is a convolution, the second's a ReLU


def test_cpp_graphs_are_left_to_conv_prepack():
    model, x = Block().eval(), torch.randn(1, 4, 6, 6)
    gm, _ = rewritten(model, x, codegen="cpp")
    assert not conv_layout(gm, Target("cpu", CODEGENS["cpp"].traits, frozenset(LOWERINGS)))
    assert not calls(gm, aten.clone.default)
