"""`kiln.quantize`: weight-only int8/int4 Linear layers, their eager reference, their state_dict,
and the compiled model running kiln's quantized GEMM (kiln/passes/quantized_gemm.py) with its
post-op and residual inside, the same values as eager's quantized model and the same tokens from
`generate()`."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

import kiln
from kiln.quant import QuantizedLinear
from kiln.runtime import fallback
from tests.fusion.test_freezing import _externs
from tests.kiln_backend import compiled, private_cache  # noqa: F401  (fixture)
from tests.llm.test_generate import _decoder


class Block(nn.Module):
    """A Llama MLP and its residual: down(silu(gate(x)) * up(x)) + x, and a biased projection."""

    def __init__(self, d=96, hidden=200):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False), nn.Linear(hidden, d)
        self.proj = nn.Linear(d, 40)

    def forward(self, x):
        h = self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x)) + x
        return self.proj(h)


@pytest.mark.parametrize("dtype,group", [("int8", None), ("int4", 32), ("int4", 128)])
def test_every_linear_is_quantized_within_half_a_step(dtype, group):
    torch.manual_seed(0)
    model = Block().eval()
    reference = copy.deepcopy(model)
    assert kiln.quantize(model, dtype, group_size=group) is model
    layers = {name: m for name, m in model.named_modules() if isinstance(m, QuantizedLinear)}
    assert sorted(layers) == ["down", "gate", "proj", "up"]
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    for name, layer in layers.items():
        w = getattr(reference, name).weight
        step = layer.scales if dtype == "int8" else layer.scales.repeat_interleave(group, 1)[:, :w.shape[1]]
        err = (layer.dequantized_weight() - w).abs()
        assert (err <= step / 2 + 1e-6).all()
        assert err.max() > 0  # it is quantized, not copied
    x = torch.randn(3, 96)
    with torch.no_grad():
        rel = (model(x) - reference(x)).abs().max() / reference(x).abs().max()
    assert rel < (0.02 if dtype == "int8" else 0.2)


def test_the_quantized_state_dict_saves_and_loads(tmp_path):
    torch.manual_seed(0)
    model = kiln.quantize(Block().eval(), "int4", group_size=32)
    torch.save(model.state_dict(), tmp_path / "q.pt")
    other = kiln.quantize(Block().eval(), "int4", group_size=32)  # other random weights
    x = torch.randn(2, 96)
    with torch.no_grad():
        assert not torch.equal(other(x), model(x))
        other.load_state_dict(torch.load(tmp_path / "q.pt"))
        assert torch.equal(other(x), model(x))
    assert {"gate.qweight", "gate.scales", "gate.zeros", "down.bias"} <= set(model.state_dict())


def _quantized_gemms(module: nn.Module, rows: int, dtype: str, group: int | None, activations: str = "float32"):
    """The compiled quantized `module`'s kiln::mm_quant calls and its program, its output checked
    against eager's quantized model."""
    torch.manual_seed(0)
    model = kiln.quantize(module.eval(), dtype, group_size=group, activations=activations)
    x = torch.randn(rows, 96)
    out, program = compiled(model, x, freezing=True)
    # int4 at 4 rows or fewer may carry the activations as two int8 digits (where the CPU's int4
    # path is int8_digits): each within 2^-13.9 of its group's largest, ~3e-5 on these outputs
    # (~0.3), far under the int4 weights' own error; elsewhere eager's float32 rounding.
    digits = dtype == "int4" and rows <= 4 and activations == "float32"
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=2e-4 if digits else 1e-5)
    return [s for s in program.runtime.schedule.externs if str(s.op) == "kiln.mm_quant.default"], program


def _gated(program) -> list:
    return [s for s in program.runtime.schedule.externs if str(s.op) == "kiln.mm_quant_gated.default"]


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize("dtype,group", [("int8", None), ("int4", 64)])
def test_the_compiled_model_runs_kiln_s_quantized_gemm_with_its_epilogues(dtype, group, rows):
    calls, program = _quantized_gemms(Block(), rows, dtype, group)
    # gate and up read x: one GEMM over both weights (200 + 200 columns) whose store makes
    # silu(gate) * up (kiln::mm_quant_gated): no kernel after it reads its 400 columns.
    assert len(calls) == 2 and _externs(program).count("kiln.mm_quant.default") == 2
    assert sorted(c.outputs[0].layout.size[-1] for c in calls) == [40, 96]
    (gated,) = _gated(program)
    assert gated.outputs[0].layout.size[-1] == 200 and gated.args[7] == "swish"
    assert not program.runtime.schedule.kernels  # (nothing left between the products)
    down = [c for c in calls if c.args[7] is not None]  # down(...) + x: the residual in the down GEMM
    assert len(down) == 1 and down[0].outputs[0].layout.size[-1] == 96


