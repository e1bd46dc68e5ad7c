"""benchmarks/tools/attention_sweep.py: kiln's attention kernel per build on a decode step's shapes."""
import shutil

import pytest

from benchmarks.tools import attention_sweep
from kiln.native import INCLUDE


def test_each_build_and_atens_kernel_are_timed_at_each_key_count(capsys, tmp_path):
    before = tmp_path / "before.h"
    shutil.copy(INCLUDE / attention_sweep.HEADER, before)  # (the same text: the same library, no second build)
    attention_sweep.main(["--keys", "5,40", "--layers", "2", "--cache", "64", "--rounds", "1", "--threads", "1",
                          "--warm", "--aten", f"header={before}"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("2 key-value heads of 7 query rows, head size 64, 2 layers, 1 threads, caches warm")
    for line, keys in zip(lines[1:], (5, 40)):
        label, timed = line.split(": ")
        assert label == f"{keys} keys"
        names = [t.rsplit(" ", 1)[0] for t in timed.split("; ")]
        assert names == ["default", f"header={before}", "aten"]
        assert all(float(t.rsplit(" ", 1)[1]) > 0 for t in timed.split("; "))


@pytest.mark.parametrize("argv,message", [
    (["KILN_KEYS_AHEAD=8+oops"], "a build is KILN_* macros and header=PATH joined by '+', got 'KILN_KEYS_AHEAD=8+oops'"),
    (["header=/no/such/file.h"], "header=/no/such/file.h: no such file"),
    (["--keys", "10,5000"], "--keys: each between 1 and --cache (4096), got '10,5000'"),
])
def test_bad_arguments_are_refused_by_name(argv, message, capsys):
    with pytest.raises(SystemExit):
        attention_sweep.main(argv)
    assert message in capsys.readouterr().err
