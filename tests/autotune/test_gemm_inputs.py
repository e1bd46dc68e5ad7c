"""The inputs a GEMM or convolution question is timed on: made only when measuring, and never
from the user's random stream."""

import pytest
import torch

import kiln
from kiln.autotune import gemm
from kiln.autotune.choose import clear_memory


@pytest.fixture(autouse=True)
def private_cache(tmp_path):
    clear_memory()
    with kiln.config.patch({"cache.dir": str(tmp_path / "cache")}):
        yield
    clear_memory()


def _count_inputs(monkeypatch) -> list:
    made = []
    original = gemm._Inputs._random

    def counting(self, val, memory_format):
        made.append(tuple(val.shape))
        return original(self, val, memory_format)

    monkeypatch.setattr(gemm._Inputs, "_random", counting)
    return made


def test_a_question_answered_from_the_cache_makes_no_inputs(monkeypatch):
    made = _count_inputs(monkeypatch)
    a, b = torch.empty(8, 64, device="meta"), torch.empty(64, 32, device="meta")
    first = gemm.choose_mm(a, b, None)
    assert sorted(made) == [(8, 64), (64, 32)]  # measured: a and b, once each
    clear_memory()  # the next answer comes from the disk cache
    made.clear()
    assert gemm.choose_mm(a, b, None) == first and made == []


def test_conv_inputs_keep_the_arriving_layout_in_the_question(monkeypatch):
    made = _count_inputs(monkeypatch)
    x, w = torch.empty(1, 8, 10, 10, device="meta"), torch.empty(16, 8, 3, 3, device="meta")
    args = ([1, 1], [1, 1], [1, 1], 1)
    assert gemm._strides(x, torch.channels_last) == (800, 1, 80, 8)
    for channels_last in (False, True):
        gemm.choose_conv(x, channels_last, w, None, args, "none", [], None, None)
    assert len(made) == 4  # x and w for each layout: two questions, not one


def test_compiling_leaves_the_users_random_stream_alone():
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()
    x = torch.randn(4, 64)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(model)(x), model(x))  # autotunes its GEMMs on a fresh cache
    torch.testing.assert_close(torch.rand(3), expected)
