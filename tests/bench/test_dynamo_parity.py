"""`kiln dynamo-parity`: test files written as Dynamo's are run under Dynamo and with Dynamo's entry
points given to kiln, and each outcome classified. The files here are written for these tests
(PyTorch's own stay out of this repository)."""

import json
import textwrap

import pytest

from benchmarks import dynamo_parity
from benchmarks.dynamo_parity import FileRow, classify, compare
from kiln.cli import main

DYNAMO_STYLE = textwrap.dedent('''
    import torch
    import torch._dynamo
    import torch._dynamo.test_case
    import torch._dynamo.testing
    from torch._dynamo.testing import CompileCounter, same


    def f(x):
        return x.sin() + 1


    def g(a, b):
        return a * b - 2


    class Tests(torch._dynamo.test_case.TestCase):
        def test_optimize_counts_one_frame(self):
            cnt = CompileCounter()
            opt = torch._dynamo.optimize(cnt, nopython=True)(f)
            x = torch.randn(4)
            self.assertTrue(same(opt(x), f(x)))
            self.assertEqual(cnt.frame_count, 1)

        def test_compile_fullgraph(self):
            opt = torch.compile(f, backend="eager", fullgraph=True)
            x = torch.randn(3)
            self.assertEqual(opt(x), f(x))

        def test_standard(self):
            torch._dynamo.testing.standard_test(self, fn=g, nargs=2)

        def test_dynamo_counters(self):
            torch._dynamo.utils.counters.clear()
            torch.compile(f, backend="eager")(torch.randn(2))
            self.assertEqual(torch._dynamo.utils.counters["stats"]["unique_graphs"], 1)

        def test_export(self):
            gm, guards = torch._dynamo.export(f)(torch.randn(2))
            self.assertIsNotNone(gm)

        def test_fails_under_both(self):
            self.assertEqual(1, 2)
''')

OLD_STYLE = textwrap.dedent('''
    import torch
    import torchdynamo
    import torchdynamo.test_case
    import torchdynamo.testing


    class Old(torchdynamo.test_case.TestCase):
        def test_old_names(self):
            cnt = torchdynamo.testing.CompileCounter()
            opt = torchdynamo.optimize_assert(cnt)(lambda x: x + 1)
            self.assertEqual(opt(torch.ones(2)), torch.ones(2) + 1)
            self.assertEqual(cnt.frame_count, 1)
''')


@pytest.fixture
def tests_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))  # the workers' caches: the test's own
    d = tmp_path / "dynamo"
    d.mkdir()
    (d / "test_style.py").write_text(DYNAMO_STYLE)
    (d / "test_old.py").write_text(OLD_STYLE)
    (d / "test_broken.py").write_text("import no_such_module_here\n")
    return d


