"""The HTML compile report (`KILN_TRACE`, kiln/trace/): what it records, and the page as a browser
shows it — headless Chromium, installed by `make setup`, loads it from disk, runs its script, and
the test reads the DOM the browser built and the console messages it printed."""

from __future__ import annotations

import html
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import kiln
from kiln import config, trace


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x):
        y = torch.nn.functional.gelu(self.lin(x))
        if y.sum() > 0:  # the planted break: a branch on a tensor's value
            y = y * 2
        return self.norm(y + x).tanh()


BREAK_LINE = "if y.sum() > 0:  # the planted break: a branch on a tensor's value"


@pytest.fixture
def traced(tmp_path):
    """The report of a module with one graph break, called at two sizes (one recompile)."""
    kiln.reset()
    trace.reset()
    model = _Block().eval()
    compiled = kiln.compile(model, options={"trace": str(tmp_path / "trace")})
    with torch.no_grad():
        for rows in (4, 6):
            x = torch.randn(rows, 32)
            torch.testing.assert_close(compiled(x), model(x))
    pages = list((tmp_path / "trace").glob("run_*/index.html"))
    assert len(pages) == 1, pages
    yield pages[0], list(trace.EVENTS)
    trace.reset()


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "chromium is missing: `make setup` installs it (apt-get install chromium)"
    return found


def _browse(page: Path, tmp_path: Path, screenshot: Path | None = None) -> tuple[str, list[str]]:
    """(the DOM after the page's scripts ran, the console messages) from headless Chromium."""
    args = [_chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
            f"--user-data-dir={tmp_path / 'chromium-profile'}"]
    if screenshot is not None:
        args += ["--window-size=1400,1800", f"--screenshot={screenshot}"]
    else:
        args += ["--dump-dom"]
    done = subprocess.run([*args, page.resolve().as_uri()], capture_output=True, text=True, timeout=120)
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return done.stdout, console


def test_the_journal_holds_each_stage(traced):
    _, events = traced
    kinds = [e.kind for e in events]
    entries = [e.fields for e in events if e.kind == "entry"]
    assert any(e["frame"] == "_Block.forward" and e["entry"] == 2 for e in entries), entries
    breaks = [e.fields for e in events if e.kind == "break"]
    assert breaks and all(b["source"] == BREAK_LINE and b["resumed"] for b in breaks)
    recompiles = [e.fields for e in events if e.kind == "recompile"]
    assert any("TENSOR_MATCH" in r["reason"] and "size=(4, 32)" in r["reason"] for r in recompiles), recompiles
    listings = [e.fields for e in events if e.kind == "kernels"]
    assert listings and all(k["code"] and k["function"] in k["code"] for listing in listings for k in listing["kernels"])
    assert "compile_time" in kinds and "dump" in kinds


def test_the_page_in_a_browser(traced, tmp_path):
    page, events = traced
    dom, console = _browse(page, tmp_path)
    assert console == [], console  # no error, and the page logs nothing else
    text = html.unescape(dom)
    assert BREAK_LINE in text
    reason = next(e.fields["reason"] for e in events if e.kind == "recompile" and e.fields["frame"] == "_Block.forward")
    assert reason in text
    kernel = next(k for e in events if e.kind == "kernels" for k in e.fields["kernels"])
    assert kernel["code"].strip() in text  # a kernel's whole generated code
    assert kernel["loops"] in text
    assert "pass <b>gemm_prepack</b>" in dom  # a pass that changed the graph, as a diff
    assert "blocks</b>" in dom  # the page's script ran (it counts the collapsible blocks)
    shot = tmp_path / "report.png"
    _browse(page, tmp_path, screenshot=shot)
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one


def test_a_console_error_is_seen(tmp_path):
    # The check above can fail: a page whose script throws is caught by the same reading.
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><body><script>notDefinedAnywhere();</script></body></html>")
    _, console = _browse(page, tmp_path)
    assert any("notDefinedAnywhere" in line for line in console), console


def test_the_setting_and_the_cache(tmp_path):
    """`KILN_TRACE` (debug.trace_dir) traces every compile of the process; the AOT graph cache is
    not read under it (a cached graph has no stages to show), and nothing is traced without it."""
    kiln.reset()
    trace.reset()

    def f(x):
        return (x.sin() * 2).sum(-1)

    x = torch.randn(8, 8)
    kiln.compile(f)(x)  # the AOT cache now holds f's graph
    assert trace.EVENTS == []
    kiln.reset()
    with config.patch({"debug.trace_dir": str(tmp_path / "t")}):
        kiln.compile(f)(x)
        page = trace.write_report()
    assert page is not None and page.parent.parent == tmp_path / "t"
    trees = [e.fields["tree"] for e in trace.EVENTS if e.kind == "compile_time"]
    assert any("AOT graph cache not read" in t and "lowering" in t for t in trees), trees
    assert any(e.kind == "kernels" for e in trace.EVENTS)
    trace.reset()


def test_a_bad_option():
    with pytest.raises(TypeError, match=r"options\['trace'\] must be a folder"):
        kiln.compile(lambda x: x, options={"trace": 3})


def test_a_report_that_fails_never_fails_the_model(tmp_path, monkeypatch):
    import kiln.trace.html as page

    def broken(*args):
        raise RuntimeError("planted")

    monkeypatch.setattr(page, "render", broken)
    kiln.reset()
    trace.reset()
    monkeypatch.setattr(trace, "_failed", False)
    x = torch.randn(4, 4)
    with config.patch({"debug.trace_dir": str(tmp_path)}), pytest.warns(RuntimeWarning, match="could not be written.*planted"):
        out = kiln.compile(lambda t: t.cos() + 1)(x)
    torch.testing.assert_close(out, x.cos() + 1)
    trace.reset()
