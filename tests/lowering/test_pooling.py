"""2-d max pooling as kiln's own kernels (kiln/lowering/pooling.py): values and eager's indices
(first maximum of the window, a NaN winning), with padding, ceil mode, dilation and channels-last
inputs; inference computes no indices."""

import pytest
import torch
import torch.nn.functional as F

from tests.lowering.support import check, through

aten = torch.ops.aten
POOL = [aten.max_pool2d_with_indices.default]


@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=3, stride=2, padding=1),                            # ResNet's stem pool
    dict(kernel_size=2),                                                 # stride = kernel
    dict(kernel_size=3, stride=2, ceil_mode=True),                       # the last window past the end
    dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2)),
])
@pytest.mark.parametrize("channels_last", [False, True])
def test_values_and_indices_are_eagers(kwargs, channels_last):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 11, 13).round(decimals=1)  # ties: the first maximum's index
    x[0, 0, 1, 1], x[1, 2, 4, 4], x[1, 2, 4, 5] = float("nan"), float("nan"), float("nan")
    x[1, 3] = -float("inf")  # a plane of -inf: the window's first position
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    check(lambda x: F.max_pool2d(x, return_indices=True, **kwargs), x, lowered=POOL, exact=True)


def test_inference_computes_the_values_alone():
    x = torch.randn(1, 8, 16, 16)
    with torch.no_grad():
        out, program = through("cpp", lambda x: F.max_pool2d(x, 3, 2, 1) + 1, x)
    torch.testing.assert_close(out, F.max_pool2d(x, 3, 2, 1) + 1)
    assert not program.externs
    assert [step.buffer.layout.dtype for step in program.kernels] == [torch.float32]  # no index kernel
