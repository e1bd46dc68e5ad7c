"""Settled steps (kiln/settled.py): once kiln's greedy loop runs nothing but its own code between
the decode steps, a step checks only the guards that read its new arguments and its frozen weights
are stamped once a generate. Eager's tokens; the full check wherever anything else may run
between the calls; every change of an argument still caught."""

import functools

import pytest
import torch

import kiln
from kiln import settled
from kiln.capture import hf_greedy
from kiln.capture.settled_entry import SettledEntry
from kiln.runtime.frozen import FrozenProgram
from tests.kiln_backend import private_cache  # noqa: F401 - an empty cache per test
from tests.llm.test_generate import _decoder

NEW_TOKENS = 24
OPTIONS = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None, cache_implementation="static")


def _prompt() -> torch.Tensor:
    return torch.randint(0, 1000, (1, 16), generator=torch.Generator().manual_seed(1))


def _counted(monkeypatch) -> dict:
    """Settled checks that held and that did not, and frozen weights' stamps, counted."""
    counts = {"held": 0, "not held": 0, "stamps": 0}
    holds = SettledEntry.holds

    def counted_holds(self, L):
        held = holds(self, L)
        counts["held" if held else "not held"] += 1
        return held

    monkeypatch.setattr(SettledEntry, "holds", counted_holds)
    init = FrozenProgram.__init__

    def counted_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        stamp_of = self.stamp_of

        def counted_stamp(*a):
            counts["stamps"] += 1
            return stamp_of(*a)

        self.stamp_of = counted_stamp

    monkeypatch.setattr(FrozenProgram, "__init__", counted_init)
    return counts


def _frame_entries():
    from kiln.capture.cache import all_caches

    return [entry for cache in all_caches() for entry in cache.entries]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_settled_greedy_loop_checks_the_new_arguments_and_stamps_once(arch, monkeypatch):
    kiln.reset()
    model = _decoder(arch)
    prompt = _prompt()
    counts = _counted(monkeypatch)
    with torch.no_grad():
        expected = model.generate(prompt, **OPTIONS)
        compiled = kiln.compile(model)
        first = compiled.generate(prompt, **OPTIONS)
        stamps_first = counts["stamps"]
        counts.update({"held": 0, "not held": 0, "stamps": 0})
        second = compiled.generate(prompt, **OPTIONS)
    assert torch.equal(first, expected) and torch.equal(second, expected)
    # The run opens once HF's functions stop running between the steps (CHECKED_STEPS of them and
    # the update after), and its first two steps are checked in full; every later step holds by
    # the check of what changed.
    settled_steps = NEW_TOKENS - 1 - (hf_greedy.CHECKED_STEPS + 1) - 2
    assert counts["held"] >= settled_steps - 1 and counts["not held"] <= 2
    # Stamped on the prefill, the decode steps before the run and the run's first step only.
    assert counts["stamps"] <= NEW_TOKENS - counts["held"]
    assert stamps_first >= counts["stamps"]
    decode = [entry for entry in _frame_entries() if entry.settles]
    assert len(decode) == 1
    # The guards re-checked: those of the new tokens, positions and the kwargs' dict, a few of all.
    reads = decode[0].argument_guards
    rechecked = max(sum(1 for r in reads.reads if r & changed) for changed in reads.checks)
    assert 0 < rechecked < len(reads.guards) // 5


def test_the_prefill_entry_does_not_settle():
    """The prefill's entry stores its results into the cache's layers (not constants): every call checks in full."""
    kiln.reset()
    model = _decoder("llama")
    compiled = kiln.compile(model)
    with torch.no_grad():
        compiled.generate(_prompt(), **OPTIONS)
    entries = _frame_entries()
    assert len(entries) == 2 and [entry.settles for entry in entries] == [False, True]


