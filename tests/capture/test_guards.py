"""Each guard kind: a call that breaks the assumption recompiles, one that keeps it does not."""

import torch

import kiln
from kiln.capture.guards import GuardSet, Guard
from kiln.capture.sources import LocalSource


def _entries(compiled) -> int:
    return len(compiled.kiln_cache.entries)


def _compiled(fn):
    return kiln.compile(fn, backend="eager", fullgraph=True)


def test_tensor_match_dtype_shape_stride_requires_grad():
    f = _compiled(lambda x: x * 2)
    x = torch.randn(3, 4)
    f(x)
    f(torch.randn(3, 4))
    assert _entries(f) == 1
    for changed in (x.double(), torch.randn(5, 4), torch.randn(4, 3).t(), x.clone().requires_grad_()):
        before = _entries(f)
        torch.testing.assert_close(f(changed), changed * 2)
        assert _entries(f) == before + 1
        f(changed)
        assert _entries(f) == before + 1


def test_equals_on_python_constants():
    f = _compiled(lambda x, n: x + n)
    x = torch.ones(2)
    f(x, 1)
    f(x, 1)
    assert _entries(f) == 1
    torch.testing.assert_close(f(x, 2), x + 2)
    assert _entries(f) == 2
    torch.testing.assert_close(f(x, 2.0), x + 2.0)  # 2 == 2.0, but the type differs
    assert _entries(f) == 3


def test_type_and_length_match_on_containers():
    f = _compiled(lambda xs: sum(xs))
    a, b, c = torch.ones(2), torch.ones(2), torch.ones(2)
    f([a, b])
    f([a, b])
    assert _entries(f) == 1
    torch.testing.assert_close(f([a, b, c]), a + b + c)
    assert _entries(f) == 2
    torch.testing.assert_close(f((a, b)), a + b)
    assert _entries(f) == 3


def test_id_match_on_functions():
    f = _compiled(lambda act, x: act(x))
    x = torch.randn(4)
    f(torch.relu, x)
    f(torch.relu, x)
    assert _entries(f) == 1
    torch.testing.assert_close(f(torch.sigmoid, x), torch.sigmoid(x))
    assert _entries(f) == 2


def test_global_state_grad_mode():
    f = _compiled(lambda x: x * 3)
    x = torch.randn(2, requires_grad=True)
    assert f(x).requires_grad
    with torch.no_grad():
        assert not f(x).requires_grad
    assert _entries(f) == 2


def test_module_attribute_change_recompiles():
    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.factor = 2.0

        def forward(self, x):
            return x * self.factor

    m = Scale()
    f = kiln.compile(m, backend="eager", fullgraph=True)
    x = torch.ones(3)
    torch.testing.assert_close(f(x), x * 2)
    m.factor = 5.0
    torch.testing.assert_close(f(x), x * 5)
    assert _entries(f) == 2


def test_recompile_limit_stops_the_storm(caplog):
    f = kiln.compile(lambda x, n: x + n, backend="eager", fullgraph=True, options={"recompile_limit": 3})
    x = torch.zeros(2)
    with kiln.config.patch({"debug.logs": "recompiles"}):
        for n in range(8):
            torch.testing.assert_close(f(x, n), x + n)
    assert _entries(f) == 3
    assert f.kiln_cache.eager_calls == 5
    assert any("recompile limit (3) reached" in r.getMessage() for r in caplog.records)
    assert any("EQUALS" in r.getMessage() and "failed" in r.getMessage() for r in caplog.records)


def test_guards_are_logged_and_compiled_to_one_function(caplog):
    with kiln.config.patch({"debug.logs": "guards"}):
        kiln.compile(lambda x: x + 1, backend="eager")(torch.ones(2))
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "TENSOR_MATCH" in text and "def check(L):" in text


def test_first_failure_names_the_guard():
    guards = GuardSet()
    guards.add(Guard("EQUALS", LocalSource("n", 0), 3))
    guards.add(Guard("TYPE_MATCH", LocalSource("s", 1), str))
    compiled = guards.compile()
    assert compiled.check((3, "a"))
    assert not compiled.check((4, "a"))
    assert compiled.first_failure((3, 1.0)).kind == "TYPE_MATCH"
