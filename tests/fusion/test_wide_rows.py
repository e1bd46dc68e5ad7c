"""Products whose N columns do not fill whole 16-byte lines are written into wider rows for Triton
graphs (the `wide_rows` pass, kiln/externs/wide_rows.py: cuBLAS's aligned kernels instead of its
one-element ones, GPT-2's language-model head 845 -> ~120 µs on an H200). Checked on the CPU: the
pass on ATen graphs for a GPU target, and end to end through Triton's interpreter, where the
returned product keeps its wider rows (no copy to eager's layout)."""

import pytest
import torch

import kiln
from kiln.externs.wide_rows import MM_WIDE_ROWS, mm_wide_rows
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
def test_a_product_of_ragged_columns_is_written_into_rows_16_bytes_apart(n, dtype, row_stride):
    torch.manual_seed(0)
    model, x = Head(n, dtype).eval(), torch.randn(2, 5, 32, dtype=dtype)
    gm, out = rewritten(model, x)
    (wide,) = calls(gm, MM_WIDE_ROWS)
    assert not calls(gm, aten.mm.default) and wide.args[2] == row_stride
    assert wide.meta["val"].stride() == (row_stride, 1)
    returned = next(n for n in gm.graph.nodes if n.op == "output").args[0][0]
    assert returned.meta["val"].stride() == (5 * row_stride, row_stride, 1)  # the logits keep the wider rows
    assert out.stride() == (5 * row_stride, row_stride, 1)
    torch.testing.assert_close(out, model(x), rtol=0, atol=0)  # the same ATen product, only its rows wider


@pytest.mark.parametrize("n, codegen", [(304, "triton"), (255, "triton"), (301, "cpp")])
def test_aligned_narrow_and_cpu_products_are_left_alone(n, codegen):
    gm, _ = rewritten(Head(n).eval(), torch.randn(2, 5, 32), codegen)
    assert not calls(gm, MM_WIDE_ROWS) and len(calls(gm, aten.mm.default)) == 1


def test_the_operator_and_its_fake_value_agree():
    a, b = torch.randn(7, 32), torch.randn(32, 301)
    out = mm_wide_rows(a, b, 304)
    assert out.shape == (7, 301) and out.stride() == (304, 1)
    torch.testing.assert_close(out, a @ b)
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fake = MM_WIDE_ROWS(torch.empty(7, 32), torch.empty(32, 301), 304)
    assert fake.shape == out.shape and fake.stride() == out.stride()


def test_a_triton_graph_returns_the_wide_product_without_a_copy():
    torch.manual_seed(0)
    model, x = Head(301).eval(), torch.randn(2, 5, 32)
    with kiln.config.patch({"backend.codegen": "triton"}):
        out, graph = compiled(model, x)
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
    assert out.stride() == (5 * 304, 304, 1)
    assert "kiln::mm_wide_rows" in graph.artifact.ops.values()
    assert "as_strided" in graph.artifact.python  # the returned logits: a view of the product, not a copy
