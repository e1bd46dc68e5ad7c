"""Training-mode dropout computed in kernels (passes/dropout.py, lowering/random.py): a counter-based
generator (Philox4x32-10, kiln/ir/philox.py) gives the same numbers in C++, in Triton and in the
eager fallback, bit for bit; the mask fuses with its neighbours and the backward reads the
forward's mask; torch.manual_seed decides the masks."""

import pytest
import torch

import kiln
from kiln.backend import watch
from kiln.ir.philox import philox_uniform
from kiln.runtime import fallback
from kiln.runtime.compiled_graph import CompiledGraph
from tests.kiln_backend import compiled, private_cache  # noqa: F401  (fixture)

import kiln.externs.dropout  # noqa: F401,E402  (kiln::philox_dropout)

CODEGENS = ["cpp", "triton"]


def test_philox_matches_the_published_known_answer():
    # Random123's known-answer test for philox4x32_10: counter 0, key 0 -> first word 0x6627e8d5.
    assert philox_uniform(torch.tensor(0), torch.tensor(0)).item() == (0x6627E8D5 >> 8) / (1 << 24)
    numbers = philox_uniform(torch.tensor(7), torch.arange(200000))
    assert 0 <= numbers.min() and numbers.max() < 1 and abs(numbers.mean().item() - 0.5) < 0.005


@pytest.mark.parametrize("codegen", CODEGENS)
def test_kernels_draw_the_eager_implementations_numbers_bit_for_bit(codegen):
    x = torch.randn(3, 1000)
    seed = torch.tensor(123456789012345, dtype=torch.int64)
    fn = lambda x, seed: torch.ops.kiln.philox_dropout(x, seed, 0.25)  # noqa: E731
    with kiln.config.patch({"backend.codegen": codegen}):
        (out, mask), graph = compiled(fn, x, seed)
    want_out, want_mask = fn(x, seed)
    assert graph.schedule.kernels and not [s for s in graph.schedule.steps if hasattr(s, "op")]  # all in loops
    assert torch.equal(mask, want_mask)
    torch.testing.assert_close(out, want_out, rtol=0, atol=0)
    assert abs(mask.float().mean().item() - 0.75) < 0.02
    if codegen == "triton":
        from tests.codegen.test_triton import assert_builds_for_h100

        assert_builds_for_h100(graph)


def _train_step(codegen, seed=0):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Dropout(0.3)).train()
    x = torch.randn(32, 64, requires_grad=True)
    torch.manual_seed(seed)
    with kiln.config.patch({"backend.codegen": codegen}), watch() as built:
        y = kiln.compile(model)(x)
        y.square().sum().backward()
    return model, x, y, built


@pytest.mark.parametrize("codegen", CODEGENS)
def test_training_dropout_fuses_and_the_backward_reads_the_same_mask(codegen):
    fallback.reset()
    model, x, y, built = _train_step(codegen)
    assert fallback.FALLBACKS == []
    keep = y.detach() != 0
    assert abs(keep.float().mean().item() - 0.7) < 0.05
    # Eager with this mask: the same output, and the same gradients.
    twin = torch.nn.Linear(64, 64)
    twin.load_state_dict(model[0].state_dict())
    x2 = x.detach().clone().requires_grad_()
    want = torch.where(keep, twin(x2) / 0.7, 0.0)
    want.square().sum().backward()
    torch.testing.assert_close(y.detach(), want.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x.grad, x2.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(model[0].weight.grad, twin.weight.grad, atol=1e-4, rtol=1e-4)
    forward = [b for b in built if isinstance(b, CompiledGraph)][0]
    assert len(forward.schedule.kernels) == 1  # the bias add, the mask and the scaled output: one kernel


def test_manual_seed_decides_the_masks():
    first = _train_step("cpp", seed=1)[2].detach()
    again = _train_step("cpp", seed=1)[2].detach()
    other = _train_step("cpp", seed=2)[2].detach()
    assert torch.equal(first, again) and not torch.equal(first != 0, other != 0)


@pytest.mark.parametrize("codegen", CODEGENS)
def test_the_same_layer_with_dropout_twice_is_one_kernel_function(codegen):
    # Each dropout's seed is a tensor of its own, an argument of its kernel: the two layers'
    # kernels print one text, compiled once (a seed read at a constant offset into one tensor of
    # every seed made each layer's kernel its own: a BERT's training forward had 72 C++ functions
    # for its 138 kernels instead of 16).
    def fn(x, m, r0, r1):
        h = x
        for residual in (r0, r1):
            h = torch.nn.functional.dropout(h @ m + residual, 0.3)
        return h

    fallback.reset()
    inputs = [torch.randn(16, 16) for _ in range(4)]
    with kiln.config.patch({"backend.codegen": codegen, "backend.triton_gemm": "never"}), watch() as built:
        kiln.compile(fn)(*inputs)
    assert fallback.FALLBACKS == []
    (graph,) = [b for b in built if isinstance(b, CompiledGraph)]
    layers = graph.schedule.kernels  # (the products are library calls)
    assert len(layers) == 2 and len({graph.stages.kernels.functions[k.name] for k in layers}) == 1
