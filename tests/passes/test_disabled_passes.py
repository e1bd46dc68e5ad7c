"""The setting `backend.disabled_passes` (`KILN_DISABLED_PASSES`): the rewrites it names are not run,
a name that is no rewrite is an error naming the setting and the accepted names, and a graph
compiled with a rewrite skipped is cached apart from one compiled with it."""

import pytest
import torch

import kiln
from kiln import config
from kiln.backend import watch
from kiln.passes import pipeline
from kiln.runtime.compiled_graph import CompiledGraph
from kiln.runtime.frozen import FrozenProgram
from tests.kiln_backend import private_cache  # noqa: F401  (fixture)

REWRITE_NAMES = [name for name, _ in pipeline.REWRITES]


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 16)

    def forward(self, x):
        return torch.tanh(self.linear(x)) * 2


@pytest.fixture
def counted(monkeypatch):
    """A rewrite `counted` that changes nothing and counts the graphs it is run on."""
    runs = []

    def counted(gm, target):
        runs.append(gm)
        return False

    monkeypatch.setattr(pipeline, "REWRITES", [*pipeline.REWRITES, ("counted", counted)])
    return runs


def _compile_and_check(model, x):
    kiln.reset()
    with torch.no_grad(), watch() as built:
        torch.testing.assert_close(kiln.compile(model)(x), model(x), rtol=1e-5, atol=1e-5)
    return built


def test_a_disabled_pass_is_not_run(counted):
    model, x = Model().eval(), torch.randn(4, 8)
    with config.patch({"backend.disabled_passes": ("counted",), "backend.autotune": "off"}):
        _compile_and_check(model, x)
    assert counted == []
    with config.patch({"backend.autotune": "off"}):
        _compile_and_check(model, x)
    assert len(counted) == 1


def test_without_freeze_the_weights_are_inputs_and_the_result_is_the_same():
    model, x = Model().eval(), torch.randn(4, 8)
    with config.patch({"backend.autotune": "off"}):
        assert isinstance(_compile_and_check(model, x)[0], FrozenProgram)
        with config.patch({"backend.disabled_passes": ("freeze",)}):
            assert isinstance(_compile_and_check(model, x)[0], CompiledGraph)


def test_a_name_that_is_no_rewrite_is_an_error_naming_the_setting_and_the_accepted_names():
    """Raised by the backend before it compiles anything: with fullgraph=True to the caller; without,
    the frame runs eagerly and the warning says why, as for any failure to compile it."""
    model, x = Model().eval(), torch.randn(4, 8)
    kiln.reset()
    with config.patch({"backend.disabled_passes": ("freeze", "gemm_prepak")}), torch.no_grad():
        with pytest.raises(ValueError) as error:
            kiln.compile(model, fullgraph=True)(x)
        kiln.reset()
        with pytest.warns(RuntimeWarning, match="backend.disabled_passes"):
            torch.testing.assert_close(kiln.compile(model)(x), model(x))
    message = str(error.value)
    assert "backend.disabled_passes" in message and "KILN_DISABLED_PASSES" in message and "'gemm_prepak'" in message
    assert all(name in message for name in REWRITE_NAMES)


def test_the_environment_variable_is_comma_separated():
    try:
        config.reload_from_env({"KILN_DISABLED_PASSES": "freeze, dead_code"})
        assert config.backend.disabled_passes == ("freeze", "dead_code")
        assert [name for name, _ in pipeline.rewrites()] == [n for n in REWRITE_NAMES if n not in ("freeze", "dead_code")]
    finally:
        config.reload_from_env()


def test_a_graph_compiled_with_a_pass_skipped_is_not_loaded_for_one_with_it(counted, private_cache):  # noqa: F811
    model, x = Model().eval(), torch.randn(4, 8)
    with config.patch({"backend.autotune": "off"}):
        _compile_and_check(model, x)
        with config.patch({"backend.disabled_passes": ("counted",)}):
            _compile_and_check(model, x)  # built again, not loaded: the rewrite is not run
        _compile_and_check(model, x)  # the first entry again, loaded
    assert len(counted) == 1
    assert len(sorted((private_cache / "aot").rglob("*.pkl"))) == 2
