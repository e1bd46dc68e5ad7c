"""bfloat16 fast math for float32 models: `kiln.compile(model, options={"fp32_gemm": "bf16"})`, the
setting `backend.fp32_gemm` (`KILN_FP32_GEMM`). Every float32 product with a frozen weight that
gemm_prepack takes runs kiln's GEMM over bfloat16 operands (`kiln_bf16`), its unary op inside and
the norms gemm_layer_norm fuses after it, and everything stays float32.

The bound. Each product rounds its operands to bfloat16 (u = 2^-8); its error then has rms about
0.6 u sqrt(sum_k (a_k b_k)^2) (tests/codegen/test_kiln_gemm_bf16_math.py), which is 0.6 u of the
product's own rms where the terms' signs are random: each of a block's P products moves what it
feeds by about 0.6 u relative, and the norms keep the scale, so the block's output is off by at
most u P relative (rms over the output; the errors adding in the worst case). It is not below
float32's: at least u / 16, where float32 gives ~1e-4 u. And the output is that of the same block
computed in float64 with each Linear's input and weight rounded to bfloat16, within float32's
error (u / 256 relative): bfloat16 rounding is all that changed.

The option off (the default, or "fp32"), nothing changes; the setting's values are checked; a graph
compiled under one value is never loaded under the other."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import kiln
from benchmarks import kernels
from kiln import config
from kiln.backend import watch
from kiln.backend.backends import settings_for
from kiln.quant import QuantizedLinear
from kiln.runtime import fallback
from tests.kiln_backend import kiln_wherever_offered, private_cache  # noqa: F401  (fixture)

U = 2.0 ** -8  # bfloat16's unit roundoff
BF16_MATH = "kiln_bf16"


class RMSNorm(torch.nn.Module):
    """Llama's RMS norm as HF writes it: weight * (x * rsqrt(mean(x^2) + eps))."""

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = torch.nn.Parameter(torch.empty(d).uniform_(0.5, 1.5)), eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class Mlp(torch.nn.Module):
    """A post-norm transformer's MLP (BERT's): LayerNorm(dense(gelu(dense(x) + bias) + bias) + x). Two products."""

    PRODUCTS = 2

    def __init__(self, d: int = 64, hidden: int = 256):
        super().__init__()
        self.up, self.down, self.norm = torch.nn.Linear(d, hidden), torch.nn.Linear(hidden, d), torch.nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(self.down(F.gelu(self.up(x))) + x)


