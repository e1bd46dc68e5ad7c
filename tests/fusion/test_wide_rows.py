"""Products whose N columns do not fill whole 16-byte lines are computed N' wide for Triton graphs
(the `wide_rows` pass: cuBLAS's aligned kernels instead of its one-element ones, which an H200 ran
for GPT-2's language-model head in 845 µs of its 1.65 ms call). Checked on the CPU: the pass on ATen
graphs for a GPU target (a frozen weight padded once, in the constants graph; one taken as an input
padded at each call where the product is tall enough), and end to end through Triton's
interpreter, where the returned product keeps its wider rows (no copy to eager's layout)."""

import pytest
import torch

import kiln
from kiln.passes import constants, wide_rows
from tests.kiln_backend import compiled, private_cache, rewritten_until  # noqa: F401  (fixture)

aten = torch.ops.aten


class Head(torch.nn.Module):
    """A language-model head: a norm, then a product over a vocabulary of `n`."""

    def __init__(self, n: int, dtype=torch.float32) -> None:
        super().__init__()
        self.norm, self.head = torch.nn.LayerNorm(32), torch.nn.Linear(32, n, bias=False)
        self.to(dtype)

    def forward(self, x):
        return self.head(self.norm(x))


def rewritten(model, x, codegen="triton"):
    """The ATen graph after the passes up to wide_rows, for a GPU's Triton or the CPU's C++."""
    return rewritten_until("wide_rows", model, x, codegen)


def calls(gm, op):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is op]


@pytest.mark.parametrize("n, dtype, row_stride", [(301, torch.float32, 304), (260, torch.bfloat16, 264),
                                                  (1001, torch.float16, 1008)])
def test_a_product_of_ragged_columns_is_computed_over_whole_lines(n, dtype, row_stride):
    torch.manual_seed(0)
    model, x = Head(n, dtype).eval(), torch.randn(2, 5, 32, dtype=dtype)
    gm, out = rewritten(model, x)
    (mm,) = calls(gm, aten.mm.default)
    assert mm.meta["val"].shape == (10, row_stride)
    weight = mm.args[1]  # the Linear's transposed weight, padded as the N x K matrix it is
    assert weight.meta["val"].shape == (32, row_stride) and weight.meta["val"].stride() == (1, 32)
    assert weight in constants.constant_nodes(gm)  # frozen: padded once, not at every call
    (narrow,) = calls(gm, aten.slice.Tensor)
    assert narrow.args == (mm, 1, 0, n) and narrow.meta["val"].stride() == (row_stride, 1)
    returned = next(n for n in gm.graph.nodes if n.op == "output").args[0][0]
    assert returned.meta["val"].stride() == (5 * row_stride, row_stride, 1)  # the logits keep the wider rows
    assert out.stride() == (5 * row_stride, row_stride, 1)
    tol = {torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 1e-3}[dtype]  # (the wider product blocked anew)
    torch.testing.assert_close(out, model(x), rtol=tol, atol=tol)


@pytest.mark.parametrize("n, codegen", [(304, "triton"), (255, "triton"), (301, "cpp")])
def test_aligned_narrow_and_cpu_products_are_left_alone(n, codegen):
    gm, _ = rewritten(Head(n).eval(), torch.randn(2, 5, 32), codegen)
    assert not calls(gm, aten.constant_pad_nd.default) and len(calls(gm, aten.mm.default)) == 1


@pytest.mark.parametrize("rows", [wide_rows.MIN_ROWS_PADDED_PER_CALL - 1, wide_rows.MIN_ROWS_PADDED_PER_CALL])
def test_a_weight_not_frozen_is_padded_at_each_call_only_for_tall_products(rows):
    """Not frozen (freezing off, or training), the weight's padding is a copy of it at every call:
    worth it where the product has `MIN_ROWS_PADDED_PER_CALL` rows or more."""
    torch.manual_seed(0)
    model, x = Head(301).eval(), torch.randn(rows, 32)
    gm, out = rewritten_until("wide_rows", model, x, "triton", {"backend.freezing": False})
    padded = calls(gm, aten.constant_pad_nd.default)
    assert len(padded) == (rows >= wide_rows.MIN_ROWS_PADDED_PER_CALL)
    assert not constants.has_frozen_inputs(gm)  # (so padded at every call)
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
    assert out.stride() == ((304, 1) if padded else (301, 1))


def test_a_triton_graph_returns_the_wide_product_without_a_copy():
    torch.manual_seed(0)
    model, x = Head(301).eval(), torch.randn(2, 5, 32)
    with kiln.config.patch({"backend.codegen": "triton"}):
        out, program = compiled(model, x, freezing=True)  # (the weight padded once, by the constants graph)
    graph = program.runtime
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
    assert out.stride() == (5 * 304, 304, 1)
    assert list(graph.artifact.ops.values()).count("aten::mm") == 1
    assert "as_strided" in graph.artifact.python  # the returned logits: a view of the product, not a copy
