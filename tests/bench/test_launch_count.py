"""Launches and waits per call (benchmarks/launch_count.py): the tally from profiler events, and
the report's columns. Counting on a real GPU is tests/gpu/test_cuda.py's."""

from benchmarks.launch_count import tally
from benchmarks.report import detail_columns
from benchmarks.results import Case, Result


def test_launches_and_waits_are_told_apart_per_call():
    events = [("cudaLaunchKernel", 12), ("cuLaunchKernelEx", 6), ("cudaGraphLaunch", 3), ("cudaMemcpyAsync", 9),
              ("cudaStreamSynchronize", 3), ("cudaMemcpy", 3), ("aten::mm", 30), ("cudaEventRecord", 6)]
    assert tally(events, 3) == (7.0, 2.0)
    assert tally([], 1) == (0.0, 0.0)


def test_the_report_shows_launch_counts_where_a_case_has_them():
    case = Case(model="gpt2", mode="kiln", threads=2, device="cuda")
    counted = Result(case=case, status="ok", launches=143.0, waits=0.0, peer_launches=97.0, peer_waits=0.0)
    names = [name for name, _ in detail_columns([counted])]
    assert {"launches", "waits", "peer launches", "peer waits"} <= set(names)
    shown = dict((name, cell(counted)) for name, cell in detail_columns([counted]))
    assert shown["launches"] == "143" and shown["peer waits"] == "0.0"
    assert "launches" not in [name for name, _ in detail_columns([Result(case=case, status="ok")])]
    assert Result.from_json(counted.to_json()).peer_launches == 97.0
