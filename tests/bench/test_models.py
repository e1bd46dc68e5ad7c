"""The model registry: suites, and every model builds and runs as the benchmark will run it."""

import pytest
import torch
from torch import nn

from benchmarks.accuracy import flatten_tensors
from benchmarks.models import MODELS, suites

HF = ["bert", "gpt2", "t5", "distilbert", "vit", "resnet50", "llama", "convnext", "mobilenetv1", "mobilevit", "swinv2"]
GPU = ["bert", "gpt2", "resnet50", "mistral", "esm"]
WIDE = [
    "regnet", "mobilenetv2", "efficientnet", "convnextv2", "resnet18",  # grouped and depthwise CNNs
    "swin",  # windowed attention
    "deit", "beit", "dinov2", "levit", "pvt", "segformer", "cvt",  # small vision transformers
    "deberta", "debertav2", "roformer", "mpnet", "convbert", "electra", "albert",  # encoders
    "wav2vec2", "hubert", "wavlm", "whisper",  # speech
    "bart", "marian",  # sequence to sequence
    "gptneo", "opt", "bloom", "qwen2", "phi", "gptbigcode", "falcon",  # decoders
]


def test_suites():
    assert suites()["hf"] == HF
    assert suites()["gpu"] == GPU
    assert suites()["wide"] == WIDE and not set(WIDE) & set(HF)
    assert suites()["smoke"] == ["bert-tiny", "resnet-tiny"]
    assert suites()["unit"] == ["mlp"]


def test_inputs_are_deterministic():
    for name in ("bert-tiny", "resnet-tiny", "mlp", "wav2vec2", "whisper"):
        a, b = MODELS[name].make_inputs(), MODELS[name].make_inputs()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _dropouts(model: nn.Module) -> list[float]:
    probs = [m.p for m in model.modules() if isinstance(m, nn.Dropout)]
    config = getattr(model, "config", None)
    if config is not None:
        probs += [v for k, v in config.to_dict().items() if isinstance(v, float) and "drop" in k]
    return probs


@pytest.mark.parametrize("name", ["bert-tiny", "resnet-tiny", "mlp"])
def test_weights_are_seeded(name):
    a, b = MODELS[name].build(False), MODELS[name].build(False)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_the_gpu_suites_encoder_takes_an_int64_attention_mask_with_padding():
    inputs = MODELS["esm"].make_inputs()
    mask, ids = inputs["attention_mask"], inputs["input_ids"]
    assert mask.dtype == torch.int64 and mask.shape == ids.shape == (1, 128)
    assert mask[0, :112].all() and not mask[0, 112:].any() and (ids[0, 112:] == 1).all()  # 16 pads
    assert ((ids[0, :112] >= 4) & (ids[0, :112] < 24)).all()  # amino acids, never ESM's mask token


@pytest.mark.parametrize("name", HF + WIDE + ["mistral", "esm", "bert-tiny", "resnet-tiny", "mlp"])
def test_model_builds_and_runs(name):
    spec = MODELS[name]
    model = spec.build(False)
    assert not model.training
    with torch.no_grad():
        outputs = flatten_tensors(model(**spec.make_inputs()))
    assert outputs and all(torch.isfinite(t).all() for t in outputs if t.is_floating_point())
    # A random deep net without normalization can shrink its activations to denormals (HF's init left
    # MobileNetV1 at 1e-27, MobileViT at 1e-40): timing and accuracy would be about denormal arithmetic.
    assert all(t.abs().max() > 1e-3 for t in outputs if t.is_floating_point())


@pytest.mark.parametrize("name", ["bert", "gpt2", "t5", "distilbert", "bert-tiny", "deberta", "wav2vec2"])
def test_training_builds_have_no_dropout(name):
    # Eager and compiled training steps must see the same masks: none.
    model = MODELS[name].build(True)
    assert model.training
    assert _dropouts(model) and all(p == 0.0 for p in _dropouts(model))
    assert any(p > 0 for p in _dropouts(MODELS[name].build(False)))  # inference keeps the config



@pytest.mark.parametrize("name", ["wav2vec2", "hubert", "wavlm", "whisper", "bart", "marian", "opt"])
def test_training_builds_drop_no_layers_and_mask_no_frames(name):
    # Layer drop and SpecAugment are random in train() like dropout, but `_without_dropout` cannot see
    # them by name: their configs turn them off.
    config = MODELS[name].build(True).config.to_dict()
    assert all(v == 0.0 for k, v in config.items() if k.endswith("layerdrop"))
    assert config.get("apply_spec_augment", False) is False
