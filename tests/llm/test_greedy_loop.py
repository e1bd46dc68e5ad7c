"""kiln's greedy decoding loop (kiln/capture/hf_greedy.py): a plain greedy `generate` through
`kiln.compile(model)` runs it in HF's `_sample`'s place, with eager's tokens; HF's own input and
kwarg functions run only on the steps that check kiln's predictions of them; every call the loop
does not cover runs HF's `_sample` unchanged."""

import functools

import pytest
import torch
import transformers

import kiln
from kiln.capture import hf_greedy
from kiln.runtime import fallback
from tests.kiln_backend import private_cache  # noqa: F401 - an empty cache per test
from tests.llm.test_generate import _decoder, _sliding_window_mistral

NEW_TOKENS = 24


def _prompt(batch: int = 1, length: int = 16) -> torch.Tensor:
    return torch.randint(0, 1000, (batch, length), generator=torch.Generator().manual_seed(1))


def _counted(monkeypatch, model: torch.nn.Module) -> dict:
    """Calls of HF's `prepare_inputs_for_generation` and `_sample` (GenerationMixin's own, so that
    classes inheriting them still have HF's) and of kiln's loop, counted."""
    from transformers.generation.utils import GenerationMixin

    counts = {"prepare": 0, "sample": 0, "kiln": 0}
    for owner, name, key in ((GenerationMixin, "prepare_inputs_for_generation", "prepare"),
                             (GenerationMixin, "_sample", "sample"), (hf_greedy, "decoding_loop", "kiln")):
        original = getattr(owner, name)

        @functools.wraps(original)
        def counted(*args, _original=original, _key=key, **kwargs):
            counts[_key] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)
    return counts


CASES = [("llama", "static"), ("llama", "dynamic"), ("qwen2", "static"), ("gpt2", "dynamic"), ("mistral", "dynamic")]


@pytest.mark.parametrize("arch,cache", CASES, ids=["-".join(c) for c in CASES])
def test_a_greedy_generate_runs_kilns_loop_with_eagers_tokens(arch, cache, monkeypatch):
    kiln.reset()
    fallback.reset()
    model = _decoder(arch)
    prompt = _prompt()
    options = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None)
    if cache == "static":
        options["cache_implementation"] = "static"
    with torch.no_grad():
        expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), **options)
        counts = _counted(monkeypatch, model)
        tokens = kiln.compile(model).generate(prompt, attention_mask=torch.ones_like(prompt), **options)
    assert torch.equal(tokens, expected) and tokens.shape == (1, 16 + NEW_TOKENS)
    # kiln's loop instead of `_sample`; HF made the inputs of the first CHECKED_STEPS decode steps
    # (and the prefill's), kiln's predictions the rest.
    assert counts["kiln"] == 1 and counts["sample"] == 0
    assert counts["prepare"] == 1 + hf_greedy.CHECKED_STEPS
    assert fallback.FALLBACKS == [] and kiln.capture.BREAKS == []


def test_end_of_sequence_and_left_padding_give_eagers_tokens(monkeypatch):
    """Two prompts, the first left-padded (HF keeps the 2D mask and grows it), an end-of-sequence
    token the first row produces midway: the finished row is padded, the call ends when both are
    done or at the length limit, as eager's."""
    kiln.reset()
    model = _decoder("llama")
    prompt = _prompt(2, 12)
    mask = torch.ones_like(prompt)
    mask[0, :3] = 0
    options = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=7)
    with torch.no_grad():
        free = model.generate(prompt, attention_mask=mask, eos_token_id=None, **options)
        eos = int(free[0, 12 + 5])  # the first row's sixth new token
        expected = model.generate(prompt, attention_mask=mask, eos_token_id=eos, **options)
        counts = _counted(monkeypatch, model)
        tokens = kiln.compile(model).generate(prompt, attention_mask=mask, eos_token_id=eos, **options)
    assert (expected[0, 12 + 6:] == 7).all()  # the case is the one meant: row 0 finished early
    assert torch.equal(tokens, expected) and counts["kiln"] == 1 and counts["sample"] == 0


