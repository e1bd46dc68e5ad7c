"""Embedding, index_select, gather and advanced indexing as indirect loads, and their range checks."""

import pytest
import torch
import torch.nn.functional as F

from tests.lowering.support import check, through

aten = torch.ops.aten


def test_embedding_index_select_gather():
    w, ids = torch.randn(10, 4), torch.tensor([[0, 9, 3], [3, 3, 1]])
    x = torch.randn(5, 6).t()  # non-contiguous source
    fn = lambda w, ids, x, i32: (F.embedding(ids, w), torch.index_select(x, 1, ids[0] % 5),  # noqa: E731
                                 torch.index_select(x, 0, i32), torch.gather(x, 1, ids % 5), torch.gather(x, 0, ids[:, :2] % 6))
    programs = check(fn, w, ids, x, torch.tensor([5, 0, 2], dtype=torch.int32),
                     lowered=[aten.embedding.default, aten.index_select.default, aten.gather.default])
    assert not programs["cpp"].externs


def test_advanced_indexing_with_none_entries_broadcasting_and_negative_indices():
    x = torch.randn(4, 5, 6, 7)
    i, j = torch.tensor([[0, -1], [2, 3]]), torch.tensor([-2, 1])
    fn = lambda x, i, j: (x[i], x[:, i, j], x[:, :, i], x[i, :, j], x[i, 1:3, :, j], x[..., j])  # noqa: E731
    programs = check(fn, x, i, j, lowered=[aten.index.Tensor])
    assert not programs["cpp"].externs


def test_integer_source_and_bool_mask_indexing():
    x = torch.arange(24).reshape(4, 6)
    check(lambda x, i: x[i, None, -1:], x, torch.tensor([3, 0]), lowered=[aten.index.Tensor], exact=True)
    # A mask's result size depends on its values: an extern call, still correct. (The reference
    # executor does not take data-dependent sizes; the C++ backend does, see test_scatter.py.)
    out, program = through("reference", lambda x, m: x[m], x, x[:, 0] > 5)
    assert out.tolist() == x[x[:, 0] > 5].tolist() and program.externs


@pytest.mark.parametrize("fn", [
    lambda w, i: F.embedding(i, w),
    lambda w, i: torch.index_select(w, 0, i),
    lambda w, i: torch.gather(w, 0, i.view(-1, 1).expand(-1, 3)),
    lambda w, i: w[i],
], ids=["embedding", "index_select", "gather", "index"])
@pytest.mark.parametrize("bad", [7, -8], ids=["past the end", "before the start"])
def test_out_of_range_indices_raise_index_error_like_eager(fn, bad):
    w, ids = torch.randn(7, 3), torch.tensor([1, bad, 2])
    with pytest.raises((IndexError, RuntimeError)):  # eager's gather raises a RuntimeError
        fn(w, ids)
    with pytest.raises(IndexError):
        through("cpp", fn, w, ids)


@pytest.mark.parametrize("fn", [lambda w, i: F.embedding(i, w), lambda w, i: torch.gather(w, 0, i.view(-1, 1))],
                         ids=["embedding", "gather"])
def test_negative_indices_are_out_of_range_where_eager_says_so(fn):
    w, ids = torch.randn(7, 1), torch.tensor([1, -1])
    with pytest.raises((IndexError, RuntimeError)):
        fn(w, ids)
    with pytest.raises(IndexError):
        through("cpp", fn, w, ids)
