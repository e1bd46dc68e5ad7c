"""Text generation: `model.generate()` of HuggingFace decoders with their forward compiled by kiln,
through both doors, greedy, 64 new tokens. The prefill and the decode step are compiled once each
(the growing cache length symbolic, not a recompile per token): a bounded number of graphs, the
tokens eager's. Tiny models from configs, fp32."""

import pytest
import torch
import transformers

import kiln
from kiln.backend import kiln as kiln_backend
from kiln.backend.driver import watch
from kiln.runtime import fallback
# Fixtures: kiln's kernels wherever offered; an empty cache per test (builds are counted).
from tests.kiln_backend import kiln_wherever_offered, private_cache  # noqa: F401

NEW_TOKENS = 64


def _decoder(arch: str) -> torch.nn.Module:
    torch.manual_seed(0)
    small = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256)
    if arch == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**small)).eval()
    if arch == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**small)).eval()
    if arch == "mistral":
        return transformers.MistralForCausalLM(transformers.MistralConfig(**small, sliding_window=None)).eval()
    config = transformers.GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=256)
    return transformers.GPT2LMHeadModel(config).eval()


def _counting_backend():
    """(the graphs it was handed, kiln's backend that keeps them)."""
    captured = []

    def counting(gm, example_inputs):
        captured.append(gm)
        return kiln_backend(gm, example_inputs)

    return captured, counting


CASES = [  # (architecture, KV cache, door)
    ("llama", "dynamic", "kiln"), ("llama", "static", "kiln"), ("llama", "dynamic", "torch.compile"),
    ("gpt2", "dynamic", "kiln"), ("qwen2", "static", "torch.compile"), ("mistral", "dynamic", "kiln"),
]


@pytest.mark.parametrize("arch,cache,door", CASES, ids=["-".join(c) for c in CASES])
def test_generate_compiles_prefill_and_decode_once_and_gives_eagers_tokens(arch, cache, door):
    kiln.reset()
    fallback.reset()
    model = _decoder(arch)
    prompt = torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(1))
    options = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    if cache == "static":
        options["cache_implementation"] = "static"
    with torch.no_grad():
        expected = model.generate(prompt, **options)
    captured, counting = _counting_backend()
    if door == "kiln":
        model.forward = kiln.compile(model.forward, backend=counting)
    else:
        model.forward = torch.compile(model.forward, backend=counting)
    with torch.no_grad(), watch() as built:
        tokens = model.generate(prompt, **options)
    assert torch.equal(tokens, expected)
    assert tokens.shape[1] == 16 + NEW_TOKENS
    # Prefill, the first decode step, and (dynamic cache) the step again once its length is
    # symbolic: never a graph per token. Each compiled once by the backend, sizes symbolic.
    limit = 3 if cache == "dynamic" else 2
    assert len(captured) <= limit and len(built) <= limit, (len(captured), [type(b).__name__ for b in built])
    assert fallback.FALLBACKS == [] and kiln.capture.BREAKS == []


def _forward_entries(compiled) -> int:
    """Entries of the compiled forward `generate` runs (kiln/capture/api.py `ForwardRoute`): not
    `compiled.kiln_cache`, which calls of the module itself fill."""
    return len(compiled.__dict__["_forward_route"].compiled[1].kiln_cache.entries)


def _attention_calls(graph) -> list:
    return [step for step in graph.stages.schedule.externs if "attention" in str(step.op)]


def _left_padded_prompts(model) -> tuple[torch.Tensor, dict]:
    """Three prompts of 16, 11 and 5 tokens padded on the left (pad id 0, set on `model`), and the
    `generate` options with their attention mask."""
    prompts = torch.randint(1, 1000, (3, 16), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 16, dtype=torch.long)
    mask[1, :5] = 0
    mask[2, :11] = 0
    prompts[mask == 0] = 0
    model.generation_config.pad_token_id = 0
    return prompts, dict(attention_mask=mask)


def _static_llama_and_eagers_tokens(new_tokens: int, batch: int = 1):
    """(a tiny Llama, a prompt (batch 3: _left_padded_prompts), greedy static-cache options for
    `new_tokens`, eager's tokens)."""
    model = _decoder("llama")
    options = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, cache_implementation="static")
    if batch == 1:
        prompt = torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(1))
    else:
        prompt, mask = _left_padded_prompts(model)
        options.update(mask)
    with torch.no_grad():
        expected = model.generate(prompt, **options)
    return model, prompt, options, expected


