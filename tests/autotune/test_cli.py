"""`kiln autotune WORKLOAD`: the workload is the user's function, named on the command line."""

import pytest
import torch

import kiln
from kiln.autotune.cli import load_workload, main, add_command


def test_a_workload_is_a_function_in_a_file_or_a_module(tmp_path):
    script = tmp_path / "mine.py"
    script.write_text("import torch\n"
                      "def workload(width='8'):\n"
                      "    return [('linear', torch.nn.Linear(int(width), 4), (torch.randn(2, int(width)),))]\n"
                      "def other():\n    return []\n")
    ((name, model, inputs),) = load_workload(str(script))("16")
    assert name == "linear" and model.in_features == 16 and inputs[0].shape == (2, 16)
    assert load_workload(f"{script}:other")() == []
    assert load_workload("benchmarks.models:workload") is not None
    with pytest.raises(ValueError, match="has no function 'nothing'"):
        load_workload(f"{script}:nothing")
    with pytest.raises(ValueError, match="does not exist"):
        load_workload(str(tmp_path / "absent.py"))
    with pytest.raises(ValueError, match="cannot be imported"):
        load_workload("no_such_package.models:workload")


def test_the_command_tunes_each_model_of_the_workload(tmp_path, capsys):
    import argparse

    script = tmp_path / "mine.py"
    script.write_text("import torch\n"
                      "def workload():\n"
                      "    return [('mlp', torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU()).eval(),"
                      " {'input': torch.randn(4, 32)})]\n")
    parser = argparse.ArgumentParser(prog="kiln")
    add_command(parser.add_subparsers())
    args = parser.parse_args(["autotune", str(script), "--threads", "1"])
    threads = torch.get_num_threads()
    with kiln.config.patch({"cache.dir": str(tmp_path / "cache")}):
        assert main(args, parser) == 0
    assert torch.get_num_threads() == threads
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| mlp |")]
    assert int(row.strip("|").split("|")[2]) + int(row.strip("|").split("|")[3]) > 0  # the product asked