def test_both_modes_run_and_each_test_is_classified(tests_dir, tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert main(["dynamo-parity", str(tests_dir), "--jobs", "2", "--json", str(out)]) == 0
    rows = {r["file"]: r for r in json.loads(out.read_text())}
    style = rows["test_style.py"]
    assert style["run"] == 6 and style["dynamo_passed"] == 5  # test_fails_under_both is not counted
    assert style["kiln_passed"] == 3  # kiln's capture ran the three tests of the program's meaning
    assert style["kinds"]["dynamo_internal"] == 1 and style["kinds"]["not_redirected"] == 1
    assert style["failures"]["Tests.test_dynamo_counters"]["kind"] == "dynamo_internal"
    assert style["failures"]["Tests.test_export"]["kind"] == "not_redirected"
    assert style["rate"] == 1.0
    assert rows["test_old.py"]["kiln_passed"] == 1 == rows["test_old.py"]["dynamo_passed"]
    assert "no_such_module_here" in rows["test_broken.py"]["import_error"]
    table = capsys.readouterr().out
    assert "| test_style.py | 6 | 5 | 3 | 100.0% |" in table and "did not import" in table


def test_failures_are_classified_by_where_they_failed():
    failed = {"outcome": "failed", "type": "builtins.AssertionError"}
    assert classify({"outcome": "passed"}) == "passed"
    assert classify({"outcome": "passed", "dynamo_ran": True}) == "not_redirected"
    assert classify({**failed, "testing_line": "self.assertTrue(same(val1a, correct1))"}) == "wrong_result"
    more = "Scalars are not equal!\n\nExpected 1 but got 2."
    assert classify({**failed, "test_line": "self.assertEqual(cnt.frame_count, 1)", "message": more}) == "extra_break"
    fewer = "Scalars are not equal!\n\nExpected 2 but got 1."
    assert classify({**failed, "test_line": "self.assertEqual(cnt.frame_count, 2)", "message": fewer}) == "fewer_graphs"
    none = {**failed, "test_line": "self.assertEqual(actual.frame_count, 1)", "message": "Expected 1 but got 0"}
    assert classify({**none, "kiln_breaks": 0}) == "fewer_graphs"  # (no op to compile, nothing run eagerly)
    assert classify({**none, "kiln_breaks": 1}) == "extra_break"
    inline = {**failed, "test_line": 'self.assertExpectedInline(cnt.frame_count, """4""")'}
    assert classify({**inline, "message": "'4' != '2'\n- 4\n+ 2"}) == "fewer_graphs"
    assert classify({**inline, "message": "'1' != '2'\n- 1\n+ 2"}) == "extra_break"
    among = {**failed, "test_line": "self.assertIn(cnt.frame_count, (5, 7))"}
    assert classify({**among, "message": "3 not found in (5, 7)"}) == "fewer_graphs"
    assert classify({**among, "message": "9 not found in (5, 7)"}) == "extra_break"
    none = "Scalars are not equal!\n\nExpected 2 but got 0."
    assert classify({**failed, "test_line": "self.assertEqual(cnt.frame_count, 2)", "message": none}) == "extra_break"
    # Dynamo gives up on the frame (a break inside a generator) and the test asserts it; kiln captured.
    gave_up = "Scalars are not equal!\n\nExpected 0 but got 1."
    assert classify({**failed, "test_line": "self.assertEqual(len(eager.graphs), 0)", "message": gave_up}) == "dynamo_internal"
    assert classify({**failed, "test_line": "self.assertIs(x_ref(), None)"}) == "held_memory"
    assert classify({**failed, "test_line": "self.assertTrue(found)", "reads_dynamo_counters": True}) == "dynamo_internal"
    assert classify({**failed, "test_line": "self.assertTrue(found)"}) == "wrong_result"
    # make_logging_test hands the test Dynamo's log records: a count of them checks Dynamo.
    assert classify({**failed, "test_line": "self.assertEqual(len(records), 1)", "reads_dynamo_logs": True}) == "dynamo_internal"
    assert classify({**failed, "test_line": "self.assertEqual(len(records), 1)"}) == "wrong_result"
    assert classify({**failed, "test_line": "self.assertEqual(len(compile_ids), 3)"}) == "dynamo_internal"
    # A count of the recorded graph's nodes of one kind checks the graph's structure, not values.
    assert classify({**failed, "test_line": 'self.assertEqual(len(sym_max_nodes), 1, "sym_max should be in the graph")'}) == "dynamo_internal"
    # Inductor's own counters (its generated kernels) check Inductor, not the program.
    assert classify({**failed, "test_line": "self.assertGreater(torch._inductor.metrics.generated_kernel_count, 0)"}) == "dynamo_internal"
    assert classify({"outcome": "failed", "type": "builtins.StopIteration", "expects_dynamo_refusal": True}) == "dynamo_internal"
    # What Dynamo's guard_fail_fn was handed (a test asserting on its guard text).
    none_reason = {"outcome": "failed", "type": "builtins.TypeError", "uses_guard_fail_fn": True}
    assert classify({**none_reason, "test_line": 'self.assertTrue("forward_hooks" in failure_reason)'}) == "dynamo_internal"
    assert classify({**none_reason, "test_line": "self.assertEqual(out, ref)"}) == "error"
    assert classify({**failed, "testing_line": "self.assertEqual(actual.op_count, expected_ops)"}) == "dynamo_internal"
    assert classify({**failed, "test_line": 'self.assertEqual(counters["stats"]["calls"], 2)'}) == "dynamo_internal"
    assert classify({"outcome": "failed", "type": "kiln.capture.break_records.Unsupported"}) == "extra_break"
    assert classify({"outcome": "failed", "type": "builtins.TypeError", "innermost": "lower.py:10"}) == "error"
    assert classify({"outcome": "timeout"}) == "timeout"


def test_a_wrong_result_counts_against_kiln():
    dynamo = {"file": "t.py", "tests": {"A.test_a": {"outcome": "passed"}, "A.test_b": {"outcome": "passed"}}}
    kiln = {"file": "t.py", "tests": {"A.test_a": {"outcome": "passed"},
                                      "A.test_b": {"outcome": "failed", "type": "builtins.AssertionError",
                                                   "test_line": "self.assertEqual(opt(x), fn(x))"}}}
    row = compare(dynamo, kiln)
    assert (row.dynamo_passed, row.kiln_passed, row.kinds["wrong_result"], row.rate) == (2, 1, 1, 0.5)
    assert "wrong_result" in dynamo_parity.failures_text([row])
    assert "**all** | **2** | **2** | **1** | **50.0%** | **1** | **0** |" in dynamo_parity.markdown([row])
    assert "fails eagerly" in dynamo_parity.markdown([row])


def test_fewer_graphs_and_dynamo_internals_are_not_counted():
    dynamo = {"file": "t.py", "tests": {f"A.test_{i}": {"outcome": "passed"} for i in range(3)}}
    fewer = {"outcome": "failed", "type": "builtins.AssertionError", "test_line": "self.assertEqual(cnt.frame_count, 2)",
             "message": "Expected 2 but got 1"}
    kiln = {"file": "t.py", "tests": {"A.test_0": {"outcome": "passed"}, "A.test_1": fewer,
                                      "A.test_2": {"outcome": "passed", "dynamo_ran": True}}}
    row = compare(dynamo, kiln)
    assert (row.counted, row.kiln_passed, row.rate) == (1, 1, 1.0)
    assert row.kinds["fewer_graphs"] == 1 and row.kinds["not_redirected"] == 1


def test_a_failure_that_eager_shares_at_the_same_line_is_not_counted():
    # The test asserts what Dynamo gives and eager does not (gen.close()'s value before 3.13).
    line = "self.assertEqual(y, t.tan())"
    wrong = {"outcome": "failed", "type": "builtins.AssertionError", "test_line": line}
    dynamo = {"file": "t.py", "tests": {"A.test_a": {"outcome": "passed"}, "A.test_b": {"outcome": "passed"}}}
    kiln = {"file": "t.py", "tests": {"A.test_a": wrong, "A.test_b": wrong}}
    eager = {"file": "t.py", "tests": {"A.test_a": wrong, "A.test_b": {**wrong, "test_line": "self.assertEqual(i, t)"}}}
    row = compare(dynamo, kiln, eager)
    assert row.kinds["fails_eagerly"] == 1 and row.kinds["wrong_result"] == 1 and row.counted == 1
    # a count of frames fails eagerly always (nothing is compiled): it excuses nothing
    counted = {**wrong, "test_line": "self.assertEqual(cnt.frame_count, 1)", "message": "Expected 1 but got 2"}
    row = compare(dynamo, {**kiln, "tests": {"A.test_a": counted, "A.test_b": wrong}}, {**eager, "tests": {"A.test_a": counted}})
    assert row.kinds["fails_eagerly"] == 0
    graph = {**wrong, "type": "builtins.IndexError", "test_line": "graph = eager.graphs[0]"}
    row = compare(dynamo, {**kiln, "tests": {"A.test_a": graph, "A.test_b": wrong}}, {**eager, "tests": {"A.test_a": graph}})
    assert row.kinds["fails_eagerly"] == 0 and row.kinds["error"] == 1


def test_bad_arguments_are_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["dynamo-parity", str(tmp_path / "missing")])
    assert "DIR" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["dynamo-parity", str(tmp_path)])
    assert "--files" in capsys.readouterr().err


