"""Fusion: kernel counts and generated code text for the patterns transformers are made of,
each compared with eager."""

import torch
import torch.nn.functional as F


from tests.kiln_backend import compiled as compiled_program, private_cache  # noqa: F401  (fixture)


def compiled(fn, *inputs):
    """kiln's result, checked against eager, and its program."""
    out, program = compiled_program(fn, *inputs)
    torch.testing.assert_close(out, fn(*inputs), atol=1e-5, rtol=1e-5)
    return out, program


def kernel_functions(program) -> list[str]:
    source = program.source
    return [chunk for chunk in source.split('extern "C" void ')[1:] if chunk.startswith("kernel_")]


def softmax(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


def layer_norm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) * torch.rsqrt(var + 1e-5) * w + b


def test_softmax_is_one_kernel_with_row_statistics_in_registers():
    _, program = compiled(softmax, torch.randn(33, 129))
    (kernel,) = program.schedule.kernels
    assert len(kernel.members) == 3 and len(kernel.locals) == 2 and not program.schedule.externs
    (code,) = kernel_functions(program)
    assert "vacc = kiln::vmax(vacc" in code and "vacc = vacc +" in code
    assert code.count("auto vacc1 = ") == 2  # long rows: unrolled into independent accumulators
    assert "kiln::store(out0" in code


def test_softmax_of_gathered_scores_gathers_them_once():
    """DeBERTa-v2's scores add two gathers of relative-position products, one transposed: the
    softmax's three passes read them stored once (one more buffer in the same kernel), where a
    cheap input such as BERT's `scores / scale + mask` is computed again by each pass."""
    def gathered(s, c2p, p2c, index, mask):
        rel = torch.gather(c2p, -1, index) + torch.gather(p2c, -1, index).transpose(-1, -2)
        return F.softmax((s + rel / 8.0).masked_fill(mask, -1e9), dim=-1)

    def cheap(s, mask):
        return F.softmax(s / 8.0 + mask, dim=-1)

    s, c2p, p2c = torch.randn(6, 64, 64), torch.randn(6, 64, 160), torch.randn(6, 64, 160)
    index = torch.randint(0, 160, (64, 64)).expand(6, 64, 64)
    _, program = compiled(gathered, s, c2p, p2c, index, torch.rand(64, 64) > 0.9)
    (kernel,) = program.schedule.kernels
    assert len(kernel.members) == 4 and len(kernel.locals) == 2, program.report()
    (code,) = kernel_functions(program)
    assert code.count("kiln::lanes<float>") == 2  # each gather once, in the pass that stores the scores
    _, program = compiled(cheap, s, torch.randn(64))
    (kernel,) = program.schedule.kernels
    assert len(kernel.members) == 3 and len(kernel.locals) == 2, program.report()


def test_layer_norm_statistics_and_normalization_are_one_kernel():
    x, w, b = torch.randn(8, 100), torch.randn(100), torch.randn(100)
    _, program = compiled(layer_norm, x, w, b)
    (kernel,) = program.schedule.kernels
    assert len(kernel.locals) == 2, program.report()


def test_residual_add_then_layer_norm_is_one_kernel():
    def residual_norm(x, r, w, b):
        h = x + r
        return h, layer_norm(h, w, b)

    _, program = compiled(residual_norm, torch.randn(16, 64), torch.randn(16, 64), torch.randn(64), torch.randn(64))
    (kernel,) = program.schedule.kernels
    assert {m.name for m in kernel.members} - kernel.locals  # h and the normalized rows are stored
    assert len(kernel.outputs) == 2, program.report()


def test_gelu_after_a_matmul_is_one_kernel_reading_the_matmul_output_once():
    def mlp(x, w, b):
        return F.gelu(x @ w + b)

    _, program = compiled(mlp, torch.randn(8, 16), torch.randn(16, 32), torch.randn(32))
    assert len(program.schedule.externs) == 1 and len(program.schedule.kernels) == 1
    (code,) = kernel_functions(program)
    assert code.count("kiln::load<float>(in0") == 1


def test_reduction_with_epilogue_is_one_kernel():
    def norm_scale(x):
        return x / x.abs().sum(-1, keepdim=True).clamp_min(1e-6) if hasattr(x, "clamp_min") else x

    def l1_normalize(x):
        return x / (x.abs().sum(-1, keepdim=True) + 1.0)

    _, program = compiled(l1_normalize, torch.randn(10, 37))
    (kernel,) = program.schedule.kernels
    assert [m.is_reduction for m in kernel.members] == [True, False]


def test_siblings_over_the_same_range_share_one_loop():
    _, program = compiled(lambda x: (x.sin(), x.cos() * 2), torch.randn(4, 64))
    (kernel,) = program.schedule.kernels
    assert len(kernel.members) == 2 and kernel.vectorizes_outer


