"""Dataclasses and HuggingFace ModelOutputs under capture: built, read, returned, passed in."""

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from transformers.modeling_outputs import BaseModelOutput

import kiln
from tests.capture.util import assert_same, check


@dataclass
class Stats:
    total: torch.Tensor
    count: int = 0
    tags: list = field(default_factory=list)
    scale: float = 1.0


@dataclass(frozen=True)
class Frozen:
    a: torch.Tensor
    b: int = 2


@dataclass
class Normalized:
    x: torch.Tensor
    eps: float = 1e-5
    norm: Optional[torch.Tensor] = None

    def __post_init__(self):
        self.norm = self.x / (self.x.abs().sum() + self.eps)


@dataclass
class Child(Stats):
    extra: str = "child"

    def summary(self):
        return self.total * self.scale + self.count


def test_dataclass_created_and_returned_with_defaults():
    def f(x):
        s = Stats(x.sum())
        s.count += 3
        s.tags.append("first")
        return s

    x = torch.randn(4)
    out = check(f, x)(x)
    assert type(out) is Stats and out.tags == ["first"] and out.count == 3


def test_default_factory_gives_fresh_objects():
    def f(x):
        a, b = Stats(x), Stats(x * 2)
        a.tags.append(1)
        return a.tags, b.tags, a.tags is b.tags

    check(f, torch.randn(2))


def test_dataclass_keyword_and_positional_construction():
    def f(x):
        s = Stats(total=x, scale=2.0)
        t = Stats(x, 4, ["t"], 0.5)
        return s.total * s.scale + t.total * t.scale, t.count, t.tags

    check(f, torch.randn(3))


def test_frozen_dataclass():
    def f(x):
        fr = Frozen(x * 2)
        return fr.a + fr.b, fr

    x = torch.randn(3)
    out = check(f, x)(x)
    assert type(out[1]) is Frozen


def test_frozen_dataclass_assignment_raises_inside():
    def f(x):
        fr = Frozen(x)
        try:
            fr.b = 5
        except dataclasses.FrozenInstanceError:
            return x + 1
        return x

    check(f, torch.randn(3))


def test_post_init():
    def f(x):
        n = Normalized(x)
        return n.norm * 2, n

    check(f, torch.randn(5))


def test_dataclass_inheritance_and_method():
    def f(x):
        c = Child(x, count=2, scale=3.0)
        return c.summary(), c.extra, c

    check(f, torch.randn(3))


def test_dataclass_passed_in_and_mutated():
    def f(x, s):
        s.count = s.count + 1
        s.tags.append("seen")
        return x * s.scale + s.total

    check(f, torch.randn(3), Stats(torch.randn(3), count=1, tags=["a"], scale=0.5))


def test_frozen_dataclass_passed_in():
    def f(x, fr):
        return x * fr.b + fr.a

    check(f, torch.randn(3), Frozen(torch.randn(3), 4))


def test_dataclasses_helpers():
    def f(x):
        s = Stats(x, 1)
        names = [fl.name for fl in dataclasses.fields(s)]
        return names, dataclasses.is_dataclass(s), dataclasses.replace(s, count=5).count

    check(f, torch.randn(2))


def test_dataclass_equality_generated():
    def f(x):
        return Stats(x.shape[0], 1) == Stats(x.shape[0], 1), Stats(1) == Stats(2)

    check(f, torch.randn(2))


# --- HuggingFace ModelOutput --------------------------------------------------------------------


def test_model_output_built_and_returned():
    def f(x):
        hidden = x.tanh()
        return BaseModelOutput(last_hidden_state=hidden, hidden_states=(x, hidden))

    x = torch.randn(2, 3)
    out = check(f, x)(x)
    assert isinstance(out, BaseModelOutput)
    assert list(out.keys()) == ["last_hidden_state", "hidden_states"]
    assert out.attentions is None


def test_model_output_indexing_and_to_tuple():
    def f(x):
        out = BaseModelOutput(last_hidden_state=x * 2, attentions=(x + 1,))
        by_name = out["last_hidden_state"]
        by_int = out[0]
        second = out[1]
        tup = out.to_tuple()
        return by_name + by_int, second, len(tup), tup[0], out.attentions[0], out.hidden_states is None

    check(f, torch.randn(3))


def test_model_output_keys_items_contains():
    def f(x):
        out = BaseModelOutput(x, None, (x,))
        return list(out.keys()), "attentions" in out, "hidden_states" in out, [k for k, _ in out.items()], len(out)

    check(f, torch.randn(2))


def test_model_output_missing_key_raises_key_error():
    def f(x):
        out = BaseModelOutput(last_hidden_state=x)
        try:
            return out["attentions"]
        except KeyError:
            return x - 1

    check(f, torch.randn(2))


def test_model_output_passed_in():
    def f(out):
        return out.last_hidden_state * 2 + out[0], out["last_hidden_state"].sum()

    check(f, BaseModelOutput(last_hidden_state=torch.randn(3)))


def test_model_output_attribute_update_after_build():
    def f(x):
        out = BaseModelOutput(last_hidden_state=x)
        out.hidden_states = (x * 3,)
        out["last_hidden_state"] = x + 1
        return out

    x = torch.randn(2)
    out = check(f, x)(x)
    assert list(out.keys()) == ["last_hidden_state", "hidden_states"]
    assert_same(out.last_hidden_state, x + 1)


@pytest.mark.parametrize("return_dict", [True, False])
def test_return_dict_pattern(return_dict):
    def f(x, return_dict):
        hidden = x.relu()
        if not return_dict:
            return (hidden,)
        return BaseModelOutput(last_hidden_state=hidden)

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    assert_same(compiled(x, return_dict), f(x, return_dict))


def test_frozen_dataclass_passed_in_written_with_object_setattr():
    def f(x, fr):
        object.__setattr__(fr, "b", fr.b + 1)
        return x * fr.b

    check(f, torch.randn(3), Frozen(torch.randn(3), 4))