@pytest.mark.parametrize("case", ["setting off", "streamer", "criterion", "hook", "sampling"])
def test_no_run_where_other_code_may_run_between_the_steps(case, monkeypatch):
    """Every step checked in full and stamped: a run needs nothing but kiln's code between the steps."""
    kiln.reset()
    model = _decoder("llama")
    prompt = _prompt()
    options = dict(OPTIONS)
    if case == "streamer":
        from transformers.generation.streamers import BaseStreamer

        class Streamer(BaseStreamer):
            def put(self, value):
                pass

            def end(self):
                pass

        options["streamer"] = Streamer()
    elif case == "criterion":
        from transformers.generation.stopping_criteria import StoppingCriteria, StoppingCriteriaList

        class Never(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                return torch.zeros(input_ids.shape[0], dtype=torch.bool)

        options["stopping_criteria"] = StoppingCriteriaList([Never()])
    elif case == "hook":
        model.register_forward_pre_hook(lambda module, args: None)
    elif case == "sampling":
        options.update(do_sample=True, top_k=5)
    counts = _counted(monkeypatch)
    runs = []
    monkeypatch.setattr(settled, "Run", functools.partial(_recorded_run, runs))
    with torch.no_grad():
        torch.manual_seed(3)
        expected = model.generate(prompt, **options)
        torch.manual_seed(3)
        with kiln.config.patch({"capture.settled_steps": case != "setting off"}):
            tokens = kiln.compile(model).generate(prompt, **options)
    assert torch.equal(tokens, expected)
    assert runs == [] and counts["held"] == 0 and counts["not held"] == 0 and counts["stamps"] >= NEW_TOKENS


_ORIGINAL_RUN = settled.Run


def _recorded_run(runs: list) -> settled.Run:
    run = _ORIGINAL_RUN()
    runs.append(run)
    return run


def test_weights_changed_between_two_generates_are_seen():
    """A run stamps once; the next generate is a new run: a weight written in place between two
    calls is seen by the next call's stamp (eager's tokens with the new weight)."""
    kiln.reset()
    model = _decoder("llama")
    prompt = _prompt()
    compiled = kiln.compile(model)
    with torch.no_grad():
        compiled.generate(prompt, **OPTIONS)
        model.lm_head.weight.mul_(-1.5)
        expected = model.generate(prompt, **OPTIONS)
        assert torch.equal(compiled.generate(prompt, **OPTIONS), expected)


class _Flagged:
    flag = False


def _constant_store(x, scale):
    _Flagged.flag = True
    return x * scale


def _result_store(x, box):
    box.last = x + 1  # (a tensor the graph made: not a constant)
    return x + 1


def test_a_frame_settles_where_its_changes_are_stores_of_constants():
    kiln.reset()
    constant = kiln.compile(_constant_store)
    constant(torch.ones(3), 2.0)

    class Box:
        last = None

    result = kiln.compile(_result_store)
    result(torch.ones(3), Box())
    settles = {"'last'" in entry.runner_source: entry.settles for entry in _frame_entries()}
    assert settles == {False: True, True: False}


def test_a_settled_call_still_catches_every_changed_argument():
    """Calls made as steps of one run by hand: after two full checks, new tensors of the same kind
    hold by the check of what changed; a tensor of another size or dtype, another constant, or
    another keyword argument fails it and is checked in full (a new entry or another entry)."""
    kiln.reset()
    compiled = kiln.compile(_keywords)
    run = settled.Run()

    def step(**kwargs):
        return settled.call(run, compiled, **kwargs)

    x = torch.arange(6.0)
    for _ in range(3):
        assert torch.equal(step(x=x.clone(), scale=2.0), x * 2)
    kept = next(iter(run.kept.values()))
    assert kept.full_checks == 2
    assert torch.equal(step(x=x.clone(), scale=2.0), x * 2)
    assert torch.equal(step(x=torch.arange(8.0), scale=2.0), torch.arange(8.0) * 2)  # another size
    assert torch.equal(step(x=torch.arange(6), scale=2.0), torch.arange(6) * 2)  # another dtype
    assert torch.equal(step(x=x.clone(), scale=3.0), x * 3)  # another constant
    assert torch.equal(step(x=x.clone(), scale=2.0, shift=1.0), x * 2 + 1)  # another keyword
    assert torch.equal(step(x=x.clone(), scale=2.0), x * 2)


def _keywords(**kwargs):
    out = kwargs["x"] * kwargs["scale"]
    if "shift" in kwargs:
        out = out + kwargs["shift"]
    return out


def test_a_dynamic_caches_steps_check_in_full_and_stamp_once(monkeypatch):
    """The dynamic cache's step stores its grown layers (not constants): every call of the run
    checks its guards in full; it leaves the model's weights alone, so they are stamped once a run."""
    kiln.reset()
    model = _decoder("llama")
    prompt = _prompt()
    options = {name: value for name, value in OPTIONS.items() if name != "cache_implementation"}
    counts = _counted(monkeypatch)
    compiled = kiln.compile(model)
    with torch.no_grad():
        expected = model.generate(prompt, **options)
        compiled.generate(prompt, **options)
        counts.update({"held": 0, "not held": 0, "stamps": 0})
        tokens = compiled.generate(prompt, **options)
    assert torch.equal(tokens, expected)
    entries = _frame_entries()
    assert not any(entry.settles for entry in entries) and any(entry.stamps_once for entry in entries)
    assert counts["held"] == 0 and counts["not held"] == 0
    # Stamped on the prefill, the decode steps before the run and the run's first step only.
    assert 0 < counts["stamps"] <= hf_greedy.CHECKED_STEPS + 3
