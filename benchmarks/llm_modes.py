"""What the llm suite (`kiln bench --suite llm`) compares: HuggingFace decoders built from configs,
and the ways each one's `forward` is run under `generate()`.

Every model is built from its config with seeded random weights (no hub access), float32, in eval
mode. Every mode gets its own `copy.deepcopy` of the model and replaces the copy's `forward`:
swapping `forward` on one model between modes would change the module (kiln's
`MODULE_STRUCTURE` guard) and recompile. A mode whose API has not landed yet says why
(`unavailable_reason`) and is reported as "not available", never replaced by another mode.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager

import torch
from torch import nn

SEED = 0
INT4_GROUP_SIZE = 128


@dataclass(frozen=True)
class LlmModel:
    """A decoder LM: `transformers.<model_class>(<config_class>(**config))`."""

    name: str
    description: str
    model_class: str
    config_class: str
    config: dict[str, Any]

    def build(self) -> nn.Module:
        import transformers

        config = getattr(transformers, self.config_class)(**self.config)
        torch.manual_seed(SEED)
        return getattr(transformers, self.model_class)(config).eval()


_LLAMA_TINY = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=512)

LLM_MODELS: dict[str, LlmModel] = {m.name: m for m in [
    LlmModel("llama-160m", "Llama, hidden 768, 12 layers, 12 heads, 0.13 B parameters (untied LM head)", "LlamaForCausalLM",
             "LlamaConfig", dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                                 num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=2048)),
    # Qwen2-0.5B's own sizes: 14 query heads over 2 key-value heads, q/k/v biases, the LM head tied to
    # the embeddings (0.49 B parameters, of which 0.14 B are the 151936-token embedding).
    LlmModel("qwen2-0.5b", "Qwen2-0.5B's config: hidden 896, 24 layers, 14 heads over 2 KV heads, tied LM head",
             "Qwen2ForCausalLM", "Qwen2Config",
             dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6,
                  rms_norm_eps=1e-6, tie_word_embeddings=True)),
    LlmModel("tinyllama-1.1b", "TinyLlama-1.1B's config: hidden 2048, 22 layers, 32 heads over 4 KV heads",
             "LlamaForCausalLM", "LlamaConfig",
             dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                  num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048, rms_norm_eps=1e-5)),
    LlmModel("llama-tiny", "Llama, hidden 64, 2 layers (the suite's tests)", "LlamaForCausalLM", "LlamaConfig",
             _LLAMA_TINY),
]}
# The first two: a default run that finishes in reasonable time on 2 cores.
DEFAULT_MODELS = ("llama-160m", "qwen2-0.5b")


class NotAvailable(Exception):
    """A mode whose API does not exist yet; the message says why."""


@dataclass(frozen=True)
class LlmMode:
    """One way to run a model's forward under `generate()`.

    `prepare(model)` changes the model copy it is given where the mode needs it (quantization, a
    compiled forward) and returns what `generate` is called on, as the mode's users write it: the
    model itself, or `kiln.compile(model)`. `weights` is how the mode stores the linear layers' weights
    ("fp32", "bf16", "int8", "int4": the bytes a decode step reads); `exact` modes must give eager's
    tokens; the others report the fraction of tokens that agree. `context()` is entered around
    each of the mode's `generate` calls.
    """

    name: str
    help: str
    weights: str
    exact: bool
    prepare: Callable[[nn.Module], nn.Module]
    unavailable_reason: Callable[[], str | None]
    context: Callable[[], ContextManager] = field(default=contextlib.nullcontext)

    @property
    def quantizes(self) -> bool:
        return self.weights in ("int8", "int4")


def _always() -> None:
    return None


def _eager(model: nn.Module) -> nn.Module:
    return model


def _inductor_freeze(model: nn.Module) -> nn.Module:
    # (Dynamo's compiled module runs `generate` of the original eagerly: its forward is what compiles.)
    model.forward = torch.compile(model.forward)
    return model


def _freezing() -> ContextManager:
    # Inductor reads `freezing` when it compiles, which under generate() is inside a call (the
    # prefill, the decode step); set only around this mode's calls, so no other mode of the run
    # compiles with it.
    import torch._inductor.config as inductor_config

    return inductor_config.patch(freezing=True)


def _compile_options(options: dict | None) -> dict:
    return {"options": options} if options else {}


def _options_reason(options: dict | None) -> Callable[[], str | None]:
    def reason() -> str | None:
        import kiln

        if not options:
            return None
        try:  # (kiln.compile checks its options when called; nothing is compiled until the first call)
            kiln.compile(lambda x: x, **_compile_options(options))
        except ValueError as e:
            if "unknown option" not in str(e):
                raise
            return f"kiln.compile does not accept options={options} yet ({e})"
        return None

    return reason


def _quantize_reason(scheme: str | None) -> Callable[[], str | None]:
    def reason() -> str | None:
        import kiln

        if scheme is None or callable(getattr(kiln, "quantize", None)):
            return None
        return f"kiln.quantize (weight-only {scheme}) does not exist yet"

    return reason


def _kiln(options: dict | None = None, scheme: str | None = None, **quantize: Any) -> Callable[[nn.Module], nn.Module]:
    def prepare(model: nn.Module) -> nn.Module:
        import kiln

        why = _quantize_reason(scheme)() or _options_reason(options)()
        if why:
            raise NotAvailable(why)
        if scheme is not None:
            model = kiln.quantize(model, scheme, **quantize)  # (in place: the nn.Linear layers replaced)
        return kiln.compile(model, **_compile_options(options))  # its generate() runs the forward compiled

    return prepare


def _kiln_reason(options: dict | None = None, scheme: str | None = None) -> Callable[[], str | None]:
    return lambda: _quantize_reason(scheme)() or _options_reason(options)()


_BF16 = {"fp32_gemm": "bf16"}

LLM_MODES: dict[str, LlmMode] = {m.name: m for m in [
    LlmMode("eager", "plain PyTorch: the tokens every other mode is checked against", "fp32", True, _eager, _always),
    LlmMode("inductor-freeze", "torch.compile(model.forward) with Inductor's freezing", "fp32", True, _inductor_freeze,
            _always, _freezing),
    LlmMode("kiln", "kiln.compile(model.forward), float32", "fp32", True, _kiln(), _kiln_reason()),
    LlmMode("kiln-bf16", f"kiln.compile(model.forward, options={_BF16}): float32 GEMMs in bfloat16", "bf16", False,
            _kiln(_BF16), _kiln_reason(_BF16)),
    LlmMode("kiln-int8", 'kiln.quantize(model, "int8") (weight-only, per channel), then kiln.compile', "int8", False,
            _kiln(scheme="int8"), _kiln_reason(scheme="int8")),
    LlmMode("kiln-int4", f'kiln.quantize(model, "int4", group_size={INT4_GROUP_SIZE}) (weight-only), then kiln.compile',
            "int4", False, _kiln(scheme="int4", group_size=INT4_GROUP_SIZE), _kiln_reason(scheme="int4")),
    LlmMode("kiln-int8-bf16", f'kiln.quantize(model, "int8"), then kiln.compile(options={_BF16}): the prompt\'s '
            "products on bfloat16 units (AMX), the decode step's as kiln-int8's", "int8", False,
            _kiln(_BF16, scheme="int8"), _kiln_reason(_BF16, scheme="int8")),
    LlmMode("kiln-int4-bf16", f'kiln.quantize(model, "int4", group_size={INT4_GROUP_SIZE}), then '
            f"kiln.compile(options={_BF16}): the prompt's products on bfloat16 units (AMX), the decode step's as "
            "kiln-int4's", "int4", False, _kiln(_BF16, scheme="int4", group_size=INT4_GROUP_SIZE),
            _kiln_reason(_BF16, scheme="int4")),
    LlmMode("kiln-int4-a8", f'kiln.quantize(model, "int4", group_size={INT4_GROUP_SIZE}, activations="int8"), then '
            "kiln.compile: int4 weights, activations quantized to int8 per group at each call",
            "int4", False, _kiln(scheme="int4", group_size=INT4_GROUP_SIZE, activations="int8"),
            _kiln_reason(scheme="int4")),
]}