BATCHED = [("llama", "dynamic", "kiln.compile(model)"), ("qwen2", "static", "torch.compile"),
           ("gpt2", "static", "forward")]


@pytest.mark.parametrize("arch,cache,door", BATCHED, ids=["-".join(c) for c in BATCHED])
def test_a_batch_of_left_padded_prompts_gives_eagers_tokens(arch, cache, door):
    """Three prompts of 16, 11 and 5 tokens, padded on the left with their attention mask, greedy,
    through kiln's door on the model (its own decoding loop), on the forward, and Dynamo's: every
    row's tokens eager's, no fallback or graph break."""
    kiln.reset()
    fallback.reset()
    model = _decoder(arch)
    prompts, options = _left_padded_prompts(model)
    options.update(max_new_tokens=24, min_new_tokens=24, do_sample=False)
    if cache == "static":
        options["cache_implementation"] = "static"
    with torch.no_grad():
        expected = model.generate(prompts, **options)
    if door == "kiln.compile(model)":
        generator = kiln.compile(model)
    else:
        model.forward = (kiln.compile(model.forward) if door == "forward"
                         else torch.compile(model.forward, backend="kiln"))
        generator = model
    with torch.no_grad(), watch() as built:
        tokens = generator.generate(prompts, **options)
    assert tokens.shape == (3, 16 + 24) and torch.equal(tokens, expected)
    assert 2 <= len(built) <= 3  # the prompt's graph and the step's (the dynamic cache: once symbolic)
    assert fallback.FALLBACKS == [] and kiln.capture.BREAKS == []


@pytest.mark.parametrize("batch", [1, 3])
def test_the_static_cache_is_written_in_place_by_the_decode_step(batch):
    """Each layer's keys and values are written where they lie (docs/generation.md): the decode
    graph's memory plan writes its new cache values over the cache inputs, so no token copies a
    cache; at batch 3 too (left-padded prompts)."""
    kiln.reset()
    model, prompt, options, expected = _static_llama_and_eagers_tokens(8, batch)
    model.forward = kiln.compile(model.forward)
    with torch.no_grad(), watch() as built:
        assert torch.equal(model.generate(prompt, **options), expected)
    prefill, decode = [getattr(b, "runtime", b) for b in built]
    inputs = {b.name for b in decode.stages.program.inputs if b is not None}
    written_over = [name for name in decode.stages.schedule.memory.inplace.values() if name in inputs]
    mutated = set(decode.stages.program.written_back.values())  # each layer's keys, values (and position)
    assert len(mutated) >= 2 * 2 and set(written_over) == mutated


def test_generate_with_other_lengths_reuses_its_graphs(kiln_wherever_offered):
    """A static cache of another length each call (another `max_new_tokens`) and other prompt
    lengths: the prompt's and the step's graphs are made symbolic in the lengths once and serve
    every later call, eager's tokens each time. (HF sets `_previous_max_cache_length` on the model
    for each new length, which no capture reads; and a size is compared with every entry's guards,
    not only the last call's, whose kind — prompt or step — alternates.) Before, each new length
    compiled both graphs again until the recompile limit, then ran eagerly."""
    kiln.reset()
    fallback.reset()
    model = _decoder("llama")
    compiled = kiln.compile(_decoder("llama"))  # the same weights (seeded)
    runs = [(8, 16), (12, 16), (20, 16), (6, 24), (10, 9), (16, 40)]  # (new tokens, prompt length)
    with torch.no_grad(), watch() as built:
        for new_tokens, length in runs:
            prompt = torch.randint(0, 1000, (1, length), generator=torch.Generator().manual_seed(length))
            options = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                           cache_implementation="static")
            expected = model.generate(prompt, **options)
            assert torch.equal(compiled.generate(prompt, **options), expected), (new_tokens, length)
    assert len(built) <= 4, [type(b).__name__ for b in built]
    assert 2 <= _forward_entries(compiled) <= 4
    graphs = [getattr(b, "runtime", b) for b in built]
    assert all(g.artifact.cpp_wrapper is not None for g in graphs)
    # The step's graph for every cache length (its keys' length symbolic) still gives its
    # grouped-query attention to kiln's kernel, over the cache's two key heads as they lie.
    step = next(g for g in reversed(graphs) if any(s.args[0].layout.size[2] == 2 for s in _attention_calls(g)))
    for call in _attention_calls(step):
        assert str(call.op) == "kiln.attention.default" and not call.args[1].layout.size[2].is_Integer