class GeluBiasMlp(nn.Module):
    """A gated MLP with biases and another gate: down(gelu_tanh(gate(x)) * up(x)) (GeGLU, as Gemma's)."""

    def __init__(self, d=96, hidden=100):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(d, hidden), nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x):
        return self.down(self.up(x) * torch.nn.functional.gelu(self.gate(x), approximate="tanh"))


class ScaledHalfMlp(GeluBiasMlp):
    """The second half scaled before its SiLU and the first bare: not unary(first) * second."""

    def forward(self, x):
        return self.down(self.gate(x) * torch.nn.functional.silu(self.up(x) * 2))


@pytest.mark.parametrize("rows", [1, 3, 7])
def test_a_gated_mlp_with_biases_and_gelu_is_one_product(rows):
    calls, program = _quantized_gemms(GeluBiasMlp(), rows, "int4", 32)
    (gated,) = _gated(program)
    assert gated.args[6] is not None and (gated.args[7], gated.args[9]) == ("gelu", "tanh")
    assert len(calls) == 1  # down


def test_a_product_of_the_halves_that_is_not_gated_stays_apart():
    """The merged product and the kernel after it stay where its halves meet otherwise. (gate and up
    are neighbours in the graph here: each slice of the merged product reaches the graph.)"""
    calls, program = _quantized_gemms(ScaledHalfMlp(), 1, "int4", 32)
    assert not _gated(program) and sorted(c.outputs[0].layout.size[-1] for c in calls) == [96, 200]


@pytest.mark.parametrize("rows", [1, 5])
def test_int8_activations_reach_kiln_s_gemm_and_match_eager_s_reference(rows):
    """activations="int8": eager quantizes each call's rows (kiln/quant/weights.py) and kiln's GEMM
    makes the same levels, at one row (vpdpbusd where the CPU has AVX512-VNNI) and at five (the
    float32 path over the quantized rows); merged siblings keep the flag."""
    calls, program = _quantized_gemms(Block(), rows, "int4", 32, activations="int8")
    (gated,) = _gated(program)
    assert len(calls) == 2 and all(c.args[11] is True for c in calls) and gated.args[10] is True
    torch.manual_seed(0)
    plain = kiln.quantize(Block().eval(), "int4", group_size=32)
    torch.manual_seed(0)  # (the same weights)
    quantized = kiln.quantize(Block().eval(), "int4", group_size=32, activations="int8")
    x = torch.randn(rows, 96)
    with torch.no_grad():
        a8, float_rows = quantized(x), plain(x)
    assert not torch.equal(a8, float_rows)  # the activations really are quantized ...
    assert ((a8 - float_rows).abs().max() / float_rows.abs().max()) < 0.02  # ... by ~1/254 of each group's max


class SiluMlp(nn.Module):
    def __init__(self, d=96, hidden=200):
        super().__init__()
        self.up, self.down = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x):
        return self.down(torch.nn.functional.silu(self.up(x)))


@pytest.mark.parametrize("dtype,group", [("int8", None), ("int4", 64)])
def test_a_unary_after_a_quantized_linear_runs_in_its_gemm(dtype, group):
    calls, _ = _quantized_gemms(SiluMlp(), 3, dtype, group)
    assert sorted(c.args[8] for c in calls) == ["none", "swish"]  # silu(up(x)) inside up's GEMM


def test_without_freezing_the_eager_reference_runs():
    torch.manual_seed(0)
    model = kiln.quantize(Block().eval(), "int8")
    x = torch.randn(5, 96)
    with pytest.warns(RuntimeWarning, match="quantized linear layer.* run eager's dequantizing reference"):
        out, program = compiled(model, x, freezing=False)  # (told: every call dequantizes the weights)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,group,rows", [("int8", None, 1), ("int4", 32, 3), ("int4", 128, 40), ("int8", None, 40)])
