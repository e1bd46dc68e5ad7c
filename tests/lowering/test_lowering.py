"""ATen graphs lowered to loop IR and run by the reference executor, against eager."""

import pytest
import torch
from torch import fx

from kiln import aot
from kiln.lowering.reference import compile_reference


def lowered(fn, *inputs):
    """(result, program) of `fn` through kiln.aot and the lowering, run by reference evaluation."""
    programs = []

    def compile_graph(gm, example_inputs):
        runner = compile_reference(gm, example_inputs)
        programs.append(runner.program)
        return runner

    out = aot.compile(fx.symbolic_trace(fn), list(inputs), compile_graph)(*inputs)
    (program,) = programs
    return out, program


def check(fn, *inputs, kernels=None, externs=None):
    out, program = lowered(fn, *inputs)
    torch.testing.assert_close(out, fn(*inputs))
    if kernels is not None:
        assert len(program.kernels) == kernels, [s.buffer.name for s in program.kernels]
    if externs is not None:
        assert len(program.externs) == externs, [str(s.op) for s in program.externs]
    return program


def test_pointwise_chain_is_one_kernel():
    x, y = torch.randn(4, 5), torch.randn(5)
    check(lambda x, y: (x.sin() + y).relu() * 2 - x.exp() / 3, x, y, kernels=1, externs=0)


def test_type_promotion_and_comparisons():
    i, f = torch.arange(6).reshape(2, 3), torch.randn(2, 3)
    check(lambda i, f: (i + f, i / 2, i > f, (f >= 0).logical_and(i < 4), torch.where(f > 0, i, 0.5)), i, f, externs=0)


def test_views_copy_nothing_until_realized():
    x = torch.randn(2, 3, 4)
    fn = lambda x: (x.permute(2, 0, 1).reshape(4, 6)[1:, ::2].unsqueeze(0).expand(2, 3, 3) + x[1, 0, 1])  # noqa: E731
    check(fn, x, kernels=1, externs=0)


def test_manual_softmax_is_two_reductions_and_one_pointwise():
    x = torch.randn(3, 7)

    def softmax(x):
        e = (x - x.amax(-1, keepdim=True)).exp()
        return e / e.sum(-1, keepdim=True)

    check(softmax, x, kernels=3, externs=0)


def test_reductions_mean_and_keepdim():
    x = torch.randn(3, 4, 5)
    check(lambda x: (x.sum(), x.mean(1), x.amin((0, 2), keepdim=True), x.sum(-1, keepdim=True) * 2), x, externs=0)


def test_ops_without_lowering_are_extern_calls_and_pointwise_epilogues_fuse():
    x, w = torch.randn(4, 8), torch.randn(8, 16)
    program = check(lambda x, w: torch.nn.functional.gelu(x @ w) + 1, x, w, kernels=1, externs=1)
    assert program.externs[0].op == torch.ops.aten.mm.default


def test_strided_inputs_are_read_through_their_layout():
    base = torch.randn(6, 8)
    x = base.t()[2:5]  # non-contiguous, with a storage offset
    check(lambda x: x * 2 + 1, x, externs=0)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate):
    x = torch.randn(10)
    check(lambda x: torch.nn.functional.gelu(x, approximate=approximate), x, kernels=1, externs=0)
