import torch

from tests.capture.util import check, op_count


def test_arithmetic_on_tensors_and_constants():
    def f(x, y=2, *, scale=1.0):
        z = x * y + 1
        if scale > 0.5:
            z = z.sin()
        return {"a": z, "b": [z.cos(), z * 2]}, len(x.shape)

    compiled = check(f, torch.randn(4), 3, scale=0.7)
    assert op_count(compiled) == 5