def _criteria_calls(monkeypatch) -> dict:
    from transformers.generation import stopping_criteria as criteria

    calls = {"list": 0}
    original = criteria.StoppingCriteriaList.__call__

    def counted(self, *args, **kwargs):
        calls["list"] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(criteria.StoppingCriteriaList, "__call__", counted)
    return calls


@pytest.mark.parametrize("ends", ["one", "two", "both rows"])
def test_end_of_sequence_tokens_are_compared_without_hfs_criteria(ends, monkeypatch):
    """`generate`'s own criteria (a length limit, end-of-sequence ids) are kiln's comparisons of
    the new tokens: HF's list is never called, and the rows end, are padded and stop the call
    where eager's do (one id, a list of two, both rows ending before the limit)."""
    kiln.reset()
    model = _decoder("llama")
    prompt = _prompt(2, 12)
    options = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=7)
    with torch.no_grad():
        free = model.generate(prompt, attention_mask=torch.ones_like(prompt), eos_token_id=None, **options)
        first, second = int(free[0, 12 + 3]), int(free[1, 12 + 9])
        eos = {"one": first, "two": [5, first], "both rows": [first, second]}[ends]
        expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), eos_token_id=eos, **options)
        counts, calls = _counted(monkeypatch, model), _criteria_calls(monkeypatch)
        tokens = kiln.compile(model).generate(prompt, attention_mask=torch.ones_like(prompt), eos_token_id=eos, **options)
    assert (expected[0, 12 + 4:] == 7).all()
    if ends == "both rows":
        assert expected.shape[1] < 12 + NEW_TOKENS  # the call stopped before the limit
    assert torch.equal(tokens, expected) and counts["kiln"] == 1 and counts["sample"] == 0
    assert calls["list"] == 0


def test_a_criterion_of_the_callers_is_called_every_step(monkeypatch):
    from transformers.generation.stopping_criteria import StoppingCriteria, StoppingCriteriaList

    class AfterTokenSum(StoppingCriteria):
        def __init__(self):
            self.calls = 0

        def __call__(self, input_ids, scores, **kwargs):
            self.calls += 1
            return input_ids[:, 12:].sum(-1) > 4000

    kiln.reset()
    model = _decoder("llama")
    prompt = _prompt(1, 12)
    options = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=7, eos_token_id=None)
    with torch.no_grad():
        mine = AfterTokenSum()
        expected = model.generate(prompt, stopping_criteria=StoppingCriteriaList([mine]), **options)
        theirs = AfterTokenSum()
        tokens = kiln.compile(model).generate(prompt, stopping_criteria=StoppingCriteriaList([theirs]), **options)
    assert torch.equal(tokens, expected) and theirs.calls == mine.calls == expected.shape[1] - 12


SAMPLE_STEPS = {
    "top-k sampling": dict(do_sample=True, top_k=20, temperature=0.8),
    "top-p sampling": dict(do_sample=True, top_p=0.9, top_k=0),
    "a processor": dict(do_sample=False, repetition_penalty=1.3),
    "a minimum length": dict(do_sample=False, min_new_tokens=6),
}


@pytest.mark.parametrize("case", list(SAMPLE_STEPS))
def test_sampling_and_processors_run_kilns_loop_with_hfs_tokens(case, monkeypatch):
    """Sampling and logits processors take `_sample`'s own steps inside kiln's loop: with torch's
    generator seeded alike, the same draws and tokens as HF's loop (two rows, an end-of-sequence
    id that ends one of them; the minimum length holds it off for the first tokens)."""
    kiln.reset()
    model = _decoder("llama")
    prompt = _prompt(2, 12)
    options = dict(max_new_tokens=NEW_TOKENS, pad_token_id=7, **SAMPLE_STEPS[case])
    with torch.no_grad():
        torch.manual_seed(5)
        free = model.generate(prompt, attention_mask=torch.ones_like(prompt), eos_token_id=None, **options)
        eos = int(free[0, 12 + 7])  # (past the minimum length)
        torch.manual_seed(5)
        expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), eos_token_id=eos, **options)
        hf_after = torch.rand(4)  # the generator's state after the call: which draws were taken
        counts = _counted(monkeypatch, model)
        torch.manual_seed(5)
        tokens = kiln.compile(model).generate(prompt, attention_mask=torch.ones_like(prompt), eos_token_id=eos, **options)
        kiln_after = torch.rand(4)
    assert (expected[0] == 7).any()  # a row ended early
    assert torch.equal(tokens, expected) and torch.equal(kiln_after, hf_after)
    assert counts["kiln"] == 1 and counts["sample"] == 0


