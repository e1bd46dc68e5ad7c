"""The benchmark's models: one `ModelSpec` entry per model, grouped into suites.

Every model is built from a config object with seeded random weights (no hub access), and comes
with its input maker. Adding a model is one `_register(...)` call at the bottom of this file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

SEED = 0


@dataclass(frozen=True)
class ModelSpec:
    """How to build one benchmark model and its inputs.

    `build(train)` returns the module in train() or eval() mode; `make_inputs()` returns the keyword
    arguments of one forward call. Both are deterministic.
    """

    name: str
    suites: tuple[str, ...]
    description: str
    build: Callable[[bool], nn.Module]
    make_inputs: Callable[[], dict[str, torch.Tensor]]


MODELS: dict[str, ModelSpec] = {}


def _register(spec: ModelSpec) -> None:
    if spec.name in MODELS:
        raise ValueError(f"benchmark model {spec.name!r} is registered twice")
    MODELS[spec.name] = spec


def chosen_models(suite: str | None, models: str) -> list[str]:
    """The model names a command line asked for: a suite's, or a comma-separated list; ValueError
    naming the unknown one otherwise."""
    names = suites().get(suite) if suite else models.split(",")
    if not names:
        raise ValueError(f"unknown suite {suite!r}; known: {', '.join(suites())}")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise ValueError(f"unknown model {unknown[0]!r}; known: {', '.join(MODELS)}")
    return names


def suites() -> dict[str, list[str]]:
    """Suite name -> model names, in registration order."""
    out: dict[str, list[str]] = {}
    for spec in MODELS.values():
        for suite in spec.suites:
            out.setdefault(suite, []).append(spec.name)
    return out


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(SEED + 1)


def token_ids(vocab_size: int, seq: int, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab_size, (batch, seq), generator=_generator())


def image(size: int, batch: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=_generator())


def _without_dropout(config: Any) -> Any:
    # Training comparisons need the same masks in eager and compiled runs; compilers do not promise
    # eager's RNG stream, so every dropout probability in the config is set to zero.
    for key, value in config.to_dict().items():
        if isinstance(value, float) and any(w in key for w in ("dropout", "pdrop", "drop_path")):
            setattr(config, key, 0.0)
    return config


def _finish(model: nn.Module, train: bool) -> nn.Module:
    if train:
        for module in model.modules():
            if isinstance(module, nn.Dropout):
                module.p = 0.0
    return model.train(train)


def hf_model(
    name: str,
    suites: tuple[str, ...],
    model_class: str,
    config_class: str,
    config: dict[str, Any],
    inputs: Callable[[Any], dict[str, torch.Tensor]],
    prepare: Callable[[nn.Module, dict[str, torch.Tensor]], None] | None = None,
) -> ModelSpec:
    """A HuggingFace `transformers` model built from `config_class(**config)` with random weights;
    `prepare(model, inputs)`, if given, adjusts the fresh model before it is put in train/eval mode."""

    def make_config() -> Any:
        import transformers

        return getattr(transformers, config_class)(**config)

    def build(train: bool) -> nn.Module:
        import transformers

        cfg = make_config()
        if train:
            cfg = _without_dropout(cfg)
        torch.manual_seed(SEED)
        model = getattr(transformers, model_class)(cfg)
        if prepare is not None:
            prepare(model, inputs(cfg))
        return _finish(model, train)

    return ModelSpec(
        name=name,
        suites=suites,
        description=f"transformers.{model_class}",
        build=build,
        make_inputs=lambda: inputs(make_config()),
    )


class MLP(nn.Module):
    """Two linear layers with a GELU: the harness's own tests use it because it compiles in seconds."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.gelu(self.up(x)))


