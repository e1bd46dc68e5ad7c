"""kiln.config: defaults, types, environment, unknown names, patch, describe."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import kiln
from kiln import config
from kiln.config import setting

REPO = Path(kiln.__file__).resolve().parents[1]
ACCEPTED = ", ".join(sorted(config.as_dict()))


@pytest.fixture(autouse=True)
def restore_config():
    # Patching every setting to its current value restores them all on exit, whatever the test
    # did; inside, tests start from the defaults whatever KILN_* variables pytest runs under.
    with config.patch(config.as_dict()):
        config.reload_from_env({})
        yield


@config._group("toy")
class ToySettings(config._Group):
    """A group only tests see: kinds that no real setting uses yet."""

    flag: bool = setting(False, env="KILN_TOY_FLAG", help="a switch")
    limit: int | None = setting(None, env="KILN_TOY_LIMIT", help="an optional count")


@pytest.fixture
def toy(monkeypatch):
    group = ToySettings()
    monkeypatch.setitem(config._GROUPS, "toy", group)
    return group


def run_python(code, **env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    clean["PYTHONPATH"] = os.pathsep.join([str(REPO), clean.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True
    )


# --- defaults --------------------------------------------------------------------------------


def test_defaults():
    config.reload_from_env({})
    assert config.as_dict() == {
        "debug.logs": (),
        "debug.dump_dir": None,
        "debug.trace_dir": None,
        "debug.verify": False,
        "cache.dir": "~/.cache/kiln",
        "cache.runtime_dir": "",
        "cache.prebuilt_dir": "",
        "cache.remote": "",
        "cache.remote_connect_timeout_s": 5.0,
        "cache.remote_timeout_s": 5.0,
        "backend.compile_workers": 0,
        "backend.freezing": True,
        "backend.autotune": "default",
        "backend.autotune_log": "",
        "backend.codegen": "auto",
        "backend.symbolic_kernels": True,
        "backend.cpp_wrapper": True,
        "backend.cuda_graphs": False,
        "backend.cuda_graph_sizes": 8,
        "backend.triton_direct_launch": True,
        "backend.triton_gemm": "auto",
        "backend.disabled_passes": (),
        "backend.gemm_candidates": (),
        "backend.fp32_gemm": "fp32",
        "backend.huge_pages": True,
        "capture.recompile_limit": 8,
        "capture.inline_depth": 64,
        "capture.scalar_outputs": False,
        "capture.dynamic_ints": True,
        "capture.dynamic_sources": (),
        "capture.error_on_fx_trace": True,
        "capture.greedy_loop": True,
        "capture.settled_steps": True,
        "capture.warn_eager_frames": True,
        "runtime.keep_freed_mb": 0,
        "runtime.buffer_cache_mb": 32,
        "runtime.adaptive_team": True,
        "bench.timeout_s": 900.0,
        "bench.iters": 20,
        "bench.warmup": 3,
        "bench.timing_lock": "",
    }
    assert type(config.bench.timeout_s) is float


def test_cache_dir_expands_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    config.cache.dir = "~/kiln-cache"
    assert config.cache_dir() == tmp_path / "kiln-cache"
    assert config.cache.dir == "~/kiln-cache"  # stored as given, so describe() shows it so


# --- environment -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "var, text, name, expected",
    [
        ("KILN_BENCH_ITERS", "7", "bench.iters", 7),
        ("KILN_BENCH_ITERS", " 12 ", "bench.iters", 12),
        ("KILN_BENCH_WARMUP", "0", "bench.warmup", 0),
        ("KILN_BENCH_TIMEOUT", "1.5", "bench.timeout_s", 1.5),
        ("KILN_BENCH_TIMEOUT", "60", "bench.timeout_s", 60.0),
        ("KILN_CACHE_DIR", "/tmp/kc", "cache.dir", "/tmp/kc"),
        ("KILN_DEBUG_DIR", "/tmp/dumps", "debug.dump_dir", "/tmp/dumps"),
        ("KILN_DEBUG_DIR", "", "debug.dump_dir", None),
        ("KILN_LOGS", "graph, code,", "debug.logs", ("graph", "code")),
        ("KILN_LOGS", "", "debug.logs", ()),
        ("KILN_DYNAMIC_SOURCES", "L['n'], L['x']:1", "capture.dynamic_sources", ("L['n']", "L['x']:1")),
    ],
)
def test_env_parsing(var, text, name, expected):
    config.reload_from_env({var: text})
    value = config.as_dict()[name]
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    "text, expected",
    [("1", True), ("true", True), ("Yes", True), ("ON", True),
     ("0", False), ("False", False), ("no", False), ("off", False)],
)
def test_env_bool(toy, text, expected):
    config.reload_from_env({"KILN_TOY_FLAG": text})
    assert toy.flag is expected


def test_env_optional_int(toy):
    config.reload_from_env({"KILN_TOY_LIMIT": "4"})
    assert toy.limit == 4
    config.reload_from_env({"KILN_TOY_LIMIT": ""})
    assert toy.limit is None


@pytest.mark.parametrize(
    "var, text, form",
    [
        ("KILN_BENCH_ITERS", "many", "an integer"),
        ("KILN_BENCH_ITERS", "2.5", "an integer"),
        ("KILN_BENCH_TIMEOUT", "soon", "a number"),
        ("KILN_TOY_FLAG", "maybe", "true/false"),
        ("KILN_TOY_LIMIT", "x", "an integer"),
    ],
)
def test_env_malformed_names_variable_value_and_form(toy, var, text, form):
    config.bench.warmup = 9
    with pytest.raises(ValueError) as info:
        config.reload_from_env({var: text, "KILN_BENCH_WARMUP": "1"})
    message = str(info.value)
    assert var in message and repr(text) in message and form in message
    assert config.bench.warmup == 9  # nothing applied when any variable is bad


def test_reload_resets_to_defaults():
    config.bench.iters = 99
    config.debug.logs = ("graph",)
    config.reload_from_env({})
    assert config.bench.iters == 20
    assert config.debug.logs == ()


def test_unknown_env_var_warns_and_lists_known():
    with pytest.warns(UserWarning) as record:
        config.reload_from_env({"KILN_BENCH_ITER": "5"})
    message = str(record[0].message)
    assert "KILN_BENCH_ITER " in message and "did you mean KILN_BENCH_ITERS" in message
    for var in ("KILN_BENCH_ITERS", "KILN_LOGS", "KILN_DEBUG_DIR", "KILN_CACHE_DIR"):
        assert var in message
    assert config.bench.iters == 20


def test_other_env_vars_are_ignored_quietly():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config.reload_from_env({"PATH": "/bin", "MY_KILN_THING": "1", "KILN_BENCH_ITERS": "3"})
    assert config.bench.iters == 3


def test_a_secret_kiln_reads_itself_is_no_typo_and_no_setting():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config.reload_from_env({"KILN_REMOTE_CACHE_SECRET": "team secret", "KILN_REMOTE_CACHE": "redis://h"})
    assert config.cache.remote == "redis://h"
    assert "team secret" not in repr(config.as_dict()) and "team secret" not in config.describe()
    config.reload_from_env({})


def test_environment_applies_at_import():
    done = run_python("import kiln; print(kiln.config.bench.iters)", KILN_BENCH_ITERS="7")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "7"


def test_malformed_environment_fails_import():
    done = run_python("import kiln", KILN_BENCH_ITERS="lots")
    assert done.returncode != 0
    assert "KILN_BENCH_ITERS='lots'" in done.stderr and "an integer" in done.stderr


# --- types -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "group, field, value, type_name",
    [
        ("bench", "iters", "x", "int"),
        ("bench", "iters", True, "int"),
        ("bench", "iters", 2.0, "int"),
        ("bench", "timeout_s", "1", "float"),
        ("bench", "timeout_s", False, "float"),
        ("cache", "dir", None, "str"),
        ("debug", "dump_dir", 3, "str | None"),
        ("debug", "logs", ("graph", 1), "tuple[str, ...]"),
        ("debug", "logs", 5, "tuple[str, ...]"),
        ("toy", "flag", 1, "bool"),
        ("toy", "flag", "true", "bool"),
        ("toy", "limit", 1.0, "int | None"),
    ],
)
def test_assignment_type_error_names_setting_type_and_value(toy, group, field, value, type_name):
    target = config._GROUPS[group]
    before = getattr(target, field)
    with pytest.raises(TypeError) as info:
        setattr(target, field, value)
    message = str(info.value)
    assert f"{group}.{field}" in message
    assert f"expects {type_name}," in message
    assert repr(value) in message
    assert getattr(target, field) == before


def test_accepted_values_are_normalized(toy):
    config.bench.timeout_s = 5
    assert config.bench.timeout_s == 5.0 and type(config.bench.timeout_s) is float
    config.debug.logs = ["graph", "code"]
    assert config.debug.logs == ("graph", "code")
    config.debug.logs = "guards, breaks"
    assert config.debug.logs == ("guards", "breaks")
    config.debug.dump_dir = "/tmp/d"
    config.debug.dump_dir = None
    assert config.debug.dump_dir is None
    toy.flag = True
    assert toy.flag is True


# --- unknown names ---------------------------------------------------------------------------


def assert_unknown(info, name):
    message = str(info.value)
    assert repr(name) in message
    assert ACCEPTED in message


def test_unknown_field_assignment():
    with pytest.raises(AttributeError) as info:
        config.debug.nonexistent = 1
    assert_unknown(info, "debug.nonexistent")
    assert not hasattr(config.debug, "nonexistent")


def test_unknown_field_read():
    with pytest.raises(AttributeError) as info:
        config.bench.iterations  # noqa: B018
    assert_unknown(info, "bench.iterations")


@pytest.mark.parametrize("name", ["debug.nonexistent", "nogroup.x", "iters", ""])
def test_unknown_name_in_patch(name):
    with pytest.raises(AttributeError) as info:
        config.patch({name: 1})
    assert_unknown(info, name)


def test_unknown_name_suggests_close_match():
    with pytest.raises(AttributeError, match="did you mean 'bench.iters'"):
        config.patch({"bench.iter": 1})


# --- patch -----------------------------------------------------------------------------------


def test_patch_context_manager_sets_and_restores():
    with config.patch({"bench.iters": 5}, **{"debug.dump_dir": "/tmp/x"}):
        assert config.bench.iters == 5
        assert config.debug.dump_dir == "/tmp/x"
    assert config.bench.iters == 20
    assert config.debug.dump_dir is None


def test_patch_checks_and_converts_values():
    with config.patch({"debug.logs": "graph,code", "bench.timeout_s": 3}):
        assert config.debug.logs == ("graph", "code")
        assert type(config.bench.timeout_s) is float


def test_patch_decorator():
    seen = []

    @config.patch({"bench.warmup": 0})
    def body():
        seen.append(config.bench.warmup)

    assert config.bench.warmup == 3
    body()
    body()
    assert seen == [0, 0]
    assert config.bench.warmup == 3


def test_patch_decorator_recursion_restores_in_order():
    seen = []

    @config.patch({"bench.iters": 1})
    def body(depth):
        seen.append(config.bench.iters)
        config.bench.iters = 100 + depth
        if depth:
            body(depth - 1)
        seen.append(config.bench.iters)

    body(1)
    assert seen == [1, 1, 100, 101]
    assert config.bench.iters == 20


def test_patch_nesting():
    with config.patch({"bench.iters": 5}):
        with config.patch({"bench.iters": 6, "bench.warmup": 0}):
            assert (config.bench.iters, config.bench.warmup) == (6, 0)
        assert (config.bench.iters, config.bench.warmup) == (5, 3)
    assert (config.bench.iters, config.bench.warmup) == (20, 3)


def test_patch_restores_on_exception_and_undoes_assignments_inside():
    with pytest.raises(RuntimeError):
        with config.patch({"bench.iters": 5}):
            config.bench.iters = 8
            raise RuntimeError("boom")
    assert config.bench.iters == 20


def test_patch_is_all_or_nothing():
    with pytest.raises(TypeError, match="bench.warmup"):
        config.patch({"bench.iters": 5, "bench.warmup": "x"})
    with pytest.raises(AttributeError):
        config.patch({"bench.iters": 5, "bench.nope": 1})
    assert config.bench.iters == 20


def test_patch_decorator_checks_at_decoration():
    with pytest.raises(TypeError, match="bench.iters"):

        @config.patch({"bench.iters": "many"})
        def body():
            pass


# --- describe / as_dict ----------------------------------------------------------------------


def test_as_dict_reflects_current_values():
    with config.patch({"bench.iters": 4}):
        values = config.as_dict()
    assert values["bench.iters"] == 4
    assert set(values) == set(ACCEPTED.split(", "))


def test_describe_has_a_row_per_setting():
    with config.patch({"bench.iters": 4}):
        table = config.describe()
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["setting", "type", "value", "env"]
    for name, spec in config._all_specs().items():
        (row,) = [line for line in lines if line.startswith(name + " ")]
        assert spec.kind.name in row and spec.env in row and row.endswith(spec.help)
    (iters,) = [line for line in lines if line.startswith("bench.iters ")]
    assert iters.split()[:5] == ["bench.iters", "int", "4", "KILN_BENCH_ITERS", "timed"]
    assert repr(config.cache.dir) in table  # a string setting's value, quoted


def test_describe_hides_a_password_in_a_url():
    with config.patch({"cache.remote": "rediss://kiln:hunter2@cache.example:6380/1"}):
        table = config.describe()
        assert config.as_dict()["cache.remote"] == "rediss://kiln:hunter2@cache.example:6380/1"  # as set
    assert "hunter2" not in table and "'rediss://kiln:***@cache.example:6380/1'" in table
    with config.patch({"cache.remote": "redis://:p%40ss@cache.example"}):
        table = config.describe()
    assert "p%40ss" not in table and "'redis://:***@cache.example'" in table


# --- declaring groups ------------------------------------------------------------------------


def test_field_without_setting_is_rejected():
    with pytest.raises(TypeError, match="setting"):

        @config._group("bad")
        class Bad(config._Group):
            x: int = 1


def test_unsupported_type_is_rejected():
    with pytest.raises(TypeError, match="list"):

        @config._group("bad")
        class Bad(config._Group):
            x: list = setting((), env="KILN_BAD_X", help="h")


def test_env_name_needs_prefix():
    with pytest.raises(ValueError, match="KILN_"):
        setting(1, env="BAD_X", help="h")


def test_changed_lists_the_settings_off_their_defaults():
    with config.patch({"backend.cpp_wrapper": False}):
        changed = config.changed()
    assert changed["backend.cpp_wrapper"] is False
    assert "backend.freezing" not in changed and "backend.cpp_wrapper" not in config.changed()
