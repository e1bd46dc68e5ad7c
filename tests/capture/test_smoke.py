import torch

import kiln

from tests.capture.util import check, op_count


def test_arithmetic_on_tensors_and_constants():
    def f(x, y=2, *, scale=1.0):
        z = x * y + 1
        if scale > 0.5:
            z = z.sin()
        return {"a": z, "b": [z.cos(), z * 2]}, len(x.shape)

    compiled = check(f, torch.randn(4), 3, scale=0.7)
    assert op_count(compiled) == 5


def test_aten_ops_called_through_torch_ops_are_graph_calls():
    """`torch.ops.aten.relu(x)`: once a frame run eagerly (torch.ops answered the question "is this
    function disabled for compilers?" with a namespace it made up)."""
    def f(x):
        return torch.ops.aten.relu(x) * 2 + torch.ops.aten.add.Tensor(x, 1)

    x = torch.randn(5)
    report = kiln.explain(f, x)
    assert report.graph_count == 1 and not report.breaks
    torch.testing.assert_close(kiln.compile(f)(x), f(x))