@pytest.mark.parametrize("option", ["min_new_tokens", "min_length"])
def test_a_minimum_length_is_run_only_where_it_holds_the_greedy_token_off(option, monkeypatch):
    """The end-of-sequence id is row 0's third greedy token, under a minimum of six new tokens:
    on that step the processors run (the id at -inf, another token), on the others kiln's
    greedy token is the processors' without them; HF's tokens either way."""
    from transformers.generation import logits_process

    kiln.reset()
    model = _decoder("llama")
    prompt = _prompt(2, 12)
    options = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=7)
    options[option] = 6 if option == "min_new_tokens" else 12 + 6
    with torch.no_grad():
        free = model.generate(prompt, attention_mask=torch.ones_like(prompt), eos_token_id=None, **options)
        eos = int(free[0, 12 + 2])
        expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), eos_token_id=eos, **options)
        calls = {"processor": 0}
        cls = (logits_process.MinNewTokensLengthLogitsProcessor if option == "min_new_tokens"
               else logits_process.MinLengthLogitsProcessor)
        original = cls.__call__

        def counted(self, *args, **kwargs):
            calls["processor"] += 1
            return original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__call__", counted)
        tokens = kiln.compile(model).generate(prompt, attention_mask=torch.ones_like(prompt), eos_token_id=eos, **options)
    assert expected[0, 12 + 2] != eos  # the minimum held it off
    assert torch.equal(tokens, expected)
    assert 1 <= calls["processor"] < 6  # on the steps where the greedy token was held off only


class _Recorder(transformers.generation.BaseStreamer):
    """A streamer that keeps what it is given (a copy of each value) and its end, and writes over
    each step's tokens it was handed (as a streamer may: they must be its own)."""

    def __init__(self) -> None:
        self.seen: list = []

    def put(self, value):
        self.seen.append(value.clone())
        if len(self.seen) > 1:  # (not the prompt: `generate` hands over the caller's own ids)
            value.fill_(-1)

    def end(self):
        self.seen.append("end")


@pytest.mark.parametrize("case", ["one row", "rows ending early"])
def test_a_streamer_gets_eagers_tokens_from_kilns_loop(case, monkeypatch):
    """A streamer through kiln's loop (which `generate` would not hand it: kiln binds it) is given
    what HF's `_sample` gives it, in the same calls: the prompt, each step's tokens as a [batch]
    tensor (a finished row's as padding; its own, written over by the streamer without changing the
    result), then `end()`; greedy search and sampling alike."""
    kiln.reset()
    model = _decoder("llama")
    rows = 1 if case == "one row" else 2
    prompt = _prompt(rows, 12)
    options = dict(max_new_tokens=NEW_TOKENS, pad_token_id=7)
    with torch.no_grad():
        free = model.generate(prompt, attention_mask=torch.ones_like(prompt), eos_token_id=None, do_sample=False, **options)
        eos = None if rows == 1 else int(free[0, 12 + 3])
        for sample in (False, True):
            eager, kilns = _Recorder(), _Recorder()
            torch.manual_seed(5)
            expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), eos_token_id=eos,
                                      do_sample=sample, streamer=eager, **options)
            counts = _counted(monkeypatch, model)
            torch.manual_seed(5)
            tokens = kiln.compile(model).generate(prompt, attention_mask=torch.ones_like(prompt), eos_token_id=eos,
                                                  do_sample=sample, streamer=kilns, **options)
            monkeypatch.undo()
            assert torch.equal(tokens, expected) and counts["kiln"] == 1 and counts["sample"] == 0
            assert len(kilns.seen) == len(eager.seen) == 2 + expected.shape[1] - 12 and kilns.seen[-1] == "end"
            for got, want in zip(kilns.seen[:-1], eager.seen[:-1]):
                assert got.device.type == "cpu" and got.dtype == want.dtype and torch.equal(got, want)
            if rows == 2 and not sample:
                assert (expected[0, 12 + 4:] == 7).all()  # the case is the one meant: row 0 finished early


