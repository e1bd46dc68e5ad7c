"""kiln.logs: artifact switches, output through logging, and per-graph dump folders."""

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import kiln
from kiln import config, logs, trace

REPO = Path(kiln.__file__).resolve().parents[1]
BUILTIN = {"graph", "guards", "breaks", "recompiles", "aot", "passes", "ir", "fusion", "code",
           "cache", "bench", "freezing", "autotune"}


@pytest.fixture(autouse=True)
def isolate(monkeypatch):
    # Settings, the artifact registry and the per-process run folder all go back after each test.
    monkeypatch.setattr(logs, "_ARTIFACTS", dict(logs._ARTIFACTS))
    monkeypatch.setattr(logs, "_LOGGERS", dict(logs._LOGGERS))
    monkeypatch.setattr(trace, "_run", None)
    with config.patch(config.as_dict()):
        config.reload_from_env({})
        yield


def run_python(code, **env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    clean["PYTHONPATH"] = os.pathsep.join([str(REPO), clean.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True
    )


# --- switching artifacts on ------------------------------------------------------------------


def test_builtin_artifacts_have_help():
    registered = logs.artifacts()
    assert BUILTIN <= set(registered)
    assert all(isinstance(text, str) and text for text in registered.values())


def test_all_off_by_default():
    assert logs.enabled_artifacts() == frozenset()
    assert not any(logs.enabled(name) for name in BUILTIN)


def test_set_logs_string_updates_config():
    logs.set_logs("graph, code")
    assert config.debug.logs == ("graph", "code")
    assert logs.enabled("graph") and logs.enabled("code")
    assert not logs.enabled("guards")


def test_set_logs_list_and_off():
    logs.set_logs(["guards"])
    assert logs.enabled("guards") and not logs.enabled("graph")
    logs.set_logs([])
    assert not logs.enabled("guards")


def test_all_enables_everything_including_later_artifacts():
    logs.set_logs("all")
    assert logs.enabled_artifacts() >= BUILTIN
    logs.register_artifact("later_artifact", "registered after set_logs('all')")
    assert logs.enabled("later_artifact")


def test_set_logs_rejects_unknown_names_and_changes_nothing():
    logs.set_logs("graph")
    with pytest.raises(ValueError) as info:
        logs.set_logs("code,grpah")
    message = str(info.value)
    assert "'grpah'" in message and "did you mean 'graph'" in message
    assert "valid names: all, " + ", ".join(sorted(logs.artifacts())) in message
    assert config.debug.logs == ("graph",)


def test_set_logs_rejects_non_strings():
    with pytest.raises(TypeError, match="set_logs"):
        logs.set_logs(["graph", 3])


def test_enabled_rejects_unknown_name():
    with pytest.raises(ValueError, match="'grafh'.*valid names"):
        logs.enabled("grafh")


def test_bad_name_in_config_is_reported_at_use():
    config.debug.logs = ("nonsense",)
    with pytest.raises(ValueError, match="'nonsense' in KILN_LOGS"):
        logs.enabled("graph")


def test_bad_name_in_env_fails_with_clear_message():
    done = run_python("import kiln.logs; kiln.logs.log('graph', 'hi')", KILN_LOGS="graph,nonsense")
    assert done.returncode != 0
    assert "unknown log artifact 'nonsense' in KILN_LOGS" in done.stderr
    assert "valid names: all, aot, autotune, bench" in done.stderr


def test_env_switches_artifacts_on_and_prints_to_stderr():
    code = "import kiln.logs as l; l.log('graph', 'captured %d nodes', 3); l.log('code', 'src')"
    done = run_python(code, KILN_LOGS="graph")
    assert done.returncode == 0, done.stderr
    assert done.stderr == "[kiln:graph] captured 3 nodes\n"


def test_register_artifact_validates():
    for bad in ("Bad", "all", "", "a-b", "1x"):
        with pytest.raises(ValueError):
            logs.register_artifact(bad, "help")
    with pytest.raises(ValueError, match="already registered"):
        logs.register_artifact("graph", "something else")
    logs.register_artifact("graph", logs.artifacts()["graph"])  # same again: allowed
    logs.register_artifact("newly_named", "candidate kernels")
    logs.set_logs("newly_named")
    assert logs.enabled("newly_named")


# --- output ----------------------------------------------------------------------------------


def test_enabled_artifact_reaches_caplog(caplog):
    logs.set_logs("graph")
    logs.log("graph", "captured %d nodes", 3)
    (record,) = [r for r in caplog.records if r.name.startswith("kiln")]
    assert record.name == "kiln.graph"
    assert record.levelno == logging.INFO
    assert record.getMessage() == "captured 3 nodes"
    assert record.filename == "test_logs.py"  # points at the caller, not at kiln/logs.py


def test_disabled_artifact_writes_nothing(caplog, capsys):
    logs.set_logs("graph")
    logs.log("code", "generated %s", "source")
    assert [r for r in caplog.records if r.name.startswith("kiln")] == []
    assert capsys.readouterr().err == ""


def test_handler_prints_artifact_prefix(capsys):
    logs.set_logs("fusion")
    logs.log("fusion", "fused %d kernels", 2)
    assert capsys.readouterr().err == "[kiln:fusion] fused 2 kernels\n"


def test_handler_is_installed_once():
    logs._install_handler()
    logs._install_handler()
    ours = [h for h in logging.getLogger("kiln").handlers if getattr(h, "is_kiln_handler", False)]
    assert len(ours) == 1
    assert logging.getLogger("kiln").propagate


def test_log_lazy_calls_fn_only_when_enabled(caplog):
    calls = []

    def render():
        calls.append(1)
        return "big graph"

    logs.log_lazy("graph", render)
    assert calls == []
    logs.set_logs("graph")
    logs.log_lazy("graph", render)
    assert calls == [1]
    assert [r.getMessage() for r in caplog.records if r.name == "kiln.graph"] == ["big graph"]


# --- dump folders ----------------------------------------------------------------------------


def test_no_dump_dir_no_folder(tmp_path):
    assert logs.dump_folder("forward") is None
    assert list(tmp_path.iterdir()) == []


def test_dump_folders_are_numbered_per_run(tmp_path):
    config.debug.dump_dir = str(tmp_path)
    first = logs.dump_folder("forward")
    second = logs.dump_folder("my model/fwd <1>")
    run = first.path.parent
    assert second.path.parent == run
    assert run.parent == tmp_path
    assert re.fullmatch(rf"run_{os.getpid()}_\d{{8}}-\d{{6}}", run.name)
    assert first.path.name == "000_forward"
    assert second.path.name == "001_my_model_fwd_1"
    assert first.path.is_dir() and second.path.is_dir()


def test_new_dump_dir_gets_its_own_run(tmp_path):
    config.debug.dump_dir = str(tmp_path / "a")
    logs.dump_folder("x")
    config.debug.dump_dir = str(tmp_path / "b")
    folder = logs.dump_folder("y")
    assert folder.path.parent.parent == tmp_path / "b"
    assert folder.path.name == "000_y"


def test_run_folder_never_reuses_an_existing_one(tmp_path, monkeypatch):
    monkeypatch.setattr(trace.time, "strftime", lambda fmt: "20250101-000000")
    taken = tmp_path / f"run_{os.getpid()}_20250101-000000"
    taken.mkdir()
    config.debug.dump_dir = str(tmp_path)
    folder = logs.dump_folder("g")
    assert folder.path.parent.name == taken.name + "_1"


def test_files_are_numbered_in_write_order(tmp_path):
    config.debug.dump_dir = str(tmp_path)
    folder = logs.dump_folder("forward")
    paths = [
        folder.write("captured_graph.py", "graph 0"),
        folder.write("aten forward.py", "graph 1"),
        folder.write("ir/before fusion.txt", "graph 2"),
    ]
    names = ["00_captured_graph.py", "01_aten_forward.py", "02_ir_before_fusion.txt"]
    assert [p.name for p in paths] == names
    assert sorted(p.name for p in folder.path.iterdir()) == names  # no temp files left
    assert [p.read_text() for p in paths] == ["graph 0", "graph 1", "graph 2"]


def test_names_cannot_escape_the_folder(tmp_path):
    config.debug.dump_dir = str(tmp_path)
    folder = logs.dump_folder("../../etc")
    assert folder.path.parent.parent == tmp_path
    path = folder.write("../../passwd", "x")
    assert path.parent == folder.path
    assert folder.write("...", "y").name == "01_unnamed"


def test_failed_write_leaves_no_temp_file(tmp_path, monkeypatch):
    config.debug.dump_dir = str(tmp_path)
    folder = logs.dump_folder("forward")

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(logs.os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        folder.write("code.cpp", "int main() {}")
    assert list(folder.path.iterdir()) == []


def test_write_rejects_non_text(tmp_path):
    config.debug.dump_dir = str(tmp_path)
    folder = logs.dump_folder("forward")
    with pytest.raises(TypeError, match="str"):
        folder.write("graph.py", b"bytes")
