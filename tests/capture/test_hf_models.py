"""Real HuggingFace models, small configs, captured as one graph each and compared with eager.

The full-size `hf` suite runs through `kiln bench --modes kiln-eager` (README); these small
configs exercise the same Python code paths of `transformers` in seconds.
"""

import os

import pytest
import torch

import kiln
from tests.capture.util import assert_same

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
CASES = {
    "bert": ("BertModel", "BertConfig", SMALL, "ids"),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(n_embd=32, n_layer=2, n_head=2, use_cache=False), "ids"),
    "t5": ("T5Model", "T5Config", dict(d_model=32, d_ff=64, num_layers=2, num_heads=2, d_kv=16, use_cache=False), "seq2seq"),
    "distilbert": ("DistilBertModel", "DistilBertConfig", dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64), "ids"),
    "vit": ("ViTModel", "ViTConfig", dict(SMALL, image_size=32, patch_size=8), "pixels"),
    "resnet": ("ResNetModel", "ResNetConfig", dict(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1]), "pixels"),
    "llama": ("LlamaForCausalLM", "LlamaConfig", dict(SMALL, num_key_value_heads=1, vocab_size=128, use_cache=False), "ids"),
    "convnext": ("ConvNextModel", "ConvNextConfig", dict(num_stages=2, hidden_sizes=[8, 16], depths=[1, 1], image_size=32), "pixels"),
    # Speech: a convolutional feature encoder, then a transformer. transformers' helpers call
    # lru_cache-wrapped functions (package metadata): once the whole frame ran eagerly (issue 22).
    "wav2vec2": ("Wav2Vec2Model", "Wav2Vec2Config", dict(SMALL, conv_dim=(16, 16), conv_kernel=(10, 3), conv_stride=(5, 2),
                                                          num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2), "audio"),
}


def _build(name: str):
    model_class, config_class, config, inputs = CASES[name]
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config)).eval()
    g = torch.Generator().manual_seed(1)
    vocab = getattr(model.config, "vocab_size", 100)
    if inputs == "ids":
        kwargs = {"input_ids": torch.randint(0, vocab, (2, 12), generator=g)}
    elif inputs == "seq2seq":
        kwargs = {"input_ids": torch.randint(0, vocab, (2, 12), generator=g), "decoder_input_ids": torch.randint(0, vocab, (2, 7), generator=g)}
    elif inputs == "audio":
        kwargs = {"input_values": torch.randn(2, 800, generator=g)}
    else:
        kwargs = {"pixel_values": torch.randn(2, 3, 32, 32, generator=g)}
    return model, kwargs


@pytest.mark.parametrize("name", list(CASES))
def test_inference_captures_one_graph(name):
    model, kwargs = _build(name)
    compiled = kiln.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        expected = model(**kwargs)
        actual = compiled(**kwargs)
        again = compiled(**kwargs)
    assert_same(actual, expected)
    assert_same(again, expected)
    assert len(compiled.kiln_cache.entries) == 1
    assert compiled.kiln_cache.entries[0].stats["ops"] > 10


def test_bert_training_step_matches_eager():
    model, kwargs = _build("bert")
    model.train()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    compiled = kiln.compile(model, backend="aot_eager", fullgraph=True)
    compiled(**kwargs).last_hidden_state.pow(2).mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    model(**kwargs).last_hidden_state.pow(2).mean().backward()
    for n, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=1e-5)
        elif n in grads:  # unused by the loss (the pooler): the compiled step gives zeros, not None
            assert not grads[n].any(), n
    assert sum(p.grad is not None for p in model.parameters()) > 0