class Llama(torch.nn.Module):
    """A pre-norm block as Llama's: RMS norms, a residual stream read again, a gated SiLU MLP, a
    final norm. Five products, four on the longest path."""

    PRODUCTS = 4

    def __init__(self, d: int = 64, hidden: int = 176):
        super().__init__()
        self.n1, self.n2, self.n3 = RMSNorm(d), RMSNorm(d), RMSNorm(d)
        self.v, self.o = torch.nn.Linear(d, d, bias=False), torch.nn.Linear(d, d, bias=False)
        self.gate, self.up = torch.nn.Linear(d, hidden, bias=False), torch.nn.Linear(d, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        h = x + self.o(self.v(self.n1(x)))
        n = self.n2(h)
        return self.n3(h + self.down(F.silu(self.gate(n)) * self.up(n)))


class Classifier(torch.nn.Module):
    """A classifier's head: softmax(dense(x) + bias). One product."""

    PRODUCTS = 1

    def __init__(self, d: int = 96, classes: int = 10):
        super().__init__()
        self.fc = torch.nn.Linear(d, classes)

    def forward(self, x):
        return torch.softmax(self.fc(x), -1)


# Each block, its input, and the kiln GEMM calls its graph must hold: (op name, how many).
CASES = {
    "mlp": (Mlp, (4, 16, 64), {"mm": 1, "mm_layer_norm": 1}),  # GELU inside the first, the norm the second's
    "llama": (Llama, (2, 16, 64), {"mm": 2, "mm_add_layer_norm": 1, "mm_layer_norm": 1}),  # gate and up one (sibling_products)
    "classifier": (Classifier, (8, 96), {"mm_softmax": 1}),
}


def _block(name):
    torch.manual_seed(0)
    make, shape, calls = CASES[name]
    return make().eval(), torch.randn(shape), calls


def _in_bf16_math(model: torch.nn.Module, weights: bool = True) -> torch.nn.Module:
    """`model` in float64 with each Linear's input (and weight, `weights`) rounded to bfloat16: what
    bfloat16 fast math computes, without its float32 rounding."""
    rounded = copy.deepcopy(model).double()
    for module in rounded.modules():
        if isinstance(module, torch.nn.Linear):
            if weights:
                with torch.no_grad():
                    module.weight.copy_(module.weight.bfloat16().double())
            module.register_forward_pre_hook(lambda _, args: (args[0].float().bfloat16().double(),))
    return rounded


def _relative(y: torch.Tensor, reference: torch.Tensor) -> float:
    return ((y.double() - reference.double()).norm() / reference.double().norm()).item()


def _compiled(model, x, **options):
    """(the output, the kiln GEMM calls of the compiled graphs as (op name, impl)) of
    kiln.compile(model, options=options); nothing may fall back to eager."""
    kiln.reset()
    fallback.reset()
    with torch.no_grad(), watch() as built:
        y = kiln.compile(model, fullgraph=True, options=options or None)(x)
    assert not fallback.FALLBACKS
    calls = []
    for program in built:
        for step in getattr(program, "runtime", program).schedule.externs:
            name = step.op.name() if isinstance(step.op, torch._ops.OpOverload) else str(step.op)
            if name == "kiln::mm":
                calls.append(("mm", step.args[6]))
            elif name.startswith("kiln::mm_"):
                calls.append((name[len("kiln::"):], step.kwargs.get("impl", "kiln")))
    return y, calls


@pytest.mark.parametrize("name", CASES)
def test_every_product_runs_in_bfloat16_math_within_the_bound(name):
    model, x, expected = _block(name)
    y, calls = _compiled(model, x, fp32_gemm="bf16")
    assert y.dtype == torch.float32
    assert all(impl == BF16_MATH for _, impl in calls), calls
    assert {op: sum(1 for o, _ in calls if o == op) for op, _ in calls} == expected
    with torch.no_grad():
        eager, rounded = model(x), _in_bf16_math(model)(x.double())
    error = _relative(y, eager)
    assert U / 16 <= error <= U * model.PRODUCTS, error / U
    assert _relative(y, rounded) <= U / 256


def _dequantized(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of a kiln.quantize'd `model` whose quantized Linears are plain ones over their
    dequantized weights (eager's values)."""
    dense = copy.deepcopy(model)
    for name, module in list(dense.named_modules()):
        if isinstance(module, QuantizedLinear):
            linear = torch.nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
            with torch.no_grad():
                linear.weight.copy_(module.dequantized_weight())
                if module.bias is not None:
                    linear.bias.copy_(module.bias)
            setattr(dense, name, linear)
    return dense


@pytest.mark.parametrize("scheme,group", [("int4", 32), ("int8", None)])
def test_quantized_products_take_bfloat16_math_for_a_prompt_on_amx(scheme, group):
    """A kiln.quantize'd model under the option: every quantized product (mm_quant and the norms
    fused after it) takes impl kiln_bf16. A prompt's 32 rows run on AMX where it is this CPU's
    bfloat16 product (kiln_gemm_quant.h `gemm_quant_bf16_math`): the inputs rounded to bfloat16,
    int8's levels and scales exact, int4's dequantized weights rounded to bfloat16, within the
    bound above; elsewhere the float32 products' values."""
    model, x, _ = _block("llama")
    model = kiln.quantize(model, scheme, group_size=group)
    y, calls = _compiled(model, x, fp32_gemm="bf16")
    # (qkv; gate and up, SiLU(gate) * up in their store; o and down with their norms)
    assert sorted(op for op, _ in calls) == ["mm_quant", "mm_quant_add_layer_norm", "mm_quant_gated", "mm_quant_layer_norm"]
    assert all(impl == BF16_MATH for _, impl in calls), calls
    with torch.no_grad():
        eager, rounded = model(x), _in_bf16_math(_dequantized(model), weights=scheme == "int4")(x.double())
    # Whether AMX is this CPU's bfloat16 product is timed once per library (kiln_gemm.h
    # `bf16_fastest_product`): the runtime that ran the model and the kernels library asked here
    # can time it differently on a loaded machine (two test workers on two cores). The values say
    # which one ran: bfloat16's rounding (~1e-3) or float32's (~1e-7), each held to its own bound.
    if kernels.library().kiln_gemm_bf16_amx() and _relative(y, eager) > 1e-5:
        assert U / 32 <= _relative(y, eager) <= U * model.PRODUCTS
        assert _relative(y, rounded) <= U / 256
    else:
        assert _relative(y, eager) <= 1e-5


def test_the_setting_asks_for_it_as_the_option_does_even_with_autotuning_off():
    model, x, expected = _block("mlp")
    with config.patch({"backend.fp32_gemm": "bf16", "backend.autotune": "off"}):
        y, calls = _compiled(model, x)
    assert [impl for _, impl in calls] == [BF16_MATH] * 2
    torch.testing.assert_close(y, _compiled(model, x, fp32_gemm="bf16")[0], rtol=0, atol=0)


def test_off_by_default_and_as_before(private_cache, kiln_wherever_offered):  # noqa: F811
    """The default compiles no bfloat16 math anywhere, within float32's error of eager; "fp32" is
    the default: its graph is the default's, loaded from the same cache entry, the same bits. (The
    autotuner's answers made kiln's GEMM: on these small shapes its timing could pick ATen for
    every product, leaving no kiln GEMM call to look at, as it did once in a run of 2026-12-06.)"""
    model, x, _ = _block("llama")
    y, calls = _compiled(model, x)
    assert calls and all(impl == "kiln" or op == "mm" and impl != BF16_MATH for op, impl in calls)
    with torch.no_grad():
        assert _relative(y, model(x)) <= U / 256
    y_fp32, built = _compiled(model, x, fp32_gemm="fp32")
    assert built == [] and len(sorted((private_cache / "aot").rglob("*.pkl"))) == 1
    torch.testing.assert_close(y_fp32, y, rtol=0, atol=0)


def test_a_bfloat16_model_is_left_to_the_autotuner():
    """Its products are bfloat16 already: the setting is about float32 ones."""
    model, x, _ = _block("mlp")
    with config.patch({"backend.autotune": "off"}):
        _, calls = _compiled(model.bfloat16(), x.bfloat16(), fp32_gemm="bf16")
    assert calls == []


def test_a_graph_compiled_under_one_value_is_never_loaded_under_the_other(private_cache):  # noqa: F811
    model, x, _ = _block("mlp")
    first, _ = _compiled(model, x)
    fast, calls = _compiled(model, x, fp32_gemm="bf16")  # built again, not loaded
    assert [impl for _, impl in calls] == [BF16_MATH] * 2 and not torch.equal(fast, first)
    again, _ = _compiled(model, x)  # the first entry, loaded
    fast_again, _ = _compiled(model, x, fp32_gemm="bf16")  # the second, loaded
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    torch.testing.assert_close(fast_again, fast, rtol=0, atol=0)
    assert len(sorted((private_cache / "aot").rglob("*.pkl"))) == 2


def test_the_option_s_values_are_checked():
    with pytest.raises(ValueError) as error:
        kiln.compile(Mlp(), options={"fp32_gemm": "fp16"})
    message = str(error.value)
    assert "options['fp32_gemm']" in message and "'fp32', 'bf16'" in message and "'fp16'" in message


def test_the_setting_s_values_are_checked():
    """Raised by the backend before it compiles anything, as any failure there: with fullgraph=True
    to the caller."""
    model, x, _ = _block("mlp")
    kiln.reset()
    with config.patch({"backend.fp32_gemm": "fp16"}), torch.no_grad(), pytest.raises(ValueError) as error:
        kiln.compile(model, fullgraph=True)(x)
    message = str(error.value)
    assert "backend.fp32_gemm" in message and "KILN_FP32_GEMM" in message and "fp32, bf16" in message
    assert "'fp16'" in message


def test_the_environment_variable_and_torch_compile_s_option():
    try:
        config.reload_from_env({"KILN_FP32_GEMM": "bf16"})
        assert config.backend.fp32_gemm == "bf16"
    finally:
        config.reload_from_env()
    assert config.backend.fp32_gemm == "fp32"
    assert settings_for(None, {"fp32_gemm": "bf16"}) == {"backend.fp32_gemm": "bf16"}
