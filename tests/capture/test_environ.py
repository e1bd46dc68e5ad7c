"""`os.environ` read in compiled code: guarded by the names read, not by every variable's name
(kiln/capture/variables/environ.py), and read exactly as eager reads it."""
import os

import pytest
import torch

import kiln

NAME, OTHER = "KILN_TEST_ENVIRON_FLAG", "KILN_TEST_ENVIRON_OTHER"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    monkeypatch.delenv(OTHER, raising=False)


def _compiled(fn):
    return kiln.compile(fn, backend="eager", fullgraph=True)


def _entries(compiled) -> int:
    return len(compiled.kiln_cache.entries)


def reads_with_get(x):
    # as transformers' SDPA attention reads TRANSFORMERS_SDPA_FORCE_GQA on every forward
    if os.environ.get(NAME, "0") == "1":
        return x + 1
    return x * 2


def test_setting_another_variable_compiles_nothing_again(monkeypatch):
    f = _compiled(reads_with_get)
    x = torch.randn(4)
    torch.testing.assert_close(f(x), x * 2)
    monkeypatch.setenv(OTHER, "anything")  # (what Inductor or a tokenizer does after kiln compiled)
    torch.testing.assert_close(f(x), x * 2)
    monkeypatch.delenv(OTHER)
    torch.testing.assert_close(f(x), x * 2)
    assert _entries(f) == 1


def test_setting_changing_or_unsetting_the_variable_read_compiles_again(monkeypatch):
    f = _compiled(reads_with_get)
    x = torch.randn(4)
    f(x)
    monkeypatch.setenv(NAME, "1")  # set: the entry that saw it absent fails
    torch.testing.assert_close(f(x), x + 1)
    assert _entries(f) == 2
    monkeypatch.setenv(NAME, "2")  # its value changed
    torch.testing.assert_close(f(x), x * 2)
    assert _entries(f) == 3
    monkeypatch.delenv(NAME)  # absent again: the first entry
    torch.testing.assert_close(f(x), x * 2)
    assert _entries(f) == 3


def test_subscript_and_in_read_as_eager_reads_them(monkeypatch):
    def fn(x):
        scale = float(os.environ[NAME]) if NAME in os.environ else 1.0
        try:
            os.environ[OTHER]
        except KeyError:
            return x * scale - 1
        return x * scale

    f = _compiled(fn)
    x = torch.randn(4)
    torch.testing.assert_close(f(x), fn(x))
    monkeypatch.setenv(NAME, "3")
    torch.testing.assert_close(f(x), fn(x))
    monkeypatch.setenv(OTHER, "")
    torch.testing.assert_close(f(x), fn(x))
    assert _entries(f) == 3


def test_a_write_in_the_compiled_code_is_read_back_and_made(monkeypatch):
    """A write goes through os._Environ's own methods; a read after it sees the trace's dict."""
    def fn(x):
        os.environ[NAME] = "5"
        return x * float(os.environ.get(NAME, "0"))

    f = kiln.compile(fn, backend="eager")
    x = torch.randn(4)
    torch.testing.assert_close(f(x), x * 5)
    assert os.environ[NAME] == "5"
