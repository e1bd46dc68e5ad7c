"""Layer norm, batch norm, softmax and variance lowered to reductions and pointwise kernels."""

import torch
import torch.nn.functional as F

from tests.lowering.support import check, through

aten = torch.ops.aten


def test_layer_norm_returns_out_mean_rstd_with_eager_shapes():
    x, w, b = torch.randn(2, 5, 16) * 3 + 1, torch.randn(5, 16), torch.randn(5, 16)
    fn = lambda x, w, b: (aten.native_layer_norm(x, [5, 16], w, b, 1e-5),  # noqa: E731
                          aten.native_layer_norm(x, [16], None, None, 0.1))
    programs = check(fn, x, w, b, lowered=[aten.native_layer_norm.default])
    assert not programs["cpp"].externs


def test_layer_norm_of_a_non_contiguous_input_with_large_mean_keeps_its_variance():
    # Two passes: a mean of 1000 with unit spread keeps its variance. The mean of squares minus the
    # squared mean would lose it (float32 squares near 1e6 are 0.06 apart): errors of several 1e-2.
    # Judged against float64: both kiln and eager are off by about one float32 step of 1000 (6e-5).
    x = (torch.randn(16, 24, generator=torch.Generator().manual_seed(0)) + 1000).t()
    truth = F.layer_norm(x.double(), [16])
    assert (F.layer_norm(x, [16]).double() - truth).abs().max() < 5e-4
    for backend in ("reference", "cpp"):
        out, program = through(backend, lambda x: F.layer_norm(x, [16]), x)
        assert (out.double() - truth).abs().max() < 5e-4, backend
        assert not program.externs


def test_layer_norm_is_five_steps_shifted_sum_mean_variance_rstd_output():
    _, program = through("reference", lambda x: F.layer_norm(x, [8]), torch.randn(4, 8))
    kinds = [type(step.node).__name__ for step in program.kernels]
    assert kinds == ["Reduction", "Pointwise", "Reduction", "Pointwise", "Pointwise"], kinds


def test_a_constant_row_normalizes_to_exactly_the_bias():
    # Found by the graph fuzzer: clamp then layer_norm, a row of six equal values. A mean summed
    # as x * (1/6) was one rounding off, and 1/sqrt(eps) made that 4.7e-6 at weight 1.
    x = torch.full((3, 6), -0.17646543681621552)
    x[1] = torch.arange(6.0)
    w, b = torch.randn(6), torch.randn(6)
    fn = lambda x, w, b: F.layer_norm(x, [6], w, b)  # noqa: E731
    for backend in ("reference", "cpp"):
        out, _ = through(backend, fn, x, w, b)
        assert torch.equal(out[0], b) and torch.equal(out[2], b), backend
        torch.testing.assert_close(out, fn(x, w, b))


def test_batch_norm_inference_and_empty_saved_stats():
    x, mean, var, w, b = torch.randn(2, 3, 4, 5), torch.randn(3), torch.rand(3) + 0.5, torch.randn(3), torch.randn(3)
    fn = lambda x, w, b, m, v: aten._native_batch_norm_legit_no_training(x, w, b, m, v, 0.1, 1e-5)  # noqa: E731
    check(fn, x, w, b, mean, var, lowered=[aten._native_batch_norm_legit_no_training.default])
    check(lambda x, m, v: F.batch_norm(x, m, v, training=False), x[:, :, 0], mean, var,
          lowered=[aten._native_batch_norm_legit_no_training.default])


def test_batch_norm_training_statistics_and_running_updates():
    x, w, b = torch.randn(4, 3, 5, 2) * 2 + 3, torch.randn(3), torch.randn(3)
    fn = lambda x, w, b, m, v: aten._native_batch_norm_legit_functional(x, w, b, m, v, True, 0.1, 1e-5)  # noqa: E731
    check(fn, x, w, b, torch.randn(3), torch.rand(3), lowered=[aten._native_batch_norm_legit_functional.default])


def test_softmax_and_log_softmax_with_infinite_rows():
    x = torch.randn(5, 7)
    x[1, 2] = float("-inf")
    x[3] = float("-inf")  # a row of -inf: NaN, as in eager
    fn = lambda x: (aten._softmax(x, 1, False), aten._log_softmax(x, -1, False), aten._softmax(x, 0, False))  # noqa: E731
    check(fn, x, lowered=[aten._softmax.default, aten._log_softmax.default])


def test_var_std_var_mean_with_corrections():
    x = torch.randn(4, 6, 5) + 10
    fn = lambda x: (aten.var.correction(x, [1], correction=1), aten.std.correction(x, [0, 2], correction=0, keepdim=True),  # noqa: E731
                    aten.var_mean.correction(x, [2], correction=2), aten.var_mean.correction(x, None, keepdim=True),
                    aten.var.correction(x, [1], correction=6))  # count minus correction is 0: inf, as in eager
    check(fn, x, lowered=[aten.var.correction, aten.std.correction, aten.var_mean.correction])


def test_softmax_of_a_0d_tensor():
    check(lambda x: (aten._softmax(x, 0, False), aten._log_softmax(x, -1, False)), torch.tensor(3.0),
          lowered=[aten._softmax.default, aten._log_softmax.default])


def test_group_norm_with_and_without_affine():
    x, w, b = torch.randn(2, 6, 3, 4) + 2, torch.randn(6), torch.randn(6)
    fn = lambda x, w, b: (aten.native_group_norm(x, w, b, 2, 6, 12, 3, 1e-5), F.group_norm(x[:, :, 0], 2))  # noqa: E731
    check(fn, x, w, b, lowered=[aten.native_group_norm.default])
