"""What weight-only quantization costs in accuracy: the perplexity of a small Llama trained here, from
a fixed seed, on a fixed synthetic text, in float32 and quantized by `kiln.quantize` (int8, int4 at
several group sizes), eager and compiled by kiln.

A model with random weights predicts every token about equally: its perplexity is the vocabulary's
size whatever its weights, and quantizing them changes nothing measurable. So the model first
learns a text with structure: tokens drawn from a fixed Markov chain (each token followed by one of
four successors with probabilities 0.5, 0.25, 0.15 and 0.1: the best possible perplexity is
exp(entropy) = 3.35). Trained, it is confident where the text is, and a quantization error shows
as a rise in perplexity on held-out text from the same chain.

    python -m benchmarks.perplexity            # the table (about a minute on 2 cores)
"""

from __future__ import annotations

import copy
import math

import torch

SUCCESSOR_PROBS = (0.5, 0.25, 0.15, 0.1)
VOCAB = 64
BEST_PERPLEXITY = math.exp(-sum(p * math.log(p) for p in SUCCESSOR_PROBS))


def markov_text(tokens: int, seed: int) -> torch.Tensor:
    """`tokens` tokens [tokens] of the fixed chain (the chain from seed 0; the walk from `seed`)."""
    chain = torch.Generator().manual_seed(0)
    successors = torch.stack([torch.randperm(VOCAB, generator=chain)[:len(SUCCESSOR_PROBS)] for _ in range(VOCAB)])
    walk = torch.Generator().manual_seed(seed)
    picks = torch.multinomial(torch.tensor(SUCCESSOR_PROBS), tokens, replacement=True, generator=walk)
    out = torch.empty(tokens, dtype=torch.long)
    out[0] = 0
    for i in range(1, tokens):
        out[i] = successors[out[i - 1], picks[i]]
    return out


def trained_llama(steps: int = 200, seed: int = 0) -> torch.nn.Module:
    """A 2-layer Llama (hidden 128) trained `steps` steps on the chain's text, from seed `seed`."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(config)
    text = markov_text(steps * 16 * 64 // 4, seed=seed + 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    windows = text.unfold(0, 64, 16)
    order = torch.randperm(windows.shape[0], generator=torch.Generator().manual_seed(seed))
    for step in range(steps):
        batch = windows[order[(step * 16) % len(order):][:16]]
        loss = model(batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def perplexity(forward, tokens: torch.Tensor, window: int = 64) -> float:
    """exp(- mean log-likelihood of each next token) over `tokens`, in windows of `window`."""
    batch = tokens[: tokens.numel() // window * window].view(-1, window)
    with torch.no_grad():
        logits = forward(batch).logits
    logp = torch.log_softmax(logits[:, :-1].double(), -1).gather(-1, batch[:, 1:, None])
    return math.exp(-logp.mean().item())


KINDS = (("int8", None, "float32"), ("int4", 32, "float32"), ("int4", 64, "float32"), ("int4", 128, "float32"),
         ("int4", 32, "int8"), ("int4", 128, "int8"))


def compare(steps: int = 200, held_out_tokens: int = 4096, kinds=KINDS) -> dict:
    """{"float32": perplexity, "int8": ..., "int4 g32": ..., "int4 g128 a8": ...} of eager and
    kiln-compiled models (a8: int8 activations)."""
    import kiln

    model = trained_llama(steps)
    text = markov_text(held_out_tokens, seed=1000)
    results = {"float32": {"eager": perplexity(model, text)}}
    for dtype, group, activations in kinds:
        quantized = kiln.quantize(copy.deepcopy(model), dtype, group_size=group, activations=activations)
        name = (dtype if group is None else f"{dtype} g{group}") + (" a8" if activations == "int8" else "")
        compiled = kiln.compile(quantized)
        results[name] = {"eager": perplexity(quantized, text), "kiln": perplexity(compiled, text)}
    return results


def main() -> None:
    results = compare()
    base = results["float32"]["eager"]
    print(f"best possible perplexity {BEST_PERPLEXITY:.3f}; uniform {VOCAB}")
    print("| weights | perplexity, eager | kiln | eager / float32 |")
    print("|---|---|---|---|")
    for name, row in results.items():
        print(f"| {name} | {row['eager']:.4f} | {row.get('kiln', float('nan')):.4f} | {row['eager'] / base:.4f} |")


if __name__ == "__main__":
    main()
