"""Values read several times are realized once their bodies are costly: lowering stays linear in
the graph's size (inlining doubled per level here) and the kernel still fuses them."""

import time

import torch


from tests.kiln_backend import compiled, private_cache  # noqa: F401  (fixture)


def doubling_chain(x):
    for _ in range(24):  # inlined, each level would evaluate the previous one twice: 2**24 loads
        x = (x * x).sin() + x.cos()
    return x


def test_a_value_read_twice_per_level_is_realized_and_lowering_stays_linear():
    x = torch.randn(4, 16) * 0.1
    start = time.perf_counter()
    out, program = compiled(doubling_chain, x)
    assert time.perf_counter() - start < 60  # includes the C++ compile; inlined, it would never end
    torch.testing.assert_close(out, doubling_chain(x), rtol=1e-4, atol=1e-5)
    assert len(program.program.kernels) > 10  # realized along the chain
    assert len(program.schedule.kernels) == 1  # ... and fused back into one loop


def test_a_cheap_value_read_twice_is_recomputed_not_stored():
    fn = lambda x: (x + 1) * (x + 1) - (x + 1)  # noqa: E731
    _, program = compiled(fn, torch.randn(4, 16))
    assert len(program.program.kernels) == 1


def test_a_gathered_value_read_twice_is_realized_once():
    # ViT's embeddings: patches read across a convolution's channels-first planes, a class token
    # in front; every reader of the sum would gather it lane by lane unless it is stored once.
    def embed(planes, cls, pos):
        tokens = torch.cat([cls, planes.flatten(2).transpose(1, 2)], dim=1) + pos
        return torch.nn.functional.layer_norm(tokens, (64,)), tokens * 2

    planes, cls, pos = torch.randn(1, 64, 4, 4), torch.randn(1, 1, 64), torch.randn(1, 17, 64)
    out, program = compiled(embed, planes, cls, pos)
    for got, want in zip(out, embed(planes, cls, pos)):
        torch.testing.assert_close(got, want)
    assert len(program.program.kernels) >= 2  # the tokens are a buffer of their own
    assert program.source.count("kiln::lanes") <= 1, program.source  # gathered by one loop only


def test_costly_math_broadcast_over_an_outer_dim_is_realized():
    # Llama's rotary tables: cos and sin of (positions, 64) read by every head. Inlined, each
    # head would compute them again; stored, they are computed once.
    def rotary(q, angles):
        return q * angles.cos()[None] + q * angles.sin()[None]

    q, angles = torch.randn(8, 128, 64), torch.randn(128, 64)
    out, program = compiled(rotary, q, angles)
    torch.testing.assert_close(out, rotary(q, angles))
    assert len(program.program.kernels) == 3, program.report()  # cos, sin, and the product
    # A per-channel scale broadcast over the inner dims only: the compiler hoists it, no buffer.
    out, program = compiled(lambda x, v: x * torch.rsqrt(v)[:, None], torch.randn(64, 256), torch.rand(64) + 1)
    assert len(program.program.kernels) == 1


def test_a_value_two_externs_read_is_computed_once():
    # HF's decoders: one attention mask (a cheap `where` over positions) read by every layer's
    # attention, an extern each; each used to get its own copy, computed again per layer.
    def two_sorts(x):
        shifted = x * 2 + 1  # cheap: a pointwise consumer would recompute it inline
        return torch.sort(shifted, dim=0).values + torch.sort(shifted, dim=1).values

    x = torch.randn(8, 16)
    out, program = compiled(two_sorts, x)
    torch.testing.assert_close(out, two_sorts(x))
    externs = [step for step in program.program.steps if type(step).__name__ == "ExternStep" and "sort" in str(step.op)]
    assert len(externs) == 2, program.report()
    assert externs[0].args[0] is externs[1].args[0]  # one buffer, computed once, read by both
    assert len(program.program.kernels) == 2, program.report()  # `shifted`, and the sum of the two sorts


def test_only_externs_that_write_none_of_their_arguments_share_them():
    # An op that writes an argument gets a buffer of its own: another reader must not see the write.
    from kiln.lowering.graph import _writes_arguments

    assert _writes_arguments(torch.ops.aten.index_put_.default)
    assert _writes_arguments(torch.ops.aten.add_.Tensor)
    assert not _writes_arguments(torch.ops.aten.sort.default)
    assert not _writes_arguments(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)
    assert _writes_arguments(lambda x: x)  # no schema: assumed to write

    def written(x, i, v):  # (functionalized: the write becomes index_put's copy)
        base = x * 2
        return torch.ops.aten.index_put_(base.clone(), (i,), v) + torch.sort(base, dim=0).values

    x, i, v = torch.randn(8, 4), torch.tensor([1, 3]), torch.randn(2, 4)
    out, _ = compiled(written, x, i, v)
    torch.testing.assert_close(out, written(x, i, v))