def test_an_environment_variable_set_between_generates_compiles_nothing_again(monkeypatch):
    """transformers' SDPA attention reads TRANSFORMERS_SDPA_FORCE_GQA from `os.environ` each
    forward. The guard is on that name, not on the names of all variables: a variable set after
    the first `generate` (Inductor compiling another model in the process did; a tokenizer sets
    TOKENIZERS_PARALLELISM) recompiled the prompt's and the step's graphs, 4 s of a Qwen2-0.5B
    `generate` (kiln/capture/variables/environ.py)."""
    kiln.reset()
    fallback.reset()
    model, prompt, options, expected = _static_llama_and_eagers_tokens(6)
    compiled = kiln.compile(_decoder("llama"))  # the same weights (seeded)
    monkeypatch.delenv("KILN_TEST_SET_LATER", raising=False)
    with torch.no_grad(), watch() as built:
        assert torch.equal(compiled.generate(prompt, **options), expected)
        entries = _forward_entries(compiled)
        monkeypatch.setenv("KILN_TEST_SET_LATER", "1")
        assert torch.equal(compiled.generate(prompt, **options), expected)
    assert _forward_entries(compiled) == entries == 2 and len(built) == 2
    assert fallback.FALLBACKS == [] and kiln.capture.BREAKS == []


def test_a_decode_step_with_an_input_it_never_reads_runs_through_the_cpp_wrapper():
    """A one-token `generate` (the prompt alone), then a longer one: the step's graph, compiled
    second, has an input its passes left unread, which the C++ wrapper's call leaves out; it ran
    kiln's Python wrapper before (~280 layout checks a step: llama-160m int4 4.1-4.6 -> 2.7-2.9 ms a token)."""
    kiln.reset()
    fallback.reset()
    model, prompt, options, expected = _static_llama_and_eagers_tokens(5)
    compiled = kiln.compile(_decoder("llama"))  # the same weights (seeded)
    with torch.no_grad(), watch() as built:
        compiled.generate(prompt, **{**options, "max_new_tokens": 1, "min_new_tokens": 1})
        assert torch.equal(compiled.generate(prompt, **options), expected)
    graphs = [getattr(b, "runtime", b) for b in built]
    assert any(g.artifact.unused_inputs for g in graphs)  # the case this test is about
    assert all(g.artifact.cpp_wrapper is not None for g in graphs)
    assert fallback.FALLBACKS == []
    assert fallback.FALLBACKS == [] and kiln.capture.BREAKS == []


def test_generate_of_the_compiled_model_runs_its_forward_compiled():
    """`model = kiln.compile(model); model.generate(...)`, as a newcomer writes it: HF's loop calls
    the original module, whose forward is kiln's for the call's duration (kiln/capture/api.py
    `ForwardRoute`), so the steps run compiled — not eagerly without a word."""
    kiln.reset()
    fallback.reset()
    model, prompt, options, expected = _static_llama_and_eagers_tokens(16)
    captured, counting = _counting_backend()
    compiled = kiln.compile(model, backend=counting)
    with torch.no_grad(), watch() as built:
        assert torch.equal(compiled.generate(prompt, **options), expected)
    assert 1 <= len(captured) <= 2 and 1 <= len(built) <= 2  # the prefill and the decode step
    assert "forward" not in model.__dict__ and fallback.FALLBACKS == []
    assert "create_masks_for_generate" not in model.__dict__


def _masks_made(monkeypatch) -> list:
    """The calls of HuggingFace's `create_masks_for_generate` by `prepare_inputs_for_generation`, counted."""
    import transformers.generation.utils as generation

    calls, made = [], generation.create_masks_for_generate

    def counted(*args, **kwargs):
        calls.append(1)
        return made(*args, **kwargs)

    monkeypatch.setattr(generation, "create_masks_for_generate", counted)
    return calls


