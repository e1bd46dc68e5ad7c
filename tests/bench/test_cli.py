"""`kiln bench` rejects bad input before any model runs, naming what is accepted."""

import os
import pytest

import benchmarks.cli
import kiln
import benchmarks.runner
from benchmarks.runner import run_cases  # before the fixture below replaces the module's
from kiln.cli import main


@pytest.fixture(autouse=True)
def no_model_may_run(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("a model ran although the arguments were bad")

    monkeypatch.setattr(benchmarks.runner, "run_cases", forbidden)


def _error(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exit:
        main(["bench", *argv])
    assert exit.value.code == 2
    return capsys.readouterr().err


def test_unknown_model_lists_valid_ones(capsys):
    err = _error(capsys, "--models", "bert,nosuch")
    assert "unknown model 'nosuch'" in err and "distilbert" in err and "mlp" in err


def test_unknown_suite_lists_valid_ones(capsys):
    err = _error(capsys, "--suite", "huge")
    assert "unknown suite 'huge'" in err and "hf, gpu, wide, smoke, unit" in err


def test_unknown_mode_lists_valid_ones(capsys):
    err = _error(capsys, "--modes", "eager,turbo")
    assert "unknown mode 'turbo'" in err and "inductor-freeze" in err and "kiln-aot-eager" in err


@pytest.mark.parametrize("threads", ["0", "two", "1,,-1", ""])
def test_bad_thread_counts(capsys, threads):
    assert "--threads takes positive integers" in _error(capsys, "--models", "mlp", "--threads", threads)


def test_bad_iteration_counts(capsys):
    assert "--iters must be >= 1" in _error(capsys, "--models", "mlp", "--iters", "0")


def test_autocast_names_its_choices(capsys):
    assert "invalid choice: 'fp8'" in _error(capsys, "--models", "mlp", "--autocast", "fp8")


@pytest.mark.parametrize("argv, named", [
    (["--dtype", "fp8"], "argument --dtype: invalid choice: 'fp8' (choose from fp32, bf16)"),
    (["--dtype", "bfloat16"], "argument --dtype: invalid choice: 'bfloat16'"),
    (["--batch", "0"], "argument --batch: takes a positive integer, e.g. 8 (got '0')"),
    (["--batch", "eight"], "argument --batch: takes a positive integer"),
    (["--jobs", "-1"], "argument --jobs: takes a positive integer, e.g. 8 (got '-1')"),
    (["--jobs", "1.5"], "argument --jobs: takes a positive integer"),
    (["--dtype", "bf16", "--autocast", "bf16"], "--autocast bf16 and --dtype bf16: choose one"),
    (["--case-logs", "/no/such/folder"], "--case-logs '/no/such/folder' is not an existing folder"),
])
def test_bad_dtype_batch_and_jobs_name_the_argument_and_what_it_accepts(capsys, argv, named):
    err = _error(capsys, "--models", "mlp", *argv)
    assert named in err.replace("'fp32', 'bf16'", "fp32, bf16")  # (Python 3.12's argparse quotes choices)


@pytest.mark.parametrize("flag", [["--dtype", "bf16"], ["--batch", "8"], ["--jobs", "2"]])
def test_the_gemm_suite_refuses_what_applies_to_models_only(capsys, flag):
    assert f"{flag[0]} does not apply to --suite gemm" in _error(capsys, "--suite", "gemm", *flag)


def _cases(monkeypatch, *argv):
    """The cases and run_cases' keywords that `kiln bench --models mlp --modes kiln ARGV` asks for."""
    seen = []
    monkeypatch.setattr(benchmarks.runner, "run_cases", lambda cases, *args, **kwargs: seen.append((cases, kwargs)) or [])
    assert main(["bench", "--models", "mlp", "--modes", "kiln", *argv]) == 0
    return seen[0]


def test_dtype_batch_jobs_and_mixed_precision_training_reach_the_cases(monkeypatch):
    (case,), kwargs = _cases(monkeypatch, "--dtype", "bf16", "--batch", "8", "--jobs", "3")
    assert (case.dtype, case.batch, case.autocast, case.train) == ("bfloat16", 8, None, False)
    assert kwargs["jobs"] == 3
    (case,), _ = _cases(monkeypatch, "--train", "--autocast", "bf16", "--batch", "2")  # AMP training: float32 weights
    assert (case.dtype, case.batch, case.autocast, case.train) == (None, 2, "bfloat16", True)
    (case,), kwargs = _cases(monkeypatch, "--dtype", "fp32")
    assert (case.dtype, case.batch, kwargs["jobs"]) == (None, 1, 1)  # the defaults: as before


def test_output_folder_must_exist(capsys, tmp_path):
    err = _error(capsys, "--models", "mlp", "--json", str(tmp_path / "missing" / "run.json"))
    assert "does not exist" in err


def test_output_may_not_be_a_directory(capsys, tmp_path):
    (tmp_path / "run.md").mkdir()
    assert "is a directory" in _error(capsys, "--models", "mlp", "--markdown", str(tmp_path / "run.md"))


def test_plot_must_be_png(capsys, tmp_path):
    assert "must name a .png file" in _error(capsys, "--models", "mlp", "--plot", str(tmp_path / "run.jpg"))


def test_unwritable_output(capsys, tmp_path, monkeypatch):
    # CI runs as root, who may write anywhere; so the permission answer is what we stand in for.
    monkeypatch.setattr(benchmarks.cli.os, "access", lambda path, mode: False)
    assert "cannot be written" in _error(capsys, "--models", "mlp", "--json", str(tmp_path / "run.json"))


def test_unknown_log_artifact_is_rejected_at_start(capsys):
    with kiln.config.patch({"debug.logs": "bench,grpah"}):
        err = _error(capsys, "--models", "mlp")
    assert "unknown log artifact 'grpah'" in err and "graph" in err


def test_report_of_a_missing_run(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit:
        main(["report", str(tmp_path / "none.json")])
    assert exit.value.code == 2 and "cannot read the run" in capsys.readouterr().err


@pytest.mark.parametrize("argv, named", [(["--batches", "1,0"], "--batches"), (["--seqs", "16,x"], "--seqs"),
                                         (["--models", "nosuch"], "unknown model 'nosuch'"),
                                         (["--dynamic", "yes"], "--dynamic")])
def test_many_shapes_refuses_bad_arguments_naming_them(capsys, argv, named):
    with pytest.raises(SystemExit) as exit:
        main(["many-shapes", *argv])
    assert exit.value.code == 2 and named in capsys.readouterr().err


def test_call_overhead_refuses_an_unknown_model_naming_it(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["call-overhead", "--models", "nosuch"])
    assert exit.value.code == 2 and "unknown model 'nosuch'" in capsys.readouterr().err


@pytest.mark.parametrize("prebuilt", [True, False])
def test_cold_cases_share_kilns_runtime_built_once_up_front_unless_prebuilt(monkeypatch, prebuilt):
    from benchmarks.results import Case, Result
    from kiln.native import prebuild

    monkeypatch.delenv("KILN_RUNTIME_CACHE_DIR", raising=False)
    monkeypatch.setattr(prebuild, "missing", lambda: [] if prebuilt else ["runtime"])
    built, seen = [], []
    monkeypatch.setattr(benchmarks.runner, "_build_kiln_runtime", built.append)

    def run_one(case, timeout_s, cold_cache):
        seen.append(os.environ.get("KILN_RUNTIME_CACHE_DIR"))
        return Result(case, "ok")

    cases = [Case("mlp", "kiln", 1), Case("mlp", "eager", 1), Case("bert", "kiln", 1)]
    run_cases(cases, 60.0, cold_cache=True, run_one=run_one)
    if prebuilt:  # as after a user's set-up: the cases find kiln's libraries where it put them
        assert built == [] and seen == [None] * 3
    else:
        assert len(built) == 1 and seen == [built[0]] * 3  # one build, every case on its folder
    assert "KILN_RUNTIME_CACHE_DIR" not in os.environ  # and the variable gone after the run


def test_against_names_the_peer_modes_it_accepts(capsys):
    err = _error(capsys, "--models", "mlp", "--modes", "kiln", "--against", "turbo")
    assert "unknown --against mode 'turbo'" in err and "inductor-freeze" in err
    assert "--against inductor-freeze: " in _error(capsys, "--models", "mlp", "--modes", "kiln", "--against",
                                                   "inductor-freeze", "--train")


def test_against_pairs_every_compiled_case_but_eager_and_the_peer_itself():
    import argparse

    args = argparse.Namespace(models="mlp", suite="hf", modes="eager,kiln,inductor-freeze", threads="1", iters=2,
                              warmup=0, timeout=10.0, train=False, autocast=None, profile=False, device="cpu",
                              dtype="fp32", batch=1,
                              against="inductor-freeze")
    cases = benchmarks.cli.select_cases(args)
    assert {c.mode: c.against for c in cases} == {"eager": None, "kiln": "inductor-freeze", "inductor-freeze": None}


def test_the_benchmark_commands_are_the_same_installed_or_not():
    import tomllib
    from pathlib import Path

    from benchmarks import COMMANDS

    pyproject = tomllib.loads((Path(benchmarks.__file__).parents[1] / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"]["kiln.commands"] == COMMANDS
    with pytest.raises(SystemExit) as done:  # `python -m benchmarks`: added without entry points
        main(["bench-launch", "--help"], extra=COMMANDS)
    assert done.value.code == 0
