"""Frozen weights stay right however the user changes them (kiln/runtime/frozen.py, data_watch.py).

Each change runs after a first compiled call, through both doors, on two models whose frozen
weights kiln transforms rather than reads as they are: a linear layer whose weight oneDNN packs
(the GEMM choice forced, so that the pack exists on every machine) and a convolution with a
BatchNorm folded into it. The next compiled call must give eager's result on the changed model.
"""

import numpy as np
import logging
import pytest
import torch
from torch import nn

import kiln
from kiln.runtime import data_watch
from tests.kiln_backend import private_cache  # noqa: F401  (fixture)


class LinearNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x):
        return self.second(nn.functional.gelu(self.first(x)))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(torch.relu(self.norm(self.conv(x))).mean((2, 3)))


def _model(kind):
    torch.manual_seed(0)
    model = LinearNet() if kind == "linear" else ConvNet()
    if kind == "conv":
        model.norm.running_mean.uniform_(-1, 1)
        model.norm.running_var.uniform_(0.5, 2)
    return model.eval()


def _input(kind):
    return torch.randn(2, 16) if kind == "linear" else torch.randn(1, 3, 8, 8)


def _layer(model):
    return model.first if isinstance(model, LinearNet) else model.conv


@pytest.fixture(autouse=True)
def packed_gemms(monkeypatch):
    """Every frozen linear layer through oneDNN's packed GEMM: its weight is a pack kiln made."""
    import kiln.passes.gemm_prepack as gemm_prepack

    monkeypatch.setattr(gemm_prepack, "choose_mm", lambda *args: "onednn")


def _compile(model, door):
    return kiln.compile(model) if door == "kiln.compile" else torch.compile(model, backend="kiln")


def _new_values(t):
    return torch.randn_like(t)


def _ema(model):  # an exponential moving average, written the way many training scripts write it
    for p in model.parameters():
        p.data.mul_(0.5).add_(torch.ones_like(p), alpha=0.5)


CHANGES = {
    "in place": lambda m: _layer(m).weight.mul_(-0.5),
    "load_state_dict": lambda m: m.load_state_dict({k: v + 0.25 for k, v in m.state_dict().items()}),
    ".data.copy_": lambda m: _layer(m).weight.data.copy_(_new_values(_layer(m).weight)),
    ".data =": lambda m: setattr(_layer(m).weight, "data", _new_values(_layer(m).weight)),
    ".data += (adapter merge)": lambda m: _layer(m).weight.data.add_(0.1 * torch.ones_like(_layer(m).weight)),
    "moving average through .data": _ema,
    "new parameter": lambda m: setattr(_layer(m), "weight", nn.Parameter(_new_values(_layer(m).weight))),
    "bias .data[0] =": lambda m: _layer(m).bias.data.__setitem__(0, 5.0),
}


@pytest.mark.parametrize("door", ["kiln.compile", "torch.compile"])
@pytest.mark.parametrize("kind", ["linear", "conv"])
@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_after_compiling_gives_the_changed_models_result(change, kind, door):
    model = _model(kind)
    compiled, x = _compile(model, door), _input(kind)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        CHANGES[change](model)
        expected = model(x)
        torch.testing.assert_close(compiled(x), expected)
        torch.testing.assert_close(compiled(x), expected)  # and again, from the refrozen constants


@pytest.mark.parametrize("door", ["kiln.compile", "torch.compile"])
def test_a_data_tensor_written_after_a_later_call_is_seen(door):
    model = _model("linear")
    compiled, x = _compile(model, door), _input("linear")
    weight = model.first.weight
    with torch.no_grad():
        compiled(x)
        data = weight.data  # taken now, written only after the next call
        rows = weight.data[:4]  # a view of a `.data` tensor nobody else holds
        torch.testing.assert_close(compiled(x), model(x))
        data.mul_(2.0)
        torch.testing.assert_close(compiled(x), model(x))
        rows.zero_()
        torch.testing.assert_close(compiled(x), model(x))


def test_reading_data_does_not_refreeze_and_keeps_no_handles(caplog):
    caplog.set_level(logging.INFO, logger="kiln")
    model = _model("linear")
    compiled, x = _compile(model, "kiln.compile"), _input("linear")
    with torch.no_grad(), kiln.config.patch({"debug.logs": ("freezing",)}):
        compiled(x)
        for _ in range(3):
            norm = model.first.weight.data.norm()  # a read, as logging code does
            compiled(x)
        model.first.weight.data.mul_(2.0)  # a write: one refreeze, logged
        compiled(x)
    assert norm > 0
    refreezes = [r for r in caplog.records if "computed again" in r.getMessage()]
    assert len(refreezes) == 1
    assert data_watch.pending_handles() == 0  # the `.data` tensors are gone, so are their handles


@pytest.mark.parametrize("door", ["kiln.compile", "torch.compile"])
def test_a_buffer_rebound_through_data_is_seen(door):
    model = _model("conv")
    compiled, x = _compile(model, door), _input("conv")
    with torch.no_grad():
        compiled(x)
        model.norm.running_var.data = model.norm.running_var * 3.0
        torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.parametrize("door", ["kiln.compile", "torch.compile"])
def test_module_to_another_dtype_gives_that_dtypes_result(door):
    model = _model("conv")
    compiled, x = _compile(model, door), _input("conv")
    with torch.no_grad():
        compiled(x)
        model.to(torch.float64)
        x64 = x.double()
        out = compiled(x64)
        assert out.dtype == torch.float64
        torch.testing.assert_close(out, model(x64))


def test_tied_weights_rebound_after_compiling_are_seen():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8)).eval()
    compiled, x = _compile(model, "kiln.compile"), torch.randn(3, 8)
    with torch.no_grad():
        compiled(x)
        model[2].weight = model[0].weight  # tie the two layers
        torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.parametrize("door", ["kiln.compile", "torch.compile"])
def test_a_write_kiln_cannot_see_is_fixed_by_refreeze(door):
    """A write outside PyTorch (here through NumPy) moves no counter: kiln.refreeze is the remedy."""
    model = _model("linear")
    compiled, x = _compile(model, door), _input("linear")
    with torch.no_grad():
        compiled(x)
        np.copyto(model.first.weight.detach().numpy(), 0.5)
        kiln.refreeze(model)
        torch.testing.assert_close(compiled(x), model(x))


def test_refreeze_names_what_it_accepts():
    with pytest.raises(TypeError, match="kiln.refreeze: model must be"):
        kiln.refreeze("model")
    kiln.refreeze(nn.Linear(2, 2))  # nothing frozen: nothing to do
    kiln.refreeze([torch.ones(2)])


def test_data_of_parameters_behaves_as_before():
    p = nn.Parameter(torch.ones(3))
    data_watch.watch([p])
    d = p.data
    assert isinstance(d, torch.Tensor) and not isinstance(d, nn.Parameter) and not d.requires_grad
    assert d.data_ptr() == p.data_ptr()
    d.add_(1)
    assert p._version == 0  # `.data` keeps its own version counter: autograd sees what it saw before
    p.data = torch.zeros(3)
    assert p.sum().item() == 0 and isinstance(p, nn.Parameter)


def test_reading_data_in_a_loop_without_calls_keeps_handles_bounded():
    p = nn.Parameter(torch.ones(3))
    data_watch.watch([p])
    for _ in range(5000):
        p.data.sum()
    assert data_watch.pending_handles() <= 1024 + 1
    kept = p.data  # alive: kept, and its writes seen
    data_watch.sweep()
    assert data_watch.pending_handles() == 1
    del kept
