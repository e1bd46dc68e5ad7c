"""`kiln bench-launch`: host microseconds per Triton launch, through Triton and direct, here under
the stand-in CUDA driver (benchmarks/standin_driver.py)."""

import pytest

from kiln import config
from kiln.cli import main
from benchmarks.launch_cost import PATHS, measure, table
from benchmarks.standin_driver import standin_cuda
from kiln.runtime.triton_kernels import binary_cache


def test_measure_times_both_paths_of_a_graph(tmp_path):
    with config.patch({"cache.dir": str(tmp_path)}), standin_cuda(), binary_cache():
        cost = measure("pointwise", passes=5, rounds=2, on_gpu=False)
    assert cost.kernels == 2 and cost.launches == 2 and cost.gpu_us is None
    # Timings are measured, not asserted against each other (a loaded machine reorders them).
    assert all(0 < cost.host_us[path] < 1e5 for path in PATHS)
    assert table([cost]).splitlines()[1].split()[:3] == ["pointwise", "2", "2"]


def test_command_rejects_an_unknown_graph(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench-launch", "--graphs", "pointwise,nope"])
    assert exit_.value.code != 0
    assert "unknown nope" in capsys.readouterr().err
