"""kiln/passes/grouped_attention.py: a decode step's grouped-query attention runs over the
key/value heads as they are (the group's queries as rows), without HuggingFace's repeat_kv copies;
the same values as eager's, with ATen's kernel and with kiln's; prefill and per-head masks keep
the copies."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import kiln

from tests.kiln_backend import compiled, kiln_wherever_offered  # noqa: F401  (fixture)

FLASH = "aten._scaled_dot_product_flash_attention_for_cpu.default"
KILN = "kiln.attention.default"


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """HuggingFace's: [B, Hkv, S, D] -> [B, Hkv * n_rep, S, D], each head repeated."""
    b, heads, s, d = x.shape
    return x[:, :, None, :, :].expand(b, heads, n_rep, s, d).reshape(b, heads * n_rep, s, d)


class GroupedAttention(nn.Module):
    def __init__(self, n_rep: int):
        super().__init__()
        self.n_rep = n_rep

    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep), attn_mask=mask)


def _inputs(rows: int, heads: int = 8, kv_heads: int = 2, keys: int = 40, d: int = 16, mask_heads: int = 1):
    g = torch.Generator().manual_seed(rows + heads)
    q = torch.randn(1, rows, heads, d, generator=g).transpose(1, 2)  # as a projection's view gives it
    k, v = (torch.randn(1, kv_heads, keys, d, generator=g) for _ in range(2))
    mask = torch.arange(keys) < keys - 7  # a static cache's mask: its last positions not written yet
    return q, k, v, mask.expand(1, mask_heads, rows, keys).clone()


def _attention_calls(program):
    return [s for s in program.schedule.externs if str(s.op) in (FLASH, KILN)]


@pytest.mark.parametrize("autotune", ["off", "default"])
def test_a_decode_step_attends_over_the_key_value_heads_without_copies(autotune, kiln_wherever_offered):
    inputs = _inputs(rows=1)
    out, program = compiled(GroupedAttention(4), *inputs, autotune=autotune)
    torch.testing.assert_close(out, GroupedAttention(4)(*inputs), rtol=1e-5, atol=1e-5)
    (call,) = _attention_calls(program)
    assert str(call.op) == (KILN if autotune == "default" else FLASH)
    assert tuple(call.args[0].layout.size) == (1, 2, 4, 16)  # q: each key/value head's 4 queries as rows
    assert tuple(call.args[1].layout.size) == (1, 2, 40, 16)  # k as the cache holds it
    repeated = [b for kernel in program.schedule.kernels for b in kernel.outputs if math.prod(b.layout.size) == 2 * 4 * 40 * 16]
    assert not repeated  # no kernel writes a repeated copy of k or v


@pytest.mark.parametrize("rows,mask_heads", [(5, 1), (1, 8)], ids=["prefill", "mask-per-head"])
def test_prefill_and_a_mask_per_head_keep_the_repeated_heads(rows, mask_heads):
    inputs = _inputs(rows=rows, mask_heads=mask_heads)
    out, program = compiled(GroupedAttention(4), *inputs)
    torch.testing.assert_close(out, GroupedAttention(4)(*inputs), rtol=1e-5, atol=1e-5)
    (call,) = _attention_calls(program)
    assert tuple(call.args[1].layout.size) == (1, 8, 40, 16)


def test_without_the_pass_the_decode_step_copies_them():
    """What the pass removes is there without it (the checks above can fail)."""
    inputs = _inputs(rows=1)
    with kiln.config.patch({"backend.disabled_passes": ("grouped_attention",)}):
        out, program = compiled(GroupedAttention(4), *inputs)
    torch.testing.assert_close(out, GroupedAttention(4)(*inputs), rtol=1e-5, atol=1e-5)
    (call,) = _attention_calls(program)
    assert tuple(call.args[1].layout.size) == (1, 8, 40, 16)


class SharedHeadsAttention(nn.Module):
    """SDPA handed the unrepeated heads (`enable_gqa`, as HuggingFace calls it where no mask is passed)."""

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


@pytest.mark.parametrize("autotune", ["off", "default"])
def test_a_decode_step_handed_shared_heads_attends_with_its_queries_as_rows(autotune, kiln_wherever_offered):
    """ATen's call over heads each shared by 4 query heads (which kiln's kernel does not take) is
    viewed as the repeated heads' call is: 4 rows over each head, kiln's kernel where chosen."""
    q, k, v, _ = _inputs(rows=1)
    out, program = compiled(SharedHeadsAttention(), q, k, v, autotune=autotune)
    torch.testing.assert_close(out, SharedHeadsAttention()(q, k, v), rtol=1e-5, atol=1e-5)
    (call,) = _attention_calls(program)
    assert str(call.op) == (KILN if autotune == "default" else FLASH)
    assert tuple(call.args[0].layout.size) == (1, 2, 4, 16)
    assert tuple(call.args[1].layout.size) == (1, 2, 40, 16)
