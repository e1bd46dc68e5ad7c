"""cat, constant_pad_nd, split and slice/select scatter as kernels over clamped loads."""

import sympy
import torch
import torch.nn.functional as F

from kiln.ir.analysis import OpCounter, ReadsWrites, run
from tests.lowering.support import check, through, through_all

aten = torch.ops.aten


def test_cat_of_mixed_dtypes_views_and_legacy_empty_tensors():
    a, b, c = torch.randn(2, 3), torch.arange(8).reshape(2, 4), torch.randn(3, 2).t()
    fn = lambda a, b, c, e: (torch.cat([a, b, c], 1), torch.cat([a, e, a * 2], 0), torch.cat([b[:, :1], b], -1),  # noqa: E731
                             torch.cat([a[:, :0], a], 1))
    programs = check(fn, a, b, c, torch.empty(0), lowered=[aten.cat.default])
    assert not programs["cpp"].externs


def test_cat_loads_stay_in_bounds():
    # Both sides of each `where` are computed: every load index is clamped into its own input.
    _, program = through("reference", lambda a, b: torch.cat([a, b], 0), torch.randn(3, 4), torch.randn(5, 4))
    (step,) = program.kernels
    reads = run(ReadsWrites(), step.node).reads
    assert len(reads) == 2 and all(expr.has(sympy.Min) or expr.has(sympy.Max) for _, expr in reads)


def test_a_costly_part_of_a_cat_is_computed_once_not_for_every_row():
    # A dynamic KV cache's append, cat([cache, rope(new_key)]): every element of a cat computes
    # every part (the `where` keeps one), so a new row of many ops is a kernel of its own, run
    # once; a part that is a plain load or a few ops stays inlined. (tests/backend's
    # test_symbolic_sizes has the rotary case over a symbolic cache length.)
    def polynomial(n):
        p = n
        for _ in range(5):
            p = p * n + 1
        return p

    cache, new = torch.randn(1, 12, 200, 64), torch.rand(1, 12, 1, 64)
    programs = check(lambda c, n: torch.cat([c, polynomial(n)], 2), cache, new)
    for program in programs.values():
        counts = {tuple(step.buffer.layout.size): run(OpCounter(), step.node).counts for step in program.kernels}
        assert set(counts) == {(1, 12, 1, 64), (1, 12, 201, 64)}
        assert counts[(1, 12, 1, 64)]["mul"] == 5 and "mul" not in counts[(1, 12, 201, 64)]
    (step,) = check(lambda c, n: torch.cat([c, n * 2], 2), cache, new)["cpp"].kernels  # cheap: inlined


def test_constant_pad_nd_pads_and_crops():
    x = torch.randn(2, 3, 4)
    fn = lambda x, i: (F.pad(x, (1, 2)), F.pad(x, (2, -1, -1, 3), value=-7.5), F.pad(x, (0, 0, 0, 0, 1, 1)),  # noqa: E731
                       F.pad(i, (3, 3), value=9), F.pad(x.transpose(0, 2), (-1, -1)))
    programs = check(fn, x, torch.arange(5), lowered=[aten.constant_pad_nd.default])
    assert not programs["cpp"].externs


def test_split_pieces_are_views():
    x = torch.randn(10, 6)

    def fn(x):
        sizes, equal = torch.split(x, [3, 5, 2]), torch.split(x, 4, dim=1)
        return sizes[0] * 1, sizes[1] * 1, sizes[2] * 1, equal[0] + 1, equal[1] + 1

    programs = check(fn, x, lowered=[aten.split_with_sizes.default, aten.split.Tensor])
    assert not programs["cpp"].externs


def test_slice_and_select_scatter():
    x, s, t, r = torch.randn(6, 5), torch.randn(2, 5), torch.randn(2, 6).t(), torch.randn(6)
    fn = lambda x, s, t, r: (torch.slice_scatter(x, s, 0, 1, 3), torch.slice_scatter(x, s, 0, 0, 6, 3),  # noqa: E731
                             torch.slice_scatter(x, t, 1, -3, None, 2), torch.select_scatter(x, r, 1, -1),
                             torch.slice_scatter(x, torch.ones(6, 5, dtype=torch.int64), 0))
    check(fn, x, s, t, r, lowered=[aten.slice_scatter.default, aten.select_scatter.default])


def test_backward_of_slices_and_cat_is_kernels():
    x = torch.randn(4, 6, requires_grad=True)
    fn = lambda x: torch.cat([x[:, 3:], x[:, :3]], 1).sin()  # noqa: E731
    (expected,) = torch.autograd.grad(fn(x).sum(), x)
    for backend in ("reference", "cpp"):
        out, programs = through_all(backend, fn, x)
        (grad,) = torch.autograd.grad(out.sum(), x)
        torch.testing.assert_close(grad, expected)
        assert not any(step.op in (aten.cat.default, aten.slice_scatter.default) for p in programs for step in p.externs)


