"""Attention written out in eager ops becomes one call of the CPU flash-attention kernel: scale
before or after the product, multiplied or divided, a tensor scale per head (Swin V2's), with or
without an additive mask, with eval-mode dropout; what does not match stays as it was."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.kiln_backend import compiled, private_cache  # noqa: F401  (fixture)

SDPA = "aten._scaled_dot_product_flash_attention_for_cpu.default"


class Attention(nn.Module):
    def __init__(self, form, mask=None):
        super().__init__()
        self.form, self.mask, self.drop = form, mask, nn.Dropout(0.1)

    def forward(self, q, k, v):
        d = q.shape[-1]
        if self.form == "div_after":
            s = q @ k.transpose(-2, -1) / math.sqrt(d)
        elif self.form == "mul_after":
            s = torch.matmul(q, k.transpose(-1, -2)) * d ** -0.5
        elif self.form == "scale_q_first":
            s = (q * d ** -0.5) @ k.transpose(-2, -1)
        elif self.form == "head_scale":  # Swin V2: cosine attention times a learned scale per head
            s = (q @ k.transpose(-2, -1)) * torch.arange(1.0, q.shape[1] + 1).view(-1, 1, 1)
        else:
            s = q @ k.transpose(-2, -1)
        if self.mask is not None:
            s = s + self.mask
        p = self.drop(F.softmax(s, dim=-1))
        return p @ v


def _qkv(b=2, h=3, l=7, s=7, d=8):
    torch.manual_seed(0)
    return torch.randn(b, h, l, d), torch.randn(b, h, s, d), torch.randn(b, h, s, d)


def _externs(program):
    return [str(e.op) for e in program.schedule.externs]


@pytest.mark.parametrize("form", ["div_after", "mul_after", "scale_q_first", "head_scale", "unscaled"])
@pytest.mark.parametrize("masked", [False, True])
def test_eager_attention_becomes_one_flash_call(form, masked):
    q, k, v = _qkv()
    mask = torch.randn(2, 1, 7, 7) if masked else None
    model = Attention(form, mask).eval()
    out, program = compiled(model, q, k, v)
    with torch.no_grad():
        torch.testing.assert_close(out, model(q, k, v), rtol=1e-4, atol=1e-5)
    externs = _externs(program)
    assert externs.count(SDPA) == 1 and "aten.bmm.default" not in externs


def test_softmax_over_another_dim_is_left_alone():
    class Other(nn.Module):
        def forward(self, q, k, v):
            return F.softmax(q @ k.transpose(-2, -1), dim=-2) @ v

    q, k, v = _qkv()
    out, program = compiled(Other(), q, k, v)
    torch.testing.assert_close(out, Other()(q, k, v))
    assert SDPA not in _externs(program)


def test_a_scale_that_varies_along_the_keys_is_left_alone():
    class PerKey(nn.Module):
        def forward(self, q, k, v):
            return F.softmax((q @ k.transpose(-2, -1)) * torch.arange(1.0, k.shape[2] + 1), dim=-1) @ v

    q, k, v = _qkv()
    out, program = compiled(PerKey(), q, k, v)
    torch.testing.assert_close(out, PerKey()(q, k, v))
    assert SDPA not in _externs(program)


def test_probabilities_used_twice_are_left_alone():
    class Returned(nn.Module):
        def forward(self, q, k, v):
            p = F.softmax(q @ k.transpose(-2, -1), dim=-1)
            return p @ v, p

    q, k, v = _qkv()
    out, program = compiled(Returned(), q, k, v)
    torch.testing.assert_close(out, Returned()(q, k, v))
    assert SDPA not in _externs(program)


def test_attention_over_permuted_head_views_becomes_one_flash_call():
    # MobileViT's form: q, k, v are heads split from projections and permuted, so core ATen copies
    # them contiguous before each bmm (`view(clone(expand(x)))`); the copies go with the match.
    class Heads(nn.Module):
        def __init__(self, dim=24, heads=4):
            super().__init__()
            self.heads, self.q, self.k, self.v = heads, nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

        def split(self, x):
            b, n, _ = x.shape
            return x.view(b, n, self.heads, -1).permute(0, 2, 1, 3)

        def forward(self, x):
            q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
            p = F.softmax(torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1]), dim=-1)
            return torch.matmul(p, v).permute(0, 2, 1, 3).reshape(x.shape)

    torch.manual_seed(0)
    model, x = Heads().eval(), torch.randn(2, 16, 24)
    out, program = compiled(model, x)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    externs = _externs(program)
    assert externs.count(SDPA) == 1 and "aten.bmm.default" not in externs


class ShiftedWindows(nn.Module):
    """Swin V2's shifted-window attention: cosine scores times a scale per head, a position bias
    per head, and the windows' mask added in five dimensions between two views."""

    def __init__(self, windows=3, heads=2, n=5):
        super().__init__()
        torch.manual_seed(1)
        self.windows, self.heads, self.n = windows, heads, n
        self.scale = nn.Parameter(torch.rand(heads, 1, 1) + 0.5)
        self.bias = nn.Parameter(torch.randn(1, heads, n, n))
        mask = torch.zeros(windows, n, n)
        mask[1:, :2, 3:] = -100.0  # the shifted windows' cross-region pairs
        self.register_buffer("mask", mask)

    def forward(self, q, k, v):
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        s = (q @ k.transpose(-2, -1)) * self.scale + self.bias
        b = s.shape[0]
        s = s.view(b // self.windows, self.windows, self.heads, self.n, self.n) + self.mask.unsqueeze(1).unsqueeze(0)
        s = s.view(-1, self.heads, self.n, self.n)
        return F.softmax(s, dim=-1) @ v


@pytest.mark.parametrize("images", [1, 2], ids=["one-image", "two-images"])
def test_shifted_window_attention_becomes_one_flash_call(images):
    model = ShiftedWindows().eval()
    q, k, v = _qkv(b=3 * images, h=2, l=5, s=5, d=8)
    out, program = compiled(model, q, k, v)
    with torch.no_grad():
        torch.testing.assert_close(out, model(q, k, v), rtol=1e-4, atol=1e-5)
    externs = _externs(program)
    assert externs.count(SDPA) == 1 and "aten.bmm.default" not in externs