def test_the_compiled_generate_leaves_the_static_caches_masks_to_the_forward(monkeypatch):
    """With a static cache HF builds each step's 4D mask in eager Python before the forward; through
    `kiln.compile(model).generate()` the 2D mask goes to the compiled forward, which builds the same
    masks in its graph (the same tokens; none made outside). A class with masks of its own keeps them."""
    kiln.reset()
    model, prompt, options, expected = _static_llama_and_eagers_tokens(12)
    made = _masks_made(monkeypatch)
    with torch.no_grad():
        assert torch.equal(kiln.compile(model).generate(prompt, **options), expected)
        assert made == [] and "create_masks_for_generate" not in model.__dict__
        assert torch.equal(model.generate(prompt, **options), expected) and len(made) == 12  # eager: one a step

    class OwnMasks(transformers.LlamaForCausalLM):
        def create_masks_for_generate(self, **kwargs):
            made.append("own")
            return transformers.masking_utils.create_masks_for_generate(**kwargs)

    own = OwnMasks(model.config).eval()
    own.load_state_dict(model.state_dict())
    made.clear()
    with torch.no_grad():
        assert torch.equal(kiln.compile(own).generate(prompt, **options), expected)
    assert made.count("own") == 12


def test_the_compiled_generate_turns_off_hfs_own_torch_compile(monkeypatch):
    """HF wraps a static-cache forward in torch.compile on a GPU (or with `_compile_all_devices`):
    through `kiln.compile(model).generate()` that would trace Dynamo through kiln's compiled forward.
    kiln compiles the forward, so HF's compilation stays off for the call (eager's tokens); HF's own
    generate still asks for it (the spy answers with the plain call)."""
    kiln.reset()
    model, prompt, options, expected = _static_llama_and_eagers_tokens(6)
    asked = []

    def spy(compile_config):
        asked.append(compile_config)
        return model.__call__

    monkeypatch.setattr(model, "get_compiled_call", spy)
    config = transformers.CompileConfig()
    config._compile_all_devices = True
    with torch.no_grad():
        assert torch.equal(kiln.compile(model).generate(prompt, compile_config=config, **options), expected)
        assert asked == [] and "_valid_auto_compile_criteria" not in model.__dict__
        assert torch.equal(model.generate(prompt, compile_config=config, **options), expected) and asked


def _sliding_window_mistral() -> torch.nn.Module:
    """A tiny Mistral whose layers attend over a window of 8 positions."""
    torch.manual_seed(0)
    config = transformers.MistralConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                        sliding_window=8)
    return transformers.MistralForCausalLM(config).eval()


def test_a_sliding_window_models_masks_stay_hfs():
    """A sliding-window layer's mask reads the cache's position as a Python int: built in the graph
    it would be specialized on, a recompile per token up to the limit. Such a model keeps HF's masks:
    a bounded number of graphs for 24 tokens, no fallback, eager's tokens."""
    kiln.reset()
    fallback.reset()
    model = _sliding_window_mistral()
    prompt = torch.randint(0, 1000, (1, 12), generator=torch.Generator().manual_seed(1))
    options = dict(max_new_tokens=24, min_new_tokens=24, do_sample=False, cache_implementation="static")
    with torch.no_grad():
        expected = model.generate(prompt, **options)
        captured, counting = _counting_backend()
        assert torch.equal(kiln.compile(model, backend=counting).generate(prompt, **options), expected)
    assert 1 <= len(captured) <= 3 and fallback.FALLBACKS == []