def test_diagonal_unfold_narrow_and_copies_are_views():
    x = torch.randn(4, 5, 6)

    def fn(x):
        return (torch.diagonal(x, 1, 0, 2), torch.diagonal(x, -2, -1, 1), torch.diagonal(x, 9), x.unfold(2, 3, 2),
                torch.narrow(x, 1, -3, 2), aten.narrow_copy(x, 2, 1, 4), aten.view_copy(x, [20, 6]),
                aten.permute_copy(x, [2, 0, 1]), aten.unbind_copy(x, 1)[3], x[0].diagonal())

    lowered = [aten.diagonal.default, aten.unfold.default, aten.narrow_copy.default, aten.view_copy.default,
               aten.permute_copy.default, aten.unbind_copy.int]
    programs = check(fn, x, lowered=lowered, exact=True)
    assert not programs["cpp"].externs


def test_empty_tensors_need_no_extern():
    fn = lambda x: (torch.empty(3, 4).fill_(2.0) + x, torch.empty_like(x).copy_(x) * 3, x.new_empty((2, 4)).zero_())  # noqa: E731
    programs = check(fn, torch.randn(3, 4), lowered=[aten.empty.memory_format, aten.empty_permuted.default])
    assert not programs["cpp"].externs


def test_squeezing_a_zero_dim_tensor_keeps_it():
    fn = lambda s: (aten.squeeze.dim(s * 2, 0), aten.squeeze.dims(s + 1, [-1]))  # noqa: E731
    programs = check(fn, torch.tensor(1.5), lowered=[aten.squeeze.dim, aten.squeeze.dims])
    assert not programs["cpp"].externs


def test_slices_with_negative_bounds_past_the_start():
    # Found by the graph fuzzer: x[:, -1::3] of a size-0 dim read element -1 (a crash); a negative
    # bound beyond the length starts at 0, as in eager.
    fn = lambda x, e: (x[:, -1::3], x[-9:2], x[:, -7:-5], e[:, -1::3], torch.slice_scatter(x, x[-9:], 0, -9))  # noqa: E731
    check(fn, torch.randn(4, 5), torch.zeros(6, 0, dtype=torch.int64), lowered=[aten.slice_scatter.default])


def test_a_view_of_a_column_slice_reaches_an_extern_uncopied():
    # An attention's heads from one wide projection (GPT-2's split of c_attn): the row's 32
    # columns split into 4 heads of 8 keep the row stride, so bmm reads them where they lie.
    # A view that merges rows of the slice has no strided form: that one is copied.
    a, w, x = torch.randn(16, 24), torch.randn(24, 96), torch.randn(1, 4, 8, 5)

    def fn(a, w, x):
        heads = (a @ w)[:, 32:64].view(1, 16, 4, 8).permute(0, 2, 1, 3)
        return torch.matmul(heads, x)

    out, program = through("cpp", fn, a, w, x)
    torch.testing.assert_close(out, fn(a, w, x))
    assert not program.kernels  # no copy: the slice, views and permute are an as_strided

    def merged(a, w):
        return torch.mm((a @ w)[:, 32:64].reshape(64, 8), w[:8])

    out, program = through("cpp", merged, a, w)
    torch.testing.assert_close(out, merged(a, w))
    assert len(program.kernels) == 1  # the copy that makes the slice's rows one run


def test_view_strides_agree_with_aten_s_views():
    import random

    from kiln.lowering.views import view_strides

    rng = random.Random(0)
    for _ in range(500):
        base = torch.empty([rng.choice([1, 2, 3, 4, 6]) for _ in range(rng.randint(1, 4))])
        order = list(range(base.dim()))
        rng.shuffle(order)
        x = base.permute(order)
        if rng.random() < 0.5 and x.shape[0] > 1:
            x = x.narrow(0, 1, x.shape[0] - 1)
        shape, left = [], x.numel()
        for factor in (2, 3, 2, 3):
            if left % factor == 0 and rng.random() < 0.6:
                shape.append(factor)
                left //= factor
        shape.append(left)
        rng.shuffle(shape)
        shape.insert(rng.randint(0, len(shape)), 1)
        try:
            expected = list(x.view(shape).stride())
        except RuntimeError:
            expected = None
        got = view_strides(list(x.shape), list(x.stride()), shape)
        assert (got is None) == (expected is None), (x.shape, x.stride(), shape)
        if got is not None:  # a dimension of size 1 may have any stride
            assert all(g == e for g, e, s in zip(got, expected, shape) if s != 1), (x.shape, x.stride(), shape)
