"""The accuracy issue 54 asks of weight-only quantization, on a small Llama trained from a fixed
seed on a fixed text (benchmarks/perplexity.py): perplexity of int8 within 1 % of float32's and of
int4 (groups of 128, the coarsest offered by default; with int8 activations too) within 5 %, eager
and kiln alike."""

import copy

import kiln
from benchmarks.perplexity import VOCAB, markov_text, perplexity, trained_llama
from tests.kiln_backend import private_cache  # noqa: F401  (fixture)


def test_quantized_perplexity_stays_within_the_bounds(private_cache):
    model = trained_llama(steps=50)
    text = markov_text(2048, seed=1000)
    base = perplexity(model, text)
    assert base < VOCAB / 8  # it learned the chain: a random model scores about VOCAB
    for dtype, group, bound, activations in [("int8", None, 0.01, "float32"), ("int4", 128, 0.05, "float32"),
                                             ("int4", 128, 0.05, "int8")]:
        quantized = kiln.quantize(copy.deepcopy(model), dtype, group_size=group, activations=activations)
        eager = perplexity(quantized, text)
        assert abs(eager / base - 1) <= bound, (dtype, eager, base)
        assert eager != base  # the weights really are quantized
        compiled = perplexity(kiln.compile(quantized), text)
        assert abs(compiled / eager - 1) <= 1e-4, (compiled, eager)
