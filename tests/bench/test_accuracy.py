"""The tolerance rule of kiln bench, on hand-made outputs."""

from collections import OrderedDict

import pytest
import torch

from benchmarks.accuracy import compare, flatten_tensors


def _never() -> list[torch.Tensor]:
    raise AssertionError("the float64 reference must not be needed here")


def test_flatten_nested_outputs_in_order():
    a, b, c = torch.zeros(1), torch.ones(2), torch.arange(3)
    out = OrderedDict(last_hidden_state=a, extra=None, hidden=(b, [c]))
    assert [t.data_ptr() for t in flatten_tensors(out)] == [a.data_ptr(), b.data_ptr(), c.data_ptr()]


def test_identical_outputs_pass_by_fp32_rule():
    x = torch.randn(4, 5)
    v = compare([x.clone()], [x], _never)
    assert v.passed and v.rule == "fp32" and v.max_abs_err == 0.0


def test_small_relative_error_passes_without_fp64():
    x = torch.randn(100)
    v = compare([x * (1 + 1e-5)], [x], _never)
    assert v.passed and v.rule == "fp32"


def test_absolute_part_scales_with_the_tensor():
    # Gradients can be ~1e-6 everywhere: an absolute 1e-3 would pass anything, the scaled one not.
    ref = torch.full((10,), 1e-6)
    wrong = ref * 3
    truth = [ref.double()]
    v = compare([wrong], [ref], lambda: truth)
    assert not v.passed and v.rule == "fp64"


def test_fp64_arbiter_accepts_error_no_worse_than_eager():
    truth = torch.randn(1000, dtype=torch.float64)
    noise = torch.randn(1000, dtype=torch.float64)
    eager = (truth + 0.01 * noise).float()  # eager itself is off by ~1e-2
    ours = (truth - 0.01 * noise).float()  # as far from the truth, on the other side
    v = compare([ours], [eager], lambda: [truth])
    assert v.passed and v.rule == "fp64"


def test_fp64_arbiter_rejects_error_far_worse_than_eager():
    truth = torch.randn(1000, dtype=torch.float64)
    eager = truth.float()
    ours = (truth + 0.1 * torch.randn(1000, dtype=torch.float64)).float()
    v = compare([ours], [eager], lambda: [truth])
    assert not v.passed and "rms error" in v.detail


@pytest.mark.parametrize(
    "ours, ref, words",
    [
        (torch.zeros(2, 3), torch.zeros(3, 2), "vs eager"),
        (torch.zeros(3, dtype=torch.float64), torch.zeros(3), "vs eager"),
        (torch.tensor([1, 2]), torch.tensor([1, 3]), "integer values differ"),
        (torch.tensor([float("nan"), 1.0]), torch.tensor([0.0, 1.0]), "NaN or infinity"),
        (torch.tensor([float("inf")]), torch.tensor([float("-inf")]), "NaN or infinity"),
    ],
)
def test_mismatches_fail_with_a_reason(ours, ref, words):
    v = compare([ours], [ref], _never)
    assert not v.passed and words in v.detail


def test_matching_nans_and_infinities_pass():
    ref = torch.tensor([float("nan"), float("inf"), 2.0])
    assert compare([ref.clone()], [ref], _never).passed


def test_output_count_must_match():
    v = compare([torch.zeros(1)], [torch.zeros(1), torch.zeros(1)], _never)
    assert not v.passed and "2" in v.detail
