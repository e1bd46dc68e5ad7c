"""OpInfo samples through torch.compile(backend="kiln_aot_eager"), forward and backward, vs eager.

A representative subset runs here; `python -m tests.aot.sweep_opinfo` sweeps the whole database.
"""

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

from tests.aot.opinfo import assert_outcomes, check_sample

SUBSET = [
    "add", "mul", "div", "sub", "exp", "log", "sin", "tanh", "sigmoid", "pow", "rsqrt", "abs", "where",
    "clamp", "masked_fill", "nn.functional.gelu", "nn.functional.relu", "nn.functional.silu",
    "softmax", "log_softmax", "sum", "mean", "amax", "var", "std", "prod", "cumsum",
    "matmul", "mm", "bmm", "addmm", "nn.functional.linear", "nn.functional.layer_norm",
    "nn.functional.embedding", "nn.functional.conv2d", "nn.functional.batch_norm",
    "cat", "stack", "transpose", "permute", "reshape", "view", "expand", "squeeze", "unsqueeze", "flatten",
    "index_select", "gather", "scatter_add", "select", "split", "topk", "sort", "max", "argmax",
    "nn.functional.cross_entropy", "nn.functional.pad",
]
SAMPLES_PER_OP = 3
# Dropout and SDPA OpInfo wrappers are opaque to Dynamo; test_training.py covers both directly.


def _cases():
    ops = {}
    for op in op_db:
        if op.name in SUBSET and op.name not in ops:  # the first variant of each
            ops[op.name] = op
    missing = set(SUBSET) - set(ops)
    assert not missing, f"not in op_db: {missing}"
    return [ops[name] for name in SUBSET]


def _samples(op, requires_grad):
    samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=requires_grad))
    return samples[:SAMPLES_PER_OP]


@pytest.mark.parametrize("op", _cases(), ids=lambda op: op.name)
def test_forward(op):
    outcomes = [check_sample(op, s, backward=False) for s in _samples(op, requires_grad=False)]
    assert_outcomes(outcomes)


@pytest.mark.parametrize("op", [op for op in _cases() if op.supports_autograd], ids=lambda op: op.name)
def test_backward(op):
    outcomes = [check_sample(op, s, backward=True) for s in _samples(op, requires_grad=True)]
    assert_outcomes(outcomes)
