"""OpInfo samples through `torch.compile(backend="kiln")` with Triton kernels
(`backend.codegen = "triton"`), run by Triton's interpreter on CPU tensors, against eager; and every
Triton kernel those graphs generated compiled for an H100 (sm_90) by Triton's compiler.

The C++ subset's lists (tests/ops/test_opinfo_kiln.py) less the ops libdevice has no function for,
plus more pointwise, reduction, normalization, loss and view ops. `python -m tests.ops.sweep_opinfo
--codegen triton` sweeps the whole database.

On a GPU machine, `KILN_TEST_DEVICE=cuda` runs the same samples on CUDA tensors: the kernels are
then compiled and run by Triton for the GPU itself (kiln's default code generator there).
"""

import os

import pytest
import torch

import kiln
from kiln.backend import watch
from kiln.runtime.compiled_graph import CompiledGraph
from kiln.runtime.frozen import FrozenProgram
from kiln.runtime.triton_kernels import build_for_gpu
from tests.aot.opinfo import assert_outcomes, check_sample
from tests.ops.test_opinfo_kiln import (BACKWARD_GENERATED, FORWARD_GENERATED, INT64_GENERATED, OPS,
                                        SAMPLES_PER_OP)

# Special functions neither libdevice nor kiln's Triton helpers have (digamma, trigamma, polygamma of
# higher orders, Hurwitz zeta, i0e, i1e, spherical Bessel j0 and frexp are kiln's own): their graphs
# run through ATen, the reason recorded.
NO_LIBDEVICE = ["special.chebyshev_polynomial_t", "special.modified_bessel_k0", "special.airy_ai", "igamma"]
FORWARD_MORE = [
    # pointwise math (libdevice)
    "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "expm1", "log1p", "log2", "log10", "exp2",
    "erf", "erfc", "lgamma", "trunc", "round", "floor", "ceil", "sign", "sgn", "square", "reciprocal", "sqrt",
    "frac", "fmod", "hypot", "copysign", "nextafter", "cos", "tan", "sinc", "logit", "deg2rad", "rad2deg",
    "special.erfcx", "special.ndtri", "i0", "special.i1", "special.bessel_j1", "special.bessel_y0",
    "special.i0e", "special.i1e", "special.spherical_bessel_j0", "frexp", "special.zeta",
    "polygamma.polygamma_n_1", "polygamma.polygamma_n_2", "polygamma.polygamma_n_3", "polygamma.polygamma_n_4",
    # comparisons, selection, promotion
    "minimum", "min.binary", "fmax", "fmin", "clamp_min", "clamp_max", "xlogy", "logaddexp", "isnan", "isinf",
    "isfinite", "signbit", "nan_to_num", "addcdiv", "heaviside", "float_power", "floor_divide",
    "logical_or", "logical_xor", "ne", "le", "ge", "gt", "positive", "angle",
    # activations
    "nn.functional.softplus", "nn.functional.elu", "nn.functional.leaky_relu", "nn.functional.hardswish",
    "nn.functional.hardsigmoid", "nn.functional.mish", "nn.functional.selu", "nn.functional.celu",
    "nn.functional.glu", "nn.functional.logsigmoid", "nn.functional.tanhshrink", "nn.functional.softsign",
    "nn.functional.threshold", "nn.functional.relu6", "nn.functional.hardshrink", "nn.functional.softshrink",
    # reductions, normalizations, losses
    "min.reduction_with_dim", "max.reduction_no_dim", "amin", "argmin", "aminmax", "std", "std_mean", "var_mean",
    "nansum", "all", "count_nonzero", "sum_to_size", "log_softmax", "nn.functional.softmin",
    "nn.functional.normalize", "nn.functional.group_norm", "nn.functional.batch_norm",
    "nn.functional.instance_norm", "nn.functional.mse_loss", "nn.functional.l1_loss", "nn.functional.smooth_l1_loss",
    "nn.functional.huber_loss", "nn.functional.kl_div", "nn.functional.nll_loss",
    "nn.functional.binary_cross_entropy",
    # views, copies, scatters into slices, factories
    "roll", "tril", "triu", "repeat", "tile", "atleast_2d", "narrow_copy", "select_scatter", "slice_scatter",
    "diagonal_scatter", "masked_scatter", "clone", "rot90", "vstack", "hstack", "dstack", "split", "diag_embed",
    "nn.functional.pixel_shuffle", "nn.functional.pixel_unshuffle", "fill", "zeros_like", "ones_like", "full_like",
]
FORWARD = [n for n in FORWARD_GENERATED if n not in NO_LIBDEVICE] + FORWARD_MORE
INT64 = INT64_GENERATED + ["bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "bitwise_left_shift",
                           "bitwise_right_shift", "floor_divide", "remainder"]
BACKWARD = BACKWARD_GENERATED + ["digamma", "lgamma", "mvlgamma.mvlgamma_p_1", "cumprod"]


def _triton_graphs(built: list) -> list[CompiledGraph]:
    graphs = [b.runtime if isinstance(b, FrozenProgram) else b for b in built]
    return [g for g in graphs if isinstance(g, CompiledGraph) and g.artifact.codegen == "triton" and g.stages]


DEVICE = os.environ.get("KILN_TEST_DEVICE", "cpu")


def _run(name: str, dtype: torch.dtype, backward: bool) -> list:
    op = OPS[name]
    samples = list(op.sample_inputs(DEVICE, dtype, requires_grad=backward))[:SAMPLES_PER_OP]
    with kiln.config.patch({"backend.codegen": "triton"}), watch() as built:
        outcomes = [check_sample(op, s, backward, backend="kiln") for s in samples]
    return outcomes, _triton_graphs(built)


def _check(name: str, dtype: torch.dtype, backward: bool) -> None:
    outcomes, graphs = _run(name, dtype, backward)
    assert_outcomes(outcomes)
    if DEVICE != "cpu":
        assert all(g.artifact.device == DEVICE for g in graphs)
        return  # built and run on the GPU itself
    for graph in graphs:  # every kernel the interpreter ran also builds for a GPU
        kernels = graph.stages.kernels
        build_for_gpu(kernels.source, [f for group in kernels.jit.values() for f in group])


@pytest.mark.parametrize("name", FORWARD)
def test_forward(name):
    _check(name, torch.float32, backward=False)


@pytest.mark.parametrize("name", INT64)
def test_forward_int64(name):
    _check(name, torch.int64, backward=False)


@pytest.mark.parametrize("name", BACKWARD)
def test_backward(name):
    _check(name, torch.float32, backward=True)


@pytest.mark.parametrize("name", NO_LIBDEVICE)
def test_ops_libdevice_lacks_are_aten_calls_in_the_compiled_graph(name):
    outcomes, graphs = _run(name, torch.float32, backward=False)
    assert_outcomes(outcomes)
    assert graphs and all(g.schedule.externs for g in graphs)  # the op itself, through ATen


def test_the_subset_is_large_enough_and_names_ops():
    assert len(set(FORWARD)) + len(set(BACKWARD)) >= 150
    assert [n for n in FORWARD + INT64 + BACKWARD + NO_LIBDEVICE if n not in OPS] == []