def test_an_empty_row_has_no_rate():
    assert FileRow("x").rate is None


def test_the_failing_line_is_found_in_a_mixin_beside_the_test_file(tmp_path, monkeypatch):
    # PyTorch splits test_misc.py and test_repros.py into mixins in files of their own
    # (_test_misc_part1.py, ...): the line that failed there is the test's line.
    import importlib
    import sys

    from benchmarks.dynamo_parity_worker import _failure

    (tmp_path / "_mixin_part.py").write_text("def check(frames):\n    assert frames == 1, 'frames'\n")
    (tmp_path / "test_driver.py").write_text("from _mixin_part import check\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mixin = importlib.import_module("_mixin_part")
    try:
        mixin.check(2)
    except AssertionError as error:
        found = _failure(tmp_path / "test_driver.py", error, sys.exc_info()[2])
    assert found["test_line"] == "assert frames == 1, 'frames'"
    assert found["innermost"] == "_mixin_part.py:2"


def test_a_test_expecting_one_of_dynamos_own_exceptions_checks_dynamos_refusal():
    import re

    from benchmarks.dynamo_parity_worker import _DYNAMO_REFUSAL

    assert re.search(_DYNAMO_REFUSAL, "with self.assertRaises(torch._dynamo.exc.InternalTorchDynamoError):")
    assert re.search(_DYNAMO_REFUSAL, "self.assertRaisesRegex(Unsupported, 'x')")
    assert re.search(_DYNAMO_REFUSAL, "with self.assertRaises(torch._dynamo.exc.UserError):")
    assert not re.search(_DYNAMO_REFUSAL, "with self.assertRaises(TypeError):")


def test_kilns_capture_settings_follow_dynamos_config_in_the_worker():
    # A test that patches torch._dynamo.config.capture_scalar_outputs gets kiln's
    # capture.scalar_outputs: the worker makes that setting read Dynamo's option.
    import torch
    import torch._dynamo.config as dynamo_config

    import kiln
    from benchmarks import dynamo_parity_worker

    capture = kiln.config.capture
    original = type(capture)
    try:
        dynamo_parity_worker._kiln_settings_follow_dynamos()
        assert capture.scalar_outputs is False
        with dynamo_config.patch(capture_scalar_outputs=True):
            assert kiln.config.capture.scalar_outputs is True
        assert kiln.config.capture.scalar_outputs is False
        with dynamo_config.patch(automatic_dynamic_shapes=False, error_on_nested_fx_trace=False):
            assert kiln.config.capture.dynamic_ints is False and kiln.config.capture.error_on_fx_trace is False
        with torch.compiler.config.patch(dynamic_sources="L['x'], L['n']"):
            assert kiln.config.capture.dynamic_sources == ("L['x']", "L['n']")
    finally:
        object.__setattr__(capture, "__class__", original)
    assert type(kiln.config.capture) is original