def test_a_bfloat16_model_s_quantized_layers_run_kiln_s_gemm(dtype, group, rows):
    """kiln.quantize of a bfloat16 model: its layers keep their bfloat16 bias, eager runs them
    (x's dtype throughout), and the compiled model runs kiln::mm_quant on the bfloat16 activations
    (gate and up merged, down's residual inside), no reference layer told of, bfloat16 out within
    bfloat16's rounding of eager's."""
    torch.manual_seed(0)
    model = kiln.quantize(Block().eval().to(torch.bfloat16), dtype, group_size=group)
    assert model.proj.bias.dtype == torch.bfloat16
    x = torch.randn(rows, 96).bfloat16()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # (no layer left to eager's reference)
        out, program = compiled(model, x, freezing=True)
    with torch.no_grad():
        expected = model(x)
    assert out.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)
    calls = [s for s in program.runtime.schedule.externs if str(s.op) == "kiln.mm_quant.default"]
    # (its SiLU runs in float32 between two casts: gate and up stay one plain product and a kernel)
    assert len(calls) == 3 and sum(c.args[7] is not None for c in calls) == 1 and not _gated(program)


@pytest.mark.parametrize("kwargs,message", [
    (dict(dtype="int2"), "dtype must be one of 'int8', 'int4'"),
    (dict(dtype="int8", group_size=64), "group_size applies to 'int4' only"),
    (dict(dtype="int4", group_size=33), "group_size must be an even int"),
    (dict(dtype="int4", group_size=0), "group_size must be an even int"),
    (dict(dtype="int4", activations="bf16"), "activations must be one of 'float32', 'int8'"),
    (dict(dtype="int8", activations="int8"), "activations='int8' applies to 'int4' only"),
])
def test_bad_arguments_name_what_is_accepted(kwargs, message):
    with pytest.raises(ValueError, match=message):
        kiln.quantize(Block(), **kwargs)
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        kiln.quantize(lambda x: x, "int8")


@pytest.mark.parametrize("arch,dtype,group,activations", [("llama", "int8", None, "float32"),
                                                          ("llama", "int4", 32, "float32"),
                                                          ("gpt2", "int4", 64, "float32"),
                                                          ("llama", "int4", 32, "int8")])
def test_generate_of_a_quantized_decoder_gives_eager_s_tokens(arch, dtype, group, activations):
    kiln.reset()
    fallback.reset()
    model = kiln.quantize(_decoder(arch), dtype, group_size=group, activations=activations)
    prompt = torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(1))
    options = dict(max_new_tokens=24, min_new_tokens=24, do_sample=False, cache_implementation="static")
    with torch.no_grad():
        expected = model.generate(prompt, **options)
        model.forward = kiln.compile(model.forward)
        tokens = model.generate(prompt, **options)
    assert torch.equal(tokens, expected)
    assert fallback.FALLBACKS == [] and kiln.capture.BREAKS == []


