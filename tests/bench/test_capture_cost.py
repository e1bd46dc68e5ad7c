"""`kiln capture-cost`: capture time, guard count and per-call overhead of kiln.compile."""

import subprocess
import sys

from benchmarks.capture_cost import measure


def test_measure_reports_one_graph_and_its_costs():
    r = measure("mlp")
    assert r["ops"] >= 3 and r["guards"] >= 3
    # Timings are measured, not asserted (a loaded machine reorders them): each was taken.
    assert all(0 < r[k] < 1e6 for k in ("guard_check_us", "dispatch_us", "call_overhead_us"))
    assert r["capture_s"] > 0


def test_command_prints_a_table_and_rejects_an_unknown_suite():
    ok = subprocess.run([sys.executable, "-m", "kiln.cli", "capture-cost", "--models", "mlp"], capture_output=True, text=True, timeout=600)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines()[0].startswith("| model | capture s") and "| mlp |" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "kiln.cli", "capture-cost", "--suite", "nope"], capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "unknown suite 'nope'" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "kiln.cli", "capture-cost", "--models", "mlp,nope"], capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "unknown model 'nope'" in bad.stderr and "bert" in bad.stderr