@pytest.mark.parametrize("arch,batch", [("llama", 1), ("gpt2", 1), ("llama", 3)])
def test_the_dynamic_cache_is_appended_in_place_through_kilns_door(arch, batch):
    """Through `kiln.compile(model).generate()`, the dynamic cache HF makes appends each token's
    keys and values in place (kiln/capture/hf_kv_cache.py): each layer's keys and values are views
    of a room that the decode step writes one row into, where a DynamicLayer's `torch.cat` copies
    the whole cache. Eager's tokens, at most three graphs, the rooms written where they lie; at
    batch 3 too (left-padded prompts)."""
    from kiln.capture.hf_kv_cache import GrowingLayer

    kiln.reset()
    fallback.reset()
    model = _decoder(arch)
    compiled = kiln.compile(_decoder(arch))  # the same weights (seeded)
    options = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True)
    if batch == 1:
        prompt = torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(1))
    else:
        prompt, mask = _left_padded_prompts(model)
        compiled.generation_config.pad_token_id = 0
        options.update(mask)
    with torch.no_grad():
        expected = model.generate(prompt, **options)
        with watch() as built:
            out = compiled.generate(prompt, **options)
    assert torch.equal(out.sequences, expected.sequences)
    for layer, eager_layer in zip(out.past_key_values.layers, expected.past_key_values.layers):
        assert type(layer) is GrowingLayer
        assert layer.keys.untyped_storage().data_ptr() == layer.key_room.untyped_storage().data_ptr()
        torch.testing.assert_close(layer.keys, eager_layer.keys)
        torch.testing.assert_close(layer.values, eager_layer.values)
    graphs = [getattr(b, "runtime", b) for b in built]
    assert len(graphs) <= 3
    decode = graphs[-1]
    inputs = {b.name for b in decode.stages.program.inputs if b is not None}
    written_over = {name for name in decode.stages.schedule.memory.inplace.values() if name in inputs}
    rooms = set(decode.stages.program.written_back.values())
    assert len(rooms) == 2 * 2 and written_over == rooms
    assert fallback.FALLBACKS == [] and kiln.capture.BREAKS == []


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_growing_caches_decode_step_runs_kilns_attention_at_every_length(arch, kiln_wherever_offered):
    """The decode step's one graph for every cache length (the keys' length symbolic) gives its
    attention to kiln's kernel, which a symbolic size kept from it before (ATen's took ~5x as long
    a layer at llama-160m's shapes); Llama's grouped queries (SDPA's `enable_gqa`, no mask) over
    the key heads as they are, their queries as rows. Eager's tokens."""
    kiln.reset()
    fallback.reset()
    model = _decoder(arch)
    compiled = kiln.compile(_decoder(arch))  # the same weights (seeded)
    prompt = torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(1))
    options = dict(max_new_tokens=24, min_new_tokens=24, do_sample=False)
    with torch.no_grad():
        expected = model.generate(prompt, **options)
        with watch() as built:
            assert torch.equal(compiled.generate(prompt, **options), expected)
    calls = _attention_calls(getattr(built[-1], "runtime", built[-1]))
    assert [str(step.op) for step in calls] == ["kiln.attention.default"] * 2
    for step in calls:
        (b, heads, rows, d), keys = step.args[0].layout.size, step.args[1].layout.size
        assert (heads, rows) == ((2, 2) if arch == "llama" else (4, 1))  # Llama: 4 query heads over 2
        assert not keys[2].is_Integer  # one graph for every length
    assert fallback.FALLBACKS == [] and kiln.capture.BREAKS == []


def test_a_growing_cache_continues_past_its_room_as_a_dynamic_cache_does():
    """A cache `generate` returned, passed to a second `generate` that runs past its room (the
    room doubles: one copy) and then cropped: eager's tokens and values with HF's DynamicCache."""
    from transformers import DynamicCache

    kiln.reset()
    fallback.reset()
    model = _decoder("llama")
    compiled = kiln.compile(_decoder("llama"))
    prompt = torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(1))
    first = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, return_dict_in_generate=True)
    second = dict(max_new_tokens=40, min_new_tokens=40, do_sample=False, return_dict_in_generate=True)
    with torch.no_grad():
        expected = model.generate(prompt, **first)
        out = compiled.generate(prompt, **first)
        room_rows = out.past_key_values.layers[0].key_room.shape[-2]
        assert room_rows < 16 + 8 + 40  # (the second call runs past it)
        expected = model.generate(expected.sequences, cache=expected.past_key_values, **second)
        out = compiled.generate(out.sequences, cache=out.past_key_values, **second)
        assert torch.equal(out.sequences, expected.sequences)
        assert out.past_key_values.layers[0].key_room.shape[-2] > room_rows
        for cache in (out.past_key_values, expected.past_key_values):
            cache.crop(-5)
        row = torch.randn(1, 2, 1, 16)
        for layer, eager_layer in zip(out.past_key_values.layers, expected.past_key_values.layers):
            torch.testing.assert_close(layer.update(row, row), eager_layer.update(row, row))
    assert isinstance(out.past_key_values, DynamicCache)
    assert fallback.FALLBACKS == [] and kiln.capture.BREAKS == []