def test_gpt2_s_conv1d_is_quantized_and_multihead_attention_s_linear_is_left():
    """HF's Conv1D (GPT-2: weight [in, out]) becomes a QuantizedLinear computing the same product;
    nn.MultiheadAttention's out_proj, whose weight its owner reads directly, stays as it is."""
    torch.manual_seed(0)
    gpt2 = _decoder("gpt2")
    reference = copy.deepcopy(gpt2)
    kiln.quantize(gpt2, "int8")
    attn = gpt2.transformer.h[0].attn.c_attn
    assert isinstance(attn, QuantizedLinear) and (attn.in_features, attn.out_features) == (64, 192)
    x = torch.randn(2, 64)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), reference.transformer.h[0].attn.c_attn(x), rtol=0.02, atol=0.02)
    prompt = torch.randint(0, 1000, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert gpt2(prompt).logits.shape == reference(prompt).logits.shape

    block = nn.Sequential(nn.Linear(16, 16))
    mha = nn.MultiheadAttention(16, 2, batch_first=True)
    block.add_module("mha", mha)
    kiln.quantize(block, "int8")
    assert isinstance(block[0], QuantizedLinear) and type(mha.out_proj) is nn.modules.linear.NonDynamicallyQuantizableLinear
    q = torch.randn(1, 3, 16)
    assert mha(q, q, q)[0].shape == (1, 3, 16)


@pytest.mark.parametrize("bits", [8, 4])
def test_the_operator_reads_rows_of_any_layout(bits):
    """kiln::mm_quant takes A's rows and the residual's by pointer and row stride (no view through
    the dispatcher): a contiguous [B, S, K], a 2-D slice of wider rows, a transposed (copied) and a
    one-row slice give the contiguous product, the result shaped [..., N]."""
    from kiln.externs import native_ops

    torch.manual_seed(0)
    linear = nn.Sequential(nn.Linear(64, 24, bias=False))
    layer = (kiln.quantize(linear, "int4", group_size=32) if bits == 4 else kiln.quantize(linear, "int8"))[0]
    mm_quant = native_ops.direct("mm_quant")

    def product(a, residual=None):
        return mm_quant(a, layer.qweight, layer.scales, layer.zeros, bits, 32 if bits == 4 else 64, None, residual,
                        "none", [], None, False)

    wide, residual = torch.randn(6, 100), torch.randn(6, 40)
    rows = wide[:, 10:74].contiguous()
    want = product(rows, residual[:, :24].contiguous())
    layouts = [(wide[:, 10:74], residual[:, :24]),                                        # 2-D, rows of stride 100 and 40
               (rows.t().contiguous().t(), residual[:, :24].t().contiguous().t()),      # transposed: copied
               (rows.reshape(2, 3, 64), residual[:, :24].contiguous().reshape(2, 3, 24))]  # 3-D contiguous
    for a, r in layouts:
        got = product(a, r)
        assert got.shape == (*a.shape[:-1], 24) and got.is_contiguous()
        torch.testing.assert_close(got.reshape(6, 24), want, rtol=0, atol=0)
    one = product(wide[2:3, 10:74])  # one row whose stride is not K
    torch.testing.assert_close(one, product(rows[2:3]), rtol=0, atol=0)


class RmsNorm(nn.Module):
    """LlamaRMSNorm's arithmetic: weight * (x * rsqrt(mean(x^2) + eps))."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(d) + 0.5)

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


class PreNormBlock(nn.Module):
    """A pre-norm decoder layer's residual stream: h = x + o(x); its norm read by the next product
    and h read again (the sum kept); then a last norm of down(h') + h that nothing else reads."""

    def __init__(self, d=96, norm="rms"):
        super().__init__()
        make = (lambda: RmsNorm(d)) if norm == "rms" else (lambda: nn.LayerNorm(d))
        self.o, self.up, self.down = nn.Linear(d, d, bias=False), nn.Linear(d, 160), nn.Linear(160, d)
        self.norm1, self.norm2 = make(), make()

    def forward(self, x):
        h = x + self.o(x)
        h = self.down(torch.relu(self.up(self.norm1(h)))) + h
        return self.norm2(h)


@pytest.mark.parametrize("dtype,group,norm,rows", [("int8", None, "rms", 1), ("int4", 32, "rms", 1),
                                                   ("int4", 64, "layer", 5), ("int8", None, "layer", 3)])
def test_a_norm_after_a_quantized_product_and_its_residual_runs_in_its_gemm(dtype, group, norm, rows):
    """The residual sum's norm inside the quantized GEMM (kiln/passes/gemm_layer_norm.py): o's sum
    read again (mm_quant_add_layer_norm keeps it), down's not (mm_quant_layer_norm, its bias kept)."""
    torch.manual_seed(0)
    model = kiln.quantize(PreNormBlock(norm=norm).eval(), dtype, group_size=group)
    x = torch.randn(1, rows, 96)
    out, program = compiled(model, x, freezing=True)
    digits = dtype == "int4" and rows <= 4
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-3 if digits else 1e-4)
    externs = _externs(program)
    assert externs.count("kiln.mm_quant_add_layer_norm.default") == 1
    assert externs.count("kiln.mm_quant_layer_norm.default") == 1
    assert externs.count("kiln.mm_quant.default") == 1  # up, its relu inside
    (last,) = [s for s in program.runtime.schedule.externs if str(s.op) == "kiln.mm_quant_layer_norm.default"]
    assert last.args[6] is not None and last.args[7] is not None  # down's bias and the residual h
    assert last.kwargs.get("rms", False) is (norm == "rms")


@pytest.mark.parametrize("arch,dtype", [("qwen2", "int4"), ("llama", "int8")])
def test_a_left_padded_batch_of_a_quantized_decoder_gives_eager_s_tokens(arch, dtype):
    """Two prompts, the first left-padded, through kiln's greedy loop with a static cache: the
    quantized products take two rows a decode step (not the one-row path), the mask its padding."""
    kiln.reset()
    fallback.reset()
    model = kiln.quantize(_decoder(arch), dtype, group_size=32 if dtype == "int4" else None)
    prompt = torch.randint(1, 1000, (2, 12), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(prompt)
    prompt[0, :4], mask[0, :4] = 0, 0
    options = dict(max_new_tokens=20, do_sample=False, pad_token_id=0, eos_token_id=None, attention_mask=mask,
                   cache_implementation="static")
    with torch.no_grad():
        expected = model.generate(prompt, **options)
        tokens = kiln.compile(model).generate(prompt, **options)
    assert torch.equal(tokens, expected) and tokens.shape == (2, 32)
    assert fallback.FALLBACKS == [] and kiln.capture.BREAKS == []
