"""The peer modes compile the way their names say: checked by catching what they hand torch.compile,
without compiling anything."""

import torch
import torch._inductor.config as inductor_config

from benchmarks.modes import MODES


def _handed(monkeypatch, mode: str) -> dict:
    seen = {}

    def fake_compile(model, **kwargs):
        seen.update(kwargs, freezing=inductor_config.freezing)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    with inductor_config.patch(freezing=False):  # the mode sets it for its whole process; not for other tests
        MODES[mode].compile(torch.nn.Linear(2, 2))
    return seen


def test_inductor_max_autotune_freezes_and_searches(monkeypatch):
    assert _handed(monkeypatch, "inductor-max-autotune") == {"backend": "inductor", "mode": "max-autotune", "freezing": True}
    assert MODES["inductor-max-autotune"].unavailable_reason(True) == "Inductor freezes weights for inference only"
    assert MODES["inductor-max-autotune"].unavailable_reason(False) is None
    assert "many minutes" in MODES["inductor-max-autotune"].help


def test_other_modes_pass_no_mode(monkeypatch):
    # torch.compile takes a mode for Inductor only; the kiln backend must not be handed one.
    assert _handed(monkeypatch, "inductor-freeze") == {"backend": "inductor", "freezing": True}
    assert _handed(monkeypatch, "kiln-dynamo") == {"backend": "kiln", "freezing": False}
