"""A runner's HuggingFace ModelOutput built by a learned copy (kiln/capture/model_output_builder.py):
the same object as the constructor's, on every call, and the constructor wherever a copy could differ."""

import dataclasses
import os
from typing import Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutputWithPast
from transformers.utils import ModelOutput

import kiln
from kiln.capture.model_output_builder import ModelOutputBuilder


def _same_output(a, b):
    """Same type, dict items (keys in order, values by identity) and attributes (by identity)."""
    assert type(a) is type(b)
    assert list(a.keys()) == list(b.keys())
    assert all(a[k] is b[k] for k in a.keys())
    assert list(vars(a)) == list(vars(b))
    assert all(vars(a)[k] is vars(b)[k] for k in vars(a))


def _names(cls):
    return tuple(f.name for f in dataclasses.fields(cls))


def test_a_learned_copy_is_the_constructors_object_deprecated_names_included():
    names = ("loss", "logits", "past_key_values", "hidden_states", "attentions")
    build = ModelOutputBuilder(CausalLMOutputWithPast, names)
    for _ in range(3):  # learns from the first call, copies from the second
        logits, cache, hidden = torch.randn(1, 4), torch.randn(2), (torch.randn(3),)
        values = (None, logits, cache, hidden, None)
        _same_output(build(*values), CausalLMOutputWithPast(**dict(zip(names, values))))
    assert build.learned
    assert [key for key, _, _ in build.items] == list(CausalLMOutputWithPast(logits=logits, past_key_values=cache,
                                                                          hidden_states=hidden).keys())


def test_the_constructor_runs_where_a_copy_would_differ():
    names = _names(BaseModelOutput)
    build = ModelOutputBuilder(BaseModelOutput, names)
    x, y = torch.randn(2), (torch.randn(2),)
    build(x, y, None)
    assert build.learned
    # A dict item's argument None (the constructor leaves the key out), a None argument now set.
    for values in [(x, None, None), (x, y, (x,))]:
        _same_output(build(*values), BaseModelOutput(**dict(zip(names, values))))

    # One object passed for two fields: which field takes which argument later is unknowable.
    twice = ModelOutputBuilder(BaseModelOutput, names)
    twice(x, y, y)
    assert twice.learned is False
    z = (torch.randn(2),)
    _same_output(twice(x, y, z), BaseModelOutput(last_hidden_state=x, hidden_states=y, attentions=z))


@dataclasses.dataclass
class _Computed(ModelOutput):
    logits: Optional[torch.Tensor] = None
    scale: Optional[float] = None
    scaled: Optional[torch.Tensor] = None

    def __post_init__(self):
        super().__post_init__()
        self.scaled = self.logits * self.scale  # a value no argument holds


def test_an_output_whose_post_init_computes_a_field_is_always_constructed():
    build = ModelOutputBuilder(_Computed, ("logits", "scale"))
    x = torch.randn(3)
    build(x, 2.0)
    assert build.learned is False
    torch.testing.assert_close(build(x, 3.0).scaled, x * 3)


def test_an_immutable_argument_that_changes_is_constructed_again():
    @dataclasses.dataclass
    class WithScale(ModelOutput):
        logits: Optional[torch.Tensor] = None
        scale: Optional[float] = None

    build = ModelOutputBuilder(WithScale, ("logits", "scale"))
    x = torch.randn(3)
    build(x, 2.0)
    assert build.learned
    assert build(x, 5.0).scale == 5.0 and build(x, 2.0).scale == 2.0


def test_a_compiled_frame_returns_the_constructors_output_on_every_call():
    def f(x):
        hidden = x.tanh()
        return BaseModelOutput(last_hidden_state=hidden, hidden_states=(x, hidden))

    compiled = kiln.compile(f, backend="eager")
    for _ in range(3):
        x = torch.randn(2, 3)
        got, want = compiled(x), f(x)
        assert type(got) is BaseModelOutput and list(got.keys()) == list(want.keys()) == ["last_hidden_state", "hidden_states"]
        assert list(vars(got)) == list(vars(want)) and got.attentions is None
        torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state)
        assert got.hidden_states[0] is x and got.hidden_states[1] is got.last_hidden_state
    builders = [v for v in compiled.kiln_cache.entries[0].run.__globals__.values() if isinstance(v, ModelOutputBuilder)]
    assert len(builders) == 1 and builders[0].learned
