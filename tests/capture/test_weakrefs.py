"""weakref.ref in compiled code (kiln/capture/variables/weakrefs.py): made inside, called, returned;
read from the frame, its referent read through it and guarded, so a freed referent compiles again."""

import gc
import weakref

import pytest
import torch

import kiln


def test_a_reference_made_inside_is_called_and_returned():
    def fn(x, y):
        doubled = x * 2
        ref = weakref.ref(doubled)
        return ref() * y, ref, doubled

    compiled = kiln.compile(fn, backend="eager", fullgraph=True)
    x, y = torch.randn(3), torch.randn(3)
    out, ref, doubled = compiled(x, y)
    torch.testing.assert_close(out, fn(x, y)[0])
    assert type(ref) is weakref.ref and ref() is doubled


def test_a_reference_argument_is_read_through_and_its_referent_guarded():
    def fn(x_weak, weight, y):
        x = x_weak()
        if x is None:
            return torch.cos(y)
        return torch.sin(y) * (2 if x is weight else 3) + x

    compiled = kiln.compile(fn, backend="eager", fullgraph=True)
    weight, other, y = torch.randn(4), torch.randn(4), torch.randn(4)
    ref = weakref.ref(weight)
    for args in ((ref, weight, y), (ref, other, y)):
        torch.testing.assert_close(compiled(*args), fn(*args))
    del weight, args
    gc.collect()
    assert ref() is None
    torch.testing.assert_close(compiled(ref, other, y), torch.cos(y))  # freed: the guard fails, compiled again


def test_a_callback_is_refused_with_a_reason():
    def fn(x):
        return weakref.ref(x, lambda r: None)

    with pytest.raises(kiln.CaptureError, match="callback"):
        kiln.compile(fn, backend="eager", fullgraph=True)(torch.ones(1))