def test_a_streamer_read_from_another_thread_gets_every_token(monkeypatch):
    """A chat front end's way (TextIteratorStreamer's): `generate` on a thread of its own, the
    tokens read from a queue on the caller's as they come; kiln's loop on that thread."""
    import queue
    import threading

    kiln.reset()
    model = _decoder("llama")
    prompt = _prompt()
    options = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None)

    class Queued(transformers.generation.BaseStreamer):
        def __init__(self) -> None:
            self.queue: queue.Queue = queue.Queue()

        def put(self, value):
            self.queue.put(value.reshape(-1).tolist())

        def end(self):
            self.queue.put(None)

    with torch.no_grad():
        expected = model.generate(prompt, **options)
    compiled, streamer, result = kiln.compile(model), Queued(), {}
    counts = _counted(monkeypatch, model)

    def generate():
        with torch.no_grad():
            result["tokens"] = compiled.generate(prompt, streamer=streamer, **options)

    thread = threading.Thread(target=generate)
    thread.start()
    streamed = []
    while (value := streamer.queue.get(timeout=300)) is not None:
        streamed.append(value)
    thread.join()
    assert torch.equal(result["tokens"], expected)
    assert streamed[0] == prompt[0].tolist() and sum(streamed[1:], []) == expected[0, 16:].tolist()
    assert counts["kiln"] == 1 and counts["sample"] == 0


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_dict_of_sequences_and_cache_comes_from_kilns_loop(cache, monkeypatch):
    """`return_dict_in_generate` alone (the sequences and the cache, to go on from): kiln's loop
    returns `_sample`'s output of them, the cache's keys and values eager's, and a second call
    going on from that cache gives eager's tokens too."""
    kiln.reset()
    model = _decoder("llama")
    prompt = _prompt()
    options = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None)
    if cache == "static":
        options["cache_implementation"] = "static"
    compiled = kiln.compile(model)
    with torch.no_grad():
        expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), return_dict_in_generate=True, **options)
        counts = _counted(monkeypatch, model)
        result = compiled.generate(prompt, attention_mask=torch.ones_like(prompt), return_dict_in_generate=True, **options)
        assert counts["kiln"] == 1 and counts["sample"] == 0
        assert type(result) is type(expected) and torch.equal(result.sequences, expected.sequences)
        assert result.scores is None and result.logits is None and result.attentions is None
        assert type(result.cache) is type(expected.cache) and len(result.cache.layers) == len(expected.cache.layers)
        for ours, eagers in zip(result.cache.layers, expected.cache.layers):
            torch.testing.assert_close(ours.keys, eagers.keys, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(ours.values, eagers.values, rtol=1e-4, atol=1e-4)
        if cache == "dynamic":  # (a static cache's length is fixed at the first call's)
            going_on = dict(max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None)
            longer = expected.sequences
            more = model.generate(longer, attention_mask=torch.ones_like(longer), cache=expected.cache, **going_on)
            ours = compiled.generate(longer, attention_mask=torch.ones_like(longer), cache=result.cache, **going_on)
            assert torch.equal(ours, more) and more.shape[1] == longer.shape[1] + 8
    assert counts["kiln"] == (2 if cache == "dynamic" else 1)


def _word_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A tokenizer of the test models' 1000 ids, each a word "w<id>" (made here: no files), and the
    word HF's stop-string criterion reads its vocabulary against ("abcdef")."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = Tokenizer(models.WordLevel({**{f"w{i}": i for i in range(1000)}, "abcdef": 1000}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=words)


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
def test_stop_strings_are_checked_in_kilns_loop(sample, monkeypatch):
    """Stop strings with their tokenizer (which `generate` would not hand a `custom_generate`,
    nor make their criterion without): kiln binds both to its loop, which checks HF's own
    criterion every step; eager's tokens, the call ending where eager's does."""
    kiln.reset()
    model = _decoder("llama")
    prompt = _prompt()
    tokenizer = _word_tokenizer()
    options = dict(max_new_tokens=NEW_TOKENS, do_sample=sample, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        torch.manual_seed(4)
        free = model.generate(prompt, **options)
        stop = f"w{int(free[0, 16 + 6])}"  # the seventh new token's word
        torch.manual_seed(4)
        expected = model.generate(prompt, stop_strings=[stop], tokenizer=tokenizer, **options)
        counts = _counted(monkeypatch, model)
        torch.manual_seed(4)
        tokens = kiln.compile(model).generate(prompt, stop_strings=[stop], tokenizer=tokenizer, **options)
    assert expected.shape[1] <= 16 + 7 < 16 + NEW_TOKENS  # the case is the one meant: the string stopped it
    assert torch.equal(tokens, expected) and counts["kiln"] == 1 and counts["sample"] == 0


OTHER_LOOPS = {
    "scores": dict(return_dict_in_generate=True, output_scores=True, do_sample=False),
    "beams": dict(num_beams=2),
}


@pytest.mark.parametrize("case", list(OTHER_LOOPS))
def test_a_call_kilns_loop_does_not_cover_runs_hfs_sample(case, monkeypatch):
    kiln.reset()
    model = _decoder("llama")
    prompt = _prompt()
    options = dict(max_new_tokens=8, pad_token_id=0, eos_token_id=None, **OTHER_LOOPS[case])
    with torch.no_grad():
        torch.manual_seed(3)
        expected = model.generate(prompt, **options)
        counts = _counted(monkeypatch, model)
        torch.manual_seed(3)
        result = kiln.compile(model).generate(prompt, **options)
    if case == "scores":
        assert torch.equal(result.sequences, expected.sequences) and len(result.scores) == 8
        assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(result.scores, expected.scores))
    else:
        assert torch.equal(result, expected)
    # HF's loop ran, and made every step's inputs itself.
    assert counts["prepare"] >= 8 if case != "beams" else counts["prepare"] >= 1
    if case != "beams":
        assert counts["kiln"] == 0 and counts["sample"] == 1
    else:
        assert counts["kiln"] == 0


def test_the_setting_turns_kilns_loop_off(monkeypatch):
    kiln.reset()
    model = _decoder("llama")
    prompt = _prompt()
    options = dict(max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        expected = model.generate(prompt, **options)
        counts = _counted(monkeypatch, model)
        with kiln.config.patch({"capture.greedy_loop": False}):
            assert torch.equal(kiln.compile(model).generate(prompt, **options), expected)
    assert counts["kiln"] == 0 and counts["sample"] == 1 and counts["prepare"] == 8


def test_inputs_kiln_cannot_predict_stay_hfs_every_step(monkeypatch):
    """A sliding-window model with a static cache: HF builds each step's masks in
    `prepare_inputs_for_generation` (new tensors every step, not a kwarg's), so the first
    comparison fails and HF's function makes every step's inputs; eager's tokens."""
    kiln.reset()
    model = _sliding_window_mistral()
    prompt = _prompt(1, 12)
    options = dict(max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=None, cache_implementation="static")
    with torch.no_grad():
        expected = model.generate(prompt, **options)
        counts = _counted(monkeypatch, model)
        assert torch.equal(kiln.compile(model).generate(prompt, **options), expected)
    assert counts["kiln"] == 1 and counts["sample"] == 0 and counts["prepare"] == 12


def test_a_class_with_its_own_input_function_keeps_it_every_step(monkeypatch):
    """A class with its own `prepare_inputs_for_generation`: kiln's loop calls it on every step
    (its rule could change after the steps a prediction would be compared on)."""
    kiln.reset()

    class Own(transformers.LlamaForCausalLM):
        def prepare_inputs_for_generation(self, *args, **kwargs):
            return super().prepare_inputs_for_generation(*args, **kwargs)

    base = _decoder("llama")
    model = Own(base.config).eval()
    model.load_state_dict(base.state_dict())
    prompt = _prompt()
    options = dict(max_new_tokens=10, do_sample=False, pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        expected = model.generate(prompt, **options)
        counts = _counted(monkeypatch, model)
        assert torch.equal(kiln.compile(model).generate(prompt, **options), expected)
    assert counts["kiln"] == 1 and counts["prepare"] == 10


def test_greedy_tokens_are_torch_argmax():
    """The extension's two passes against torch.argmax: ties (the first index), NaN (the first
    NaN), infinities, signed zeros, ragged lengths around the 16 lanes, a 3D tensor's last
    position; None (torch.argmax then) for what it does not take."""
    from kiln.native import python_door

    greedy = python_door.module().greedy_tokens
    generator = torch.Generator().manual_seed(0)
    for trial in range(600):
        rows, n = trial % 3 + 1, trial % 70 + 1
        x = torch.randint(-3, 4, (rows, n), generator=generator).float()
        r = torch.rand(rows, n, generator=generator)
        x[r < 0.02] = float("nan")
        x[(r > 0.5) & (r < 0.53)] = float("inf")
        x[(r > 0.6) & (r < 0.63)] = float("-inf")
        x[(r > 0.7) & (r < 0.75)] = -0.0
        if trial % 7 == 0:
            x.fill_(float("-inf"))
        expected = torch.argmax(x, -1)
        assert torch.equal(greedy(x), expected), x
        sequence = torch.zeros(rows, 3, n)
        sequence[:, -1] = x
        assert torch.equal(greedy(sequence), expected)
        assert torch.equal(hf_greedy.greedy_tokens(sequence), expected)
    wide = torch.randn(2, 151936, generator=generator)
    assert torch.equal(greedy(wide), torch.argmax(wide, -1))
    for other in (wide.double(), wide.t(), wide[0], wide[:, :0], wide.requires_grad_()):
        assert greedy(other) is None
    assert torch.equal(hf_greedy.greedy_tokens(wide.double()[:, None]), torch.argmax(wide.double(), -1))
    # As the decoding loop appends them: a [batch, 1] column, the same tokens (ATen's where not taken).
    column = greedy(wide.detach(), True)
    assert column.shape == (2, 1) and column.is_contiguous() and torch.equal(column, torch.argmax(wide, -1, keepdim=True))
    assert greedy(wide.double(), True) is None
    assert torch.equal(hf_greedy._column(wide.double()[:, None], greedy), torch.argmax(wide.double(), -1, keepdim=True))


def test_the_next_positions_are_one_more():
    """The extension's `successor` (the loop's next position ids without the dispatcher): t + 1 of
    a small contiguous int64 tensor, a new tensor; None (ATen's `+ 1` then) for others."""
    from kiln.native import python_door

    successor = python_door.module().successor
    for t in (torch.tensor([[7]]), torch.arange(64).view(4, 16), torch.tensor(-1), torch.tensor([[2**62]])):
        made = successor(t)
        assert made is not t and made.dtype == torch.int64 and torch.equal(made, t + 1)
    big, wide = torch.arange(65), torch.arange(8).view(2, 4)
    for other in (big, wide.t(), wide.float(), wide.int(), torch.nn.Parameter(wide.float())):
        assert successor(other) is None
    steps = hf_greedy.StepInputs.__new__(hf_greedy.StepInputs)
    steps.successor = None
    assert torch.equal(steps._next_positions(wide.t()), wide.t() + 1)  # (ATen's where it does not take them)
