"""kiln.explain: graphs, ops, breaks (kind, user's file:line, explanation, hint), guards, recompiles."""

import pytest
import torch

import kiln


def two_graphs(x):
    y = x.sin() * 2
    print("y", y.shape)
    return y.cos()


def test_explain_reports_graphs_ops_breaks_and_guards(capsys):
    kiln.reset()
    report = kiln.explain(two_graphs, torch.randn(3))
    assert report.graph_count == 2 and report.break_count == 1 and not report.recompiles
    assert report.graphs[0].ops == [".sin", "mul"] and report.graphs[1].ops == [".cos"]
    assert report.graphs[1].frame == "two_graphs (resumed at line 11)"
    (record,) = report.breaks
    assert (record.kind, record.filename, record.lineno) == ("unsupported_call", __file__, two_graphs.__code__.co_firstlineno + 2)
    assert record.hint and report.graphs[0].ended_by == record
    assert any(g.startswith("TENSOR_MATCH") and "L['x']" in g for g in report.graphs[0].guards)
    printed = capsys.readouterr().out
    assert "2 graph(s), 1 graph break(s), 0 recompile(s)" in printed
    assert f"{__file__}:{two_graphs.__code__.co_firstlineno + 2}" in printed and "hint:" in printed


def test_explain_reports_recompiles_and_eager_frames(capsys):
    def loop(x):
        for i in range(3):
            x = x + i
            print(i)
        return x

    def in_try(x):
        try:
            print(x)
        finally:
            x = x + 1
        return x

    kiln.reset()
    report = kiln.explain(loop, torch.ones(2))
    # The loop's resume function is entered with i = 0, 1, 2 (and 2, 1, 0 items left): each
    # entry after the first recompiles; the last returns x and has no graph.
    assert report.graph_count == 3 and len(report.recompiles) == 2 and "EQUALS           L['i']  == 0" in report.recompiles[0]
    report = kiln.explain(in_try, torch.ones(2))
    assert report.graph_count == 0 and [r.resumed for r in report.breaks] == [False]
    assert "inside a try block" in report.breaks[0].explanation


def test_explain_rejects_what_is_not_callable():
    with pytest.raises(TypeError, match="fn must be"):
        kiln.explain(3)


def test_explain_lists_the_frozen_weight_writes_kiln_cannot_see(capsys):
    model = torch.nn.Linear(4, 4).eval()
    with torch.no_grad():
        report = kiln.explain(model, torch.randn(2, 4))
    assert any("kiln.refreeze(model)" in note and ".data` of a buffer" in note for note in report.notes)
    assert "Notes:" in capsys.readouterr().out
    with kiln.config.patch({"backend.freezing": False}):
        assert kiln.explain(model, torch.randn(2, 4)).notes == []
    assert kiln.explain(lambda x: x + 1, torch.randn(2)).notes == []


def test_explain_says_what_kiln_does_to_malloc(capsys, monkeypatch):
    from kiln import heap

    monkeypatch.setattr(heap, "_decision", None)  # (as in a process that has run no compiled graph)
    report = kiln.explain(two_graphs, torch.randn(3))
    assert report.malloc.startswith("left alone (runtime.keep_freed_mb = 0, the default")
    assert "malloc: left alone" in capsys.readouterr().out
    monkeypatch.setattr(heap, "_decision", heap.Decision(True, 64, "set"))
    with kiln.config.patch({"runtime.keep_freed_mb": 64}):
        report = kiln.explain(two_graphs, torch.randn(3))
    assert "up to 64 MiB of freed heap kept (runtime.keep_freed_mb = 64)" in report.malloc