def calibrate_batch_norms(model: nn.Module, inputs: dict[str, torch.Tensor]) -> None:
    """Give every BatchNorm PyTorch's default affine (weight 1, bias 0) and running statistics
    measured on `inputs`, as training leaves them.

    A randomly initialized deep conv net has no normalization in eval mode (running mean 0,
    variance 1), so each layer scales its input by its weights' gain: HF's init (std 0.02, and
    MobileViT's BatchNorm weights drawn at std 0.02 too) leaves MobileNetV1's output near 1e-27 and
    MobileViT's at 1e-40, denormal floats that are slow on x86 and that a compiler flushing them to
    zero gets "wrong". Calibrated, activations have the scale of a trained net's."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    with torch.no_grad():
        for bn in norms:
            nn.init.ones_(bn.weight), nn.init.zeros_(bn.bias)
            bn.reset_running_stats()
            bn.momentum = None  # a cumulative average: the statistics of this one batch
        model.eval()
        for bn in norms:
            bn.train()
        model(**inputs)
    for bn in norms:
        bn.momentum = 0.1  # PyTorch's default, for training runs
        bn.eval()


def _build_mlp(train: bool) -> nn.Module:
    torch.manual_seed(SEED)
    return _finish(MLP(), train)


# Text models take token ids; `no_cache` keeps outputs plain tensors (no KV-cache objects).
def _ids(seq: int) -> Callable[[Any], dict[str, torch.Tensor]]:
    return lambda cfg: {"input_ids": token_ids(cfg.vocab_size, seq)}


def _encoder_decoder_ids(seq: int) -> Callable[[Any], dict[str, torch.Tensor]]:
    return lambda cfg: {
        "input_ids": token_ids(cfg.vocab_size, seq),
        "decoder_input_ids": token_ids(cfg.vocab_size, seq).flip(-1),
    }


def _pixels(size: int) -> Callable[[Any], dict[str, torch.Tensor]]:
    return lambda cfg: {"pixel_values": image(size)}


def _config_pixels(cfg: Any) -> dict[str, torch.Tensor]:
    # The image size the model was designed for (MobileViT's is 256, not 224).
    return {"pixel_values": image(cfg.image_size)}


no_cache = {"use_cache": False}

def _protein_ids(seq: int, padded: int) -> Callable[[Any], dict[str, torch.Tensor]]:
    """ESM's inputs: amino-acid tokens (ids 4-23 of ESM's vocabulary; no mask token) whose last
    `padded` positions are padding, and the int64 attention mask that says so."""

    def inputs(cfg: Any) -> dict[str, torch.Tensor]:
        mask = torch.ones(1, seq, dtype=torch.int64)
        mask[:, seq - padded:] = 0
        ids = (4 + token_ids(20, seq)).masked_fill(mask == 0, cfg.pad_token_id)
        return {"input_ids": ids, "attention_mask": mask}

    return inputs


# ---- the hf suite: the models every issue is judged on ----
# (gpu: the models the GPU check of issue 50 times, in bfloat16 at batch 8; see the gpu suite below)
_register(hf_model("bert", ("hf", "gpu"), "BertModel", "BertConfig", {}, _ids(128)))
_register(hf_model("gpt2", ("hf", "gpu"), "GPT2LMHeadModel", "GPT2Config", no_cache, _ids(128)))
_register(
    hf_model(
        "t5",
        ("hf",),
        "T5Model",
        "T5Config",
        {**no_cache, "d_model": 512, "d_ff": 2048, "num_layers": 6, "num_heads": 8, "d_kv": 64},
        _encoder_decoder_ids(128),
    )
)
_register(hf_model("distilbert", ("hf",), "DistilBertModel", "DistilBertConfig", {}, _ids(128)))
_register(hf_model("vit", ("hf",), "ViTModel", "ViTConfig", {}, _pixels(224)))
_register(hf_model("resnet50", ("hf", "gpu"), "ResNetModel", "ResNetConfig", {}, _pixels(224)))
_register(
    hf_model(
        "llama",
        ("hf",),
        "LlamaForCausalLM",
        "LlamaConfig",
        {
            **no_cache,
            "hidden_size": 512,
            "intermediate_size": 1376,
            "num_hidden_layers": 4,
            "num_attention_heads": 8,
            "num_key_value_heads": 8,
            "vocab_size": 32000,
        },
        _ids(128),
    )
)
_register(hf_model("convnext", ("hf",), "ConvNextModel", "ConvNextConfig", {}, _pixels(224)))
# Depthwise-convolution nets, kiln's weakest family (issue 20): MobileNetV1 (depthwise + pointwise
# blocks with ReLU6, 224x224) and MobileViT-small (inverted residuals with SiLU and transformer
# blocks, 256x256), both at their configs' default sizes, BatchNorms calibrated on the input.
_register(hf_model("mobilenetv1", ("hf",), "MobileNetV1Model", "MobileNetV1Config", {}, _config_pixels,
                   calibrate_batch_norms))
_register(hf_model("mobilevit", ("hf",), "MobileViTModel", "MobileViTConfig", {}, _config_pixels,
                   calibrate_batch_norms))
# Windowed attention (shifted windows, relative position bias, patch merging): Swin V2-tiny at
# 224x224, the model whose compile time was a cliff (issue 22).
_register(hf_model("swinv2", ("hf",), "Swinv2Model", "Swinv2Config", {}, _pixels(224)))

# ---- the gpu suite: bert, gpt2 and resnet50 above, and two more (issue 50) ----
# A Mistral-style decoder: grouped-query attention (16 query heads over 4 key-value heads), RMS
# norms, SwiGLU, rotary positions; 4 layers at hidden 1024. No sliding window: at sequence 128 it
# would mask nothing.
_register(
    hf_model(
        "mistral",
        ("gpu",),
        "MistralForCausalLM",
        "MistralConfig",
        {
            **no_cache,
            "hidden_size": 1024,
            "intermediate_size": 3584,
            "num_hidden_layers": 4,
            "num_attention_heads": 16,
            "num_key_value_heads": 4,
            "vocab_size": 32000,
            "max_position_embeddings": 2048,
            "sliding_window": None,
        },
        _ids(128),
    )
)
# ESM (a protein encoder, BERT-base sizes, ESM-1b's layer norm before the encoder): its embeddings
# multiply the layer norm's output by the int64 attention mask and cast the product back, so in
# bfloat16 an int64 tensor meets a bfloat16 one inside a norm's fusion. 16 of 128 positions padded.
_register(
    hf_model(
        "esm",
        ("gpu",),
        "EsmModel",
        "EsmConfig",
        {
            "vocab_size": 33,
            "pad_token_id": 1,
            "mask_token_id": 32,
            "hidden_size": 768,
            "num_hidden_layers": 12,
            "num_attention_heads": 12,
            "intermediate_size": 3072,
            "max_position_embeddings": 1026,
            "position_embedding_type": "absolute",
            "emb_layer_norm_before": True,
            "token_dropout": False,
        },
        _protein_ids(128, padded=16),
    )
)

# ---- the wide suite: one model per architecture family the hf suite leaves out ----
# Breadth, not depth: each model is there for an operator pattern or graph shape the hf suite has
# no example of (grouped and depthwise convolutions, windowed and relative-position attention,
# spatial-reduction attention, convolutional speech front ends, alibi and multi-query decoders).
# Sizes: batch 1, float32, text sequences of 128, images at 224x224 (the config's image size),
# audio 1 s at 16 kHz; every config names its sizes, shrunk from the big defaults so that one eager
# forward at 2 threads takes about 10-150 ms. Decoders run without a KV cache; BatchNorms are
# calibrated on the input (see `calibrate_batch_norms`). Dropouts at the checkpoints' values
# (zeroed in training builds); layer drop and SpecAugment, which `_without_dropout` does not see,
# are off.
WIDE = ("wide",)


def _audio(samples: int) -> Callable[[Any], dict[str, torch.Tensor]]:
    # Raw 16 kHz waveform, as wav2vec2-style feature extractors take it.
    return lambda cfg: {"input_values": torch.randn(1, samples, generator=_generator())}


def _whisper_inputs(seq: int) -> Callable[[Any], dict[str, torch.Tensor]]:
    # Log-mel frames (10 ms each, two per encoder position: the encoder takes exactly
    # 2 * max_source_positions of them) and decoder tokens.
    return lambda cfg: {
        "input_features": torch.randn(1, cfg.num_mel_bins, 2 * cfg.max_source_positions, generator=_generator()),
        "decoder_input_ids": token_ids(cfg.vocab_size, seq),
    }


# Grouped and depthwise CNNs. RegNetY-4.0GF: grouped 3x3 convolutions (64 channels a group) with
# squeeze-excitation; MobileNetV2 (depth multiplier 1): inverted residuals, depthwise 3x3 with
# ReLU6; EfficientNet-B0: depthwise 3x3/5x5, SiLU and squeeze-excitation; ConvNeXt V2-tiny:
# depthwise 7x7 with global response norm (LayerNorms, no BatchNorm); ResNet-18: basic blocks,
# plain 3x3 convolutions, where resnet50 has bottlenecks.
_register(hf_model("regnet", WIDE, "RegNetModel", "RegNetConfig",
                   {"embedding_size": 32, "hidden_sizes": [128, 192, 512, 1088], "depths": [2, 6, 12, 2],
                    "groups_width": 64, "layer_type": "y"},
                   _pixels(224), calibrate_batch_norms))
_register(hf_model("mobilenetv2", WIDE, "MobileNetV2Model", "MobileNetV2Config",
                   {"image_size": 224, "depth_multiplier": 1.0, "expand_ratio": 6.0, "output_stride": 32},
                   _config_pixels, calibrate_batch_norms))
_register(hf_model("efficientnet", WIDE, "EfficientNetModel", "EfficientNetConfig",
                   {"image_size": 224, "width_coefficient": 1.0, "depth_coefficient": 1.0, "hidden_dim": 1280,
                    "dropout_rate": 0.2},
                   _config_pixels, calibrate_batch_norms))
_register(hf_model("convnextv2", WIDE, "ConvNextV2Model", "ConvNextV2Config",
                   {"image_size": 224, "patch_size": 4, "hidden_sizes": [96, 192, 384, 768], "depths": [3, 3, 9, 3]},
                   _config_pixels))
_register(hf_model("resnet18", WIDE, "ResNetModel", "ResNetConfig",
                   {"embedding_size": 64, "hidden_sizes": [64, 128, 256, 512], "depths": [2, 2, 2, 2],
                    "layer_type": "basic"},
                   _pixels(224), calibrate_batch_norms))
# Windowed attention: Swin-tiny (V1: pre-norm blocks, dot-product attention in shifted 7x7
# windows with a learned relative position bias table, patch merging), 224x224; swinv2 in the hf
# suite has V2's post-norm, cosine attention and MLP-made position bias instead.
_register(hf_model("swin", WIDE, "SwinModel", "SwinConfig",
                   {"image_size": 224, "patch_size": 4, "embed_dim": 96, "depths": [2, 2, 6, 2],
                    "num_heads": [3, 6, 12, 24], "window_size": 7, "mlp_ratio": 4.0},
                   _config_pixels))
# Small vision transformers. DeiT-small (a distillation token beside the class token); BEiT at
# DeiT-small sizes with a relative position bias in every layer and layer scale; DINOv2-small
# (14x14 patches, 257 tokens, layer scale); LeViT-128S (BatchNorm'd linears, attention biases,
# subsampling attention, hardswish); PVT-tiny (V1: spatial-reduction attention over strided
# patches); SegFormer MiT-b0 (overlapping patch embeddings, spatial reduction, depthwise conv in the
# MLP); CvT-13 (depthwise-conv + BatchNorm projections of queries, keys and values).
_VIT_SMALL = {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6, "intermediate_size": 1536,
              "image_size": 224, "patch_size": 16}
_register(hf_model("deit", WIDE, "DeiTModel", "DeiTConfig", _VIT_SMALL, _config_pixels))
_register(hf_model("beit", WIDE, "BeitModel", "BeitConfig",
                   {**_VIT_SMALL, "use_relative_position_bias": True, "use_absolute_position_embeddings": False,
                    "use_mean_pooling": True, "layer_scale_init_value": 0.1},
                   _config_pixels))
_register(hf_model("dinov2", WIDE, "Dinov2Model", "Dinov2Config",
                   {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6, "mlp_ratio": 4,
                    "image_size": 224, "patch_size": 14},
                   _config_pixels))
_register(hf_model("levit", WIDE, "LevitModel", "LevitConfig",
                   {"image_size": 224, "patch_size": 16, "hidden_sizes": [128, 256, 384],
                    "num_attention_heads": [4, 6, 8], "depths": [2, 3, 4], "key_dim": [16, 16, 16],
                    "mlp_ratio": [2, 2, 2], "attention_ratio": [2, 2, 2],
                    "down_ops": [["Subsample", 16, 8, 4, 2, 2], ["Subsample", 16, 16, 4, 2, 2]]},
                   _config_pixels, calibrate_batch_norms))
_register(hf_model("pvt", WIDE, "PvtModel", "PvtConfig",
                   {"image_size": 224, "hidden_sizes": [64, 128, 320, 512], "depths": [2, 2, 2, 2],
                    "num_attention_heads": [1, 2, 5, 8], "sequence_reduction_ratios": [8, 4, 2, 1],
                    "mlp_ratios": [8, 8, 4, 4], "patch_sizes": [4, 2, 2, 2], "strides": [4, 2, 2, 2]},
                   _config_pixels))
_register(hf_model("segformer", WIDE, "SegformerModel", "SegformerConfig",
                   {"hidden_sizes": [32, 64, 160, 256], "depths": [2, 2, 2, 2], "num_attention_heads": [1, 2, 5, 8],
                    "sr_ratios": [8, 4, 2, 1], "mlp_ratios": [4, 4, 4, 4], "patch_sizes": [7, 3, 3, 3],
                    "strides": [4, 2, 2, 2]},
                   _pixels(224)))
_register(hf_model("cvt", WIDE, "CvtModel", "CvtConfig",
                   {"embed_dim": [64, 192, 384], "num_heads": [1, 3, 6], "depth": [1, 2, 10],
                    "patch_sizes": [7, 3, 3], "patch_stride": [4, 2, 2], "mlp_ratio": [4.0, 4.0, 4.0],
                    "drop_path_rate": [0.0, 0.0, 0.0]},  # a list, which `_without_dropout` would miss
                   _pixels(224), calibrate_batch_norms))
# Text encoders whose attention is not BERT's: DeBERTa (disentangled content/position attention,
# c2p and p2c, relative positions up to 512); DeBERTa-v3-xsmall (hidden 384, 12 layers;
# log-bucketed relative positions, shared position keys); RoFormer (rotary positions); MPNet
# (T5-style bucketed relative bias); ConvBERT (span-based dynamic convolution heads beside
# self-attention); ELECTRA-small (a 128-wide embedding projected to 256, 12 layers); ALBERT-base
# widths (one layer's weights shared by every layer, factorized 128-wide embeddings). The hidden-768
# encoders have 6 layers, not 12: at 12, BERT-base takes ~165 ms at 2 threads.
_ENCODER = {"hidden_size": 768, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 3072,
            "max_position_embeddings": 512}
_register(hf_model("deberta", WIDE, "DebertaModel", "DebertaConfig",
                   {**_ENCODER, "vocab_size": 50265, "relative_attention": True, "pos_att_type": ["c2p", "p2c"],
                    "max_relative_positions": -1, "position_biased_input": False},
                   _ids(128)))
_register(hf_model("debertav2", WIDE, "DebertaV2Model", "DebertaV2Config",
                   {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6, "intermediate_size": 1536,
                    "max_position_embeddings": 512, "vocab_size": 128100, "relative_attention": True,
                    "pos_att_type": ["p2c", "c2p"], "max_relative_positions": -1, "position_buckets": 256,
                    "norm_rel_ebd": "layer_norm", "share_att_key": True, "position_biased_input": False},
                   _ids(128)))
_register(hf_model("roformer", WIDE, "RoFormerModel", "RoFormerConfig",
                   {**_ENCODER, "vocab_size": 50000, "embedding_size": 768, "max_position_embeddings": 1536},
                   _ids(128)))
_register(hf_model("mpnet", WIDE, "MPNetModel", "MPNetConfig",
                   {**_ENCODER, "vocab_size": 30527, "relative_attention_num_buckets": 32}, _ids(128)))
_register(hf_model("convbert", WIDE, "ConvBertModel", "ConvBertConfig",
                   {**_ENCODER, "vocab_size": 30522, "embedding_size": 768, "head_ratio": 2, "conv_kernel_size": 9,
                    "num_groups": 1},
                   _ids(128)))
_register(hf_model("electra", WIDE, "ElectraModel", "ElectraConfig",
                   {"vocab_size": 30522, "embedding_size": 128, "hidden_size": 256, "num_hidden_layers": 12,
                    "num_attention_heads": 4, "intermediate_size": 1024, "max_position_embeddings": 512},
                   _ids(128)))
_register(hf_model("albert", WIDE, "AlbertModel", "AlbertConfig",
                   {"vocab_size": 30000, "embedding_size": 128, "hidden_size": 768, "num_hidden_layers": 6,
                    "num_attention_heads": 12, "intermediate_size": 3072, "num_hidden_groups": 1,
                    "inner_group_num": 1, "max_position_embeddings": 512},
                   _ids(128)))
# Speech, 1 s of 16 kHz audio. Wav2Vec2-base, HuBERT-base and WavLM-base share a 7-layer strided
# 1-D conv front end (GroupNorm after the first) feeding 49 frames to a 12-layer encoder, with a
# grouped conv (kernel 128, 16 groups, weight norm) as position embedding; WavLM adds gated relative
# position biases. Whisper-base: two 1-D convs over 100 log-mel frames (the encoder's positions
# shrunk from 30 s to 1 s to match), 6+6 layers, 128 decoder tokens.
_SPEECH = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
           "conv_dim": [512] * 7, "conv_stride": [5, 2, 2, 2, 2, 2, 2], "conv_kernel": [10, 3, 3, 3, 3, 2, 2],
           "feat_extract_norm": "group", "num_conv_pos_embeddings": 128, "num_conv_pos_embedding_groups": 16,
           "do_stable_layer_norm": False, "layerdrop": 0.0, "apply_spec_augment": False}
_register(hf_model("wav2vec2", WIDE, "Wav2Vec2Model", "Wav2Vec2Config", _SPEECH, _audio(16000)))
_register(hf_model("hubert", WIDE, "HubertModel", "HubertConfig", _SPEECH, _audio(16000)))
_register(hf_model("wavlm", WIDE, "WavLMModel", "WavLMConfig",
                   {**_SPEECH, "num_buckets": 320, "max_bucket_distance": 800}, _audio(16000)))
_register(hf_model("whisper", WIDE, "WhisperModel", "WhisperConfig",
                   {**no_cache, "vocab_size": 51865, "num_mel_bins": 80, "d_model": 512, "encoder_layers": 6,
                    "decoder_layers": 6, "encoder_attention_heads": 8, "decoder_attention_heads": 8,
                    "encoder_ffn_dim": 2048, "decoder_ffn_dim": 2048, "max_source_positions": 50,
                    "max_target_positions": 448, "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0,
                    "apply_spec_augment": False},
                   _whisper_inputs(128)))
# Sequence to sequence (t5 is in the hf suite): BART at base widths with 3+3 layers (learned
# positions, post-norm) and Marian at opus-mt sizes (6+6 layers, 512 wide, sinusoidal positions),
# encoder and decoder inputs of 128.
_register(hf_model("bart", WIDE, "BartModel", "BartConfig",
                   {**no_cache, "vocab_size": 50265, "d_model": 768, "encoder_layers": 3, "decoder_layers": 3,
                    "encoder_attention_heads": 12, "decoder_attention_heads": 12, "encoder_ffn_dim": 3072,
                    "decoder_ffn_dim": 3072, "max_position_embeddings": 1024, "encoder_layerdrop": 0.0,
                    "decoder_layerdrop": 0.0},
                   _encoder_decoder_ids(128)))
_register(hf_model("marian", WIDE, "MarianModel", "MarianConfig",
                   {**no_cache, "vocab_size": 58101, "decoder_vocab_size": 58101, "d_model": 512,
                    "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 8,
                    "decoder_attention_heads": 8, "encoder_ffn_dim": 2048, "decoder_ffn_dim": 2048,
                    "max_position_embeddings": 512, "pad_token_id": 58100, "decoder_start_token_id": 58100,
                    "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0},
                   _encoder_decoder_ids(128)))
# Decoders with their LM heads, 128 tokens, sized like llama in the hf suite (hidden 512, 4 layers,
# 8 heads; at 128 tokens the LM head of a 50k vocabulary is half the work). GPT-Neo: alternating
# global and local attention, the local window shrunk from 256 to 64 so that it masks something at
# 128 tokens; OPT-125m's layout (ReLU MLP, learned positions offset by 2); BLOOM: alibi biases
# instead of positions, an embedding LayerNorm (vocabulary cut from 250880 to 32000: that head
# alone would be 128M parameters); Qwen2: GQA (8 query heads over 2), biases on q/k/v only,
# rotary, llama's MLP width (vocabulary 32000, not 151936, for the same reason); Phi: parallel
# attention and MLP, rotary on half of each head; GPTBigCode: multi-query attention (one key-value
# head); Falcon (7B's layout): multi-query, parallel attention and MLP, rotary.
_register(hf_model("gptneo", WIDE, "GPTNeoForCausalLM", "GPTNeoConfig",
                   {**no_cache, "vocab_size": 50257, "hidden_size": 512, "intermediate_size": 2048, "num_layers": 4,
                    "attention_types": [[["global", "local"], 2]], "num_heads": 8, "window_size": 64,
                    "max_position_embeddings": 2048},
                   _ids(128)))
_register(hf_model("opt", WIDE, "OPTForCausalLM", "OPTConfig",
                   {**no_cache, "vocab_size": 50272, "hidden_size": 512, "word_embed_proj_dim": 512,
                    "num_hidden_layers": 4, "num_attention_heads": 8, "ffn_dim": 2048,
                    "max_position_embeddings": 2048, "do_layer_norm_before": True, "layerdrop": 0.0},
                   _ids(128)))
_register(hf_model("bloom", WIDE, "BloomForCausalLM", "BloomConfig",
                   {**no_cache, "vocab_size": 32000, "hidden_size": 512, "n_layer": 4, "n_head": 8},
                   _ids(128)))
_register(hf_model("qwen2", WIDE, "Qwen2ForCausalLM", "Qwen2Config",
                   {**no_cache, "vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1376,
                    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
                    "max_position_embeddings": 2048, "tie_word_embeddings": False},
                   _ids(128)))
_register(hf_model("phi", WIDE, "PhiForCausalLM", "PhiConfig",
                   {**no_cache, "vocab_size": 51200, "hidden_size": 512, "intermediate_size": 2048,
                    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8,
                    "max_position_embeddings": 2048,
                    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}},
                   _ids(128)))
_register(hf_model("gptbigcode", WIDE, "GPTBigCodeForCausalLM", "GPTBigCodeConfig",
                   {**no_cache, "vocab_size": 50257, "n_embd": 512, "n_layer": 4, "n_head": 8, "n_inner": 2048,
                    "multi_query": True, "n_positions": 2048},
                   _ids(128)))
_register(hf_model("falcon", WIDE, "FalconForCausalLM", "FalconConfig",
                   {**no_cache, "vocab_size": 65024, "hidden_size": 512, "ffn_hidden_size": 2048,
                    "num_hidden_layers": 4, "num_attention_heads": 8, "multi_query": True, "parallel_attn": True,
                    "new_decoder_architecture": False, "alibi": False, "bias": False,
                    "max_position_embeddings": 2048},
                   _ids(128)))

# ---- the smoke suite: two real models small enough for `make demo` ----
_register(
    hf_model(
        "bert-tiny",
        ("smoke",),
        "BertModel",
        "BertConfig",
        {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 512},
        _ids(64),
    )
)
_register(
    hf_model(
        "resnet-tiny",
        ("smoke",),
        "ResNetModel",
        "ResNetConfig",
        {"embedding_size": 16, "hidden_sizes": [32, 64], "depths": [1, 1], "layer_type": "basic"},
        _pixels(64),
    )
)

# ---- the unit suite: kiln's own harness tests ----
_register(
    ModelSpec(
        name="mlp",
        suites=("unit",),
        description="two-layer MLP (harness tests)",
        build=_build_mlp,
        make_inputs=lambda: {"x": torch.randn(8, 64, generator=_generator())},
    )
)


def workload(*names: str) -> list[tuple[str, nn.Module, dict[str, torch.Tensor]]]:
    """The benchmark's models as `kiln autotune`'s workload (`kiln autotune benchmarks.models:workload
    bert gpt2`; a suite's name stands for its models): (name, inference model, inputs) each."""
    chosen = [m for name in names or ("bert",) for m in (suites().get(name) or chosen_models(None, name))]
    return [(name, MODELS[name].build(False), MODELS[name].make_inputs()) for name in chosen]
