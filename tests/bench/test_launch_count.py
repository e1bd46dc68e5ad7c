"""Launches and waits per call (benchmarks/launch_count.py): the tally from profiler events, and
the report's columns. Counting on a real GPU is tests/gpu/test_cuda.py's."""

from types import SimpleNamespace

from benchmarks.launch_count import STEP, inside_steps, tally
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


def test_only_what_the_calls_did_counts():
    """The profiler's own synchronize when it stops (after the last call) is no wait of the calls'."""
    Event = SimpleNamespace
    span = lambda start, end: SimpleNamespace(start=start, end=end)  # noqa: E731
    events = [Event(name=STEP, time_range=span(0, 10)), Event(name="cudaLaunchKernel", time_range=span(2, 3)),
              Event(name=STEP, time_range=span(20, 30)), Event(name="cudaGraphLaunch", time_range=span(25, 26)),
              Event(name="cudaDeviceSynchronize", time_range=span(31, 40))]
    assert tally(inside_steps(events), 2) == (1.0, 0.0)