def test_a_zero_dim_kernel_keeps_a_shared_value_in_one_register():
    # atan2's backward: 1 / (a² + b²), shared by both gradients, is computed once into a local.
    def fn(a, b):
        shared = torch.where(a * a + b * b == 0, 0.0, (a * a + b * b).reciprocal()).exp().sin()
        return a * shared, -b * shared

    _, program = compiled(fn, torch.tensor(0.3), torch.tensor(-1.2))
    (kernel,) = program.schedule.kernels
    assert kernel.locals and len(kernel.members) == 3


def test_pointwise_and_reductions_are_vectorized():
    _, program = compiled(lambda x: (x * 2 + 1, x.sum(-1)), torch.randn(8, 64))
    assert all(program.vectorized.values()) and program.vectorized


def test_a_transposed_read_is_not_fused_into_the_reduction_that_produces_it():
    def stats_then_transpose(x):
        m = x.amax(-1, keepdim=True)
        return (x - m).t().contiguous() * 2

    _, program = compiled(stats_then_transpose, torch.randn(6, 10))
    assert len(program.schedule.kernels) >= 1


def test_reduction_over_rows_accumulates_vectors_along_the_contiguous_dim():
    x = torch.randn(50, 40)
    _, program = compiled(lambda x: (x.sum(0), x.amax(0) * 2), x)
    (kernel,) = program.schedule.kernels
    (code,) = kernel_functions(program)
    # The row loop is vectorized: each accumulator lane reads its own column, contiguously.
    assert "kiln::load<float>(in0 + (i0 + (40L * r0)))" in code and "i0 += kiln::L" in code


def test_batch_norm_vectorizes_along_the_activations_not_the_per_channel_parameters():
    # Four per-channel loads walk C contiguously, the activation's load and store walk W: the
    # loop order weighs accesses by how much memory they cover, so W is the vector loop, merged
    # with H (each plane is contiguous) into one loop of 8*64.
    def bn_relu(x, mean, var, w, b):
        return torch.relu((x - mean[:, None, None]) * torch.rsqrt(var[:, None, None] + 1e-5) * w[:, None, None]
                          + b[:, None, None])

    c = 32
    _, program = compiled(bn_relu, torch.randn(2, c, 8, 64), torch.randn(c), torch.rand(c) + 0.5, torch.randn(c),
                          torch.randn(c))
    (kernel,) = program.schedule.kernels
    assert [int(s) for s in kernel.outer] == [2, 32, 512] and kernel.vectorizes_outer


def test_siblings_that_both_index_indirectly_share_one_loop():
    w1, w2, idx = torch.randn(10, 32), torch.randn(10, 32), torch.tensor([3, 0, 9, 3, -1])
    _, program = compiled(lambda w1, w2, idx: (w1[idx] * 2, w2[idx] + 1), w1, w2, idx)
    (kernel,) = program.schedule.kernels
    source = kernel_functions(program)[0]
    # Each row's index is one for all lanes: the rows load as vectors, not lane by lane.
    assert len(kernel.members) == 2 and "kiln::vindex" not in source and "kiln::lanes" not in source, source


def test_reductions_over_several_dims_with_long_rows_count_every_row_once():
    x = torch.randn(3, 5, 70)  # rows of 70: the unrolled loop runs inside the loop over dim 1
    compiled(lambda x: (x.sum((1, 2)), x.amax((1, 2)), x.var((1, 2))), x)


def test_small_contiguous_planes_merge_into_one_vector_loop():
    # 7x7 planes: a loop over 7 columns has no full vector at 8 lanes; the plane is one loop of 49.
    x, w = torch.randn(2, 16, 7, 7), torch.randn(16)
    out, program = compiled(lambda x, w: (torch.relu(x * w[:, None, None]), x.sum(dim=(2, 3))), x, w)
    torch.testing.assert_close(out[0], torch.relu(x * w[:, None, None]))
    torch.testing.assert_close(out[1], x.sum(dim=(2, 3)))
    source = kernel_functions(program)[0]
    assert "49L - 49L % kiln::L" in source and "7L" not in source, source
    # A row vector broadcast over the planes' rows reads by column alone: its loops stay apart.
    out, program = compiled(lambda x, v: x + v, x, torch.randn(7))
    assert "49L" not in kernel_functions(program)[0]


def test_cat_along_the_vector_loop_loads_runs_not_lanes():
    # rotate_half: each 8-lane vector lies inside one half (a run, or one clamped element
    # repeated); at sizes 5 + 11 some vectors straddle the seam and gather, still correctly.
    def rotate_half(x):
        return torch.cat([-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]], dim=-1) * 2

    for x in (torch.randn(3, 4, 64), torch.randn(2, 16)):
        out, program = compiled(rotate_half, x)
        torch.testing.assert_close(out, rotate_half(x))
        assert "== kiln::L - 1 ? kiln::load<float>" in kernel_functions(program)[0]
    x = torch.randn(4, 16)
    out, _ = compiled(lambda a, b: torch.cat([a, b], dim=-1) + 1, x[:, :5], x[:, 5:])
    torch.testing.assert_close(out, x + 1)
