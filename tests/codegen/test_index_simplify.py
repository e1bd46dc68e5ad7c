"""Index simplification over loop ranges: reshapes that unravel and re-flatten an index give plain
affine indices again, so the loads vectorize instead of gathering lane by lane."""

import sympy
import torch

from kiln.ir.indexing import FloorDiv, Mod
from kiln.ir.index_bounds import simplify
from tests.kiln_backend import compiled, private_cache  # noqa: F401  (fixture)

i0, i1 = sympy.symbols("i0 i1")


def test_row_of_a_flattened_index_is_the_outer_loop_divided():
    # (i1 + 384*i0) // 21504 with i1 < 384 is i0 // 56: the inner term never carries.
    assert simplify(FloorDiv(i1 + 384 * i0, 21504), {i0: 3136, i1: 384}) == FloorDiv(i0, 56)
    assert simplify(Mod(i1 + 96 * i0, 192), {i0: 3136, i1: 96}) == i1 + 96 * Mod(i0, 2)


def test_unravel_then_flatten_is_the_identity():
    index = i1 + 384 * Mod(i0, 56) + 21504 * FloorDiv(i1 + 384 * i0, 21504)
    assert simplify(index, {i0: 3136, i1: 384}) == i1 + 384 * i0


def test_a_clamped_index_is_bounded_by_its_clamp():
    # ViT's patch tokens after the class token: column Min(195, Max(0, i0 - 1)) of a (768, 14, 14)
    # plane read through flatten(2).transpose(1, 2) is plain `196*i1 + column`.
    column = sympy.Min(195, sympy.Max(0, i0 - 1))
    flat = 196 * i1 + column
    index = (14 * Mod(FloorDiv(flat, 14), 14) + 196 * Mod(FloorDiv(flat, 196), 768)
             + 150528 * FloorDiv(flat, 150528) + Mod(column, 14))
    assert simplify(index, {i0: 197, i1: 768}) == flat
    unclamped = sympy.Max(0, i0 - 1)  # up to 196: the remainder by 14 may be needed
    assert simplify(Mod(unclamped, 196), {i0: 198}) == Mod(unclamped, 196)


def test_a_carrying_inner_term_is_kept():
    # i1 reaches 400 >= 384: the division can carry, so nothing may be dropped.
    index = FloorDiv(i1 + 384 * i0, 21504)
    assert simplify(index, {i0: 3136, i1: 400}) == index


def test_bias_and_gelu_over_a_reshaped_matmul_output_load_contiguously():
    torch.manual_seed(0)
    x, w, b = torch.randn(1, 8, 8, 16), torch.randn(16, 32), torch.randn(32)

    def fn(x, w, b):
        y = torch.mm(x.reshape(64, 16), w).view(1, 8, 8, 32)
        return torch.nn.functional.gelu(y + b).view(64, 32)

    out, program = compiled(fn, x, w, b)
    torch.testing.assert_close(out, fn(x, w, b))
    (kernel,) = [chunk for chunk in program.source.split('extern "C" void ')[1:] if chunk.startswith("kernel_")]
    assert "kiln::lanes" not in kernel and "kiln::load<float>(out0 + (i1 + (32L * i0)))" in kernel, kernel  # in place over mm


def test_a_pads_bounds_on_outer_loops_are_scalars_broadcast():
    # Channels-last pad: the lanes run over channels, the bounds test rows and columns, so every
    # lane agrees: computed once as scalars, not as int64 vectors compared per element (8x slower).
    x = torch.randn(1, 32, 12, 12).contiguous(memory_format=torch.channels_last)

    def fn(x):
        return torch.nn.functional.pad(x, (0, 1, 0, 1))

    out, program = compiled(fn, x)
    torch.testing.assert_close(out, fn(x))
    (kernel,) = [chunk for chunk in program.source.split('extern "C" void ')[1:] if chunk.startswith("kernel_")]
    vector_loop = kernel.split("i2 += kiln::L")[1].split("for (int64_t i2")[0]
    # The vector compares appear only inside decltype (unevaluated; their splats are dead code).
    assert "splat_as<" in vector_loop and "= kiln::vlt(" not in vector_loop and "= (t0_2 && t0_4)" not in vector_loop, kernel


def _windowed_blocks(x, w, side):
    # Swin's windows, plain then shifted: layer norm, roll, partition into 7x7 windows, a
    # per-window attention, merge back, roll back. Each step reshapes or permutes the last.
    for shift in (0, 3):
        y = torch.layer_norm(x, (32,)).view(1, side, side, 32)
        y = torch.roll(y, (-shift, -shift), (1, 2)) if shift else y
        n = side // 7
        windows = y.view(1, n, 7, n, 7, 32).permute(0, 1, 3, 2, 4, 5).reshape(-1, 49, 32)
        windows = torch.softmax(windows @ w, -1) @ w.t()
        y = windows.view(1, n, n, 7, 7, 32).permute(0, 1, 3, 2, 4, 5).reshape(1, side, side, 32)
        y = torch.roll(y, (shift, shift), (1, 2)) if shift else y
        x = x + y.reshape(1, side * side, 32)
    return x


def _two_stages(x, w, m):
    x = _windowed_blocks(x, w, 28)
    v = x.view(1, 28, 28, 32)  # patch merging: four strided slices side by side
    merged = torch.cat([v[:, 0::2, 0::2], v[:, 1::2, 0::2], v[:, 0::2, 1::2], v[:, 1::2, 1::2]], -1).view(1, 196, 128)
    return _windowed_blocks(torch.layer_norm(merged, (128,)) @ m, w, 14)


def test_window_partitions_simplify_each_index_once(monkeypatch):
    # Each element expression nests a dozen divisions and remainders; kiln's simplify redid every
    # nested one from each place it occurs and at each read of the expression, and sympy's Mod
    # simplified each remainder as it was built: a Swin V2 spent a minute or more in scheduling
    # and code generation (issue 22's compile-time cliff). Now each is simplified once: 810
    # simplifications of a division or remainder here, 23,280 before.
    from kiln.ir import index_bounds

    calls = []
    simplify_div_mod = index_bounds._simplify_div_mod
    monkeypatch.setattr(index_bounds, "_simplify_div_mod", lambda *a: calls.append(1) or simplify_div_mod(*a))
    index_bounds._simplified.cache_clear()
    x, w, m = torch.randn(1, 784, 32), torch.randn(32, 32), torch.randn(128, 32)
    out, _ = compiled(_two_stages, x, w, m)
    torch.testing.assert_close(out, _two_stages(x, w, m), atol=1e-4, rtol=1e-4)
    assert len(calls) < 2000
