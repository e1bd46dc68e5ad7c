"""Attributes of tensors inside captured code: what the class has but kiln does not model breaks
the graph; an input's own attributes (`x.test = ...`) are read and their presence guarded."""

import pytest
import torch

import kiln
from tests.capture.util import assert_same, check


def test_tensor_attributes_kiln_does_not_model_break_rather_than_raise():
    def leaf_grad_fn(x, w):
        return x + 1, x.grad_fn, w.grad_fn, hasattr(x, "no_such_attribute")

    w = torch.nn.Parameter(torch.ones(2))
    check(leaf_grad_fn, torch.randn(2), w)

    def version(x):
        y = x * 2
        return y + y._version

    compiled = kiln.compile(version, backend="eager")
    x = torch.randn(2)
    assert_same(compiled(x), version(x))
    assert compiled.kiln_cache.fallback is None
    with pytest.raises(kiln.CaptureError, match="tensor._version"):
        kiln.compile(version, backend="eager", fullgraph=True)(x)


def test_an_inputs_own_attribute_is_read_and_its_presence_guarded():
    # Dynamo's test_misc.py test_tensor_hasattr: kiln answered hasattr(x, "test") False for an
    # input that had it (a wrong result).
    def fn(x):
        if hasattr(x, "test"):
            return x * x.test
        return x + 1

    compiled = kiln.compile(fn, backend="eager", fullgraph=True)
    plain, tagged = torch.ones(2), torch.ones(2)
    tagged.test = 3.0
    torch.testing.assert_close(compiled(plain), plain + 1)
    torch.testing.assert_close(compiled(tagged), tagged * 3)
    tagged.test = 5.0  # a new value: guarded like any attribute
    torch.testing.assert_close(compiled(tagged), tagged * 5)
    torch.testing.assert_close(compiled(plain), plain + 1)
