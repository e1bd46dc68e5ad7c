"""`kiln.debug.bisect` on tiny models, each wrong in one planted place: it must name the rung, and
within the backend the rewrite pass or the kernel, that the bug was planted in.

Autotuning is off (no timing, the same kernels in every run). The suite's conftest puts every
cache in a temporary folder; bisect itself never uses the AOT graph cache."""

import pytest
import torch

import kiln
import kiln.api
import kiln.debug
from kiln import config
from kiln.backend import backends, watch
from kiln.backend.report import kernel_ops
from kiln.cli import main as kiln_main
from kiln.codegen.cpp.body import CppBody
from kiln.passes import pipeline

aten = torch.ops.aten


class TanhModel(torch.nn.Module):
    """Three kernels between matrix products (externs); only the second computes a tanh."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(16, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 8)

    def forward(self, x):
        h = torch.relu(self.a(x)) * 2
        h = torch.tanh(self.b(h)) + h
        return self.c(h).softmax(-1)


@pytest.fixture(autouse=True)
def no_autotuning():
    with config.patch({"backend.autotune": "off"}):
        yield
    kiln.reset()


@pytest.fixture
def model_and_input():
    torch.manual_seed(0)
    return TanhModel().eval(), torch.randn(4, 16)


def _tanh_to_sigmoid(gm, only_tagged=False) -> bool:
    """The planted bug of the graph-level tests: tanh computed as a sigmoid."""
    changed = False
    for node in gm.graph.nodes:
        if node.target in (torch.tanh, aten.tanh.default) and (node.meta.get("tagged") or not only_tagged):
            node.target = torch.sigmoid if node.target is torch.tanh else aten.sigmoid.default
            changed = True
    gm.recompile()
    return changed


def _plant_rewrites(monkeypatch, *planted):
    """`planted` (name, rewrite) pairs put into the pipeline after `freeze`, in order."""
    monkeypatch.setattr(pipeline, "REWRITES", [pipeline.REWRITES[0], *planted, *pipeline.REWRITES[1:]])


def test_a_model_kiln_compiles_correctly_matches_at_every_rung(model_and_input, capsys):
    result = kiln.debug.bisect(*model_and_input)
    assert result.rung == "none" and result.culprit_pass is None and result.culprit_kernel is None
    assert [(run.name, run.ok) for run in result.rungs] == [("capture", True), ("aot", True), ("backend", True)]
    assert "every rung matches eager" in capsys.readouterr().out


def test_a_wrong_rewrite_pass_is_named(model_and_input, monkeypatch):
    _plant_rewrites(monkeypatch, ("tanh_as_sigmoid", lambda gm, target: _tanh_to_sigmoid(gm)))
    result = kiln.debug.bisect(*model_and_input, verbose=False)
    assert result.rung == "backend" and [run.ok for run in result.rungs] == [True, True, False]
    assert result.culprit_pass == "tanh_as_sigmoid" and result.fixing_passes == ["tanh_as_sigmoid"]
    assert result.culprit_kernel is None and result.graphs == []  # the pass explains it: no kernel search
    assert "in rewrite pass `tanh_as_sigmoid`" in str(result)


def test_of_several_passes_that_each_fix_it_the_first_is_named_and_the_others_listed(model_and_input, monkeypatch):
    """`tag` does nothing wrong, but `wrong_if_tagged` only goes wrong after it: skipping either fixes it."""

    def tag(gm, target):
        tanhs = [n for n in gm.graph.nodes if n.target is aten.tanh.default]
        for node in tanhs:
            node.meta["tagged"] = True
        return bool(tanhs)

    _plant_rewrites(monkeypatch, ("tag", tag), ("wrong_if_tagged", lambda gm, target: _tanh_to_sigmoid(gm, only_tagged=True)))
    result = kiln.debug.bisect(*model_and_input, verbose=False)
    assert result.culprit_pass == "tag" and result.fixing_passes == ["tag", "wrong_if_tagged"]
    assert "skipping any of tag, wrong_if_tagged fixes it: tag is the first in pipeline order" in str(result)


def test_a_wrong_kernel_is_named_and_only_it(model_and_input, monkeypatch):
    """The C++ printer spells tanh wrong (twice its value); of the graph's kernels, bisect names
    the one computing the tanh, not the softmax kernel after it that reads its wrong values."""
    printed = CppBody._unary

    def doubled_tanh(self, name, x):
        spelled = printed(self, name, x)
        return f"({spelled} + {spelled})" if name == "tanh" else spelled

    monkeypatch.setattr(CppBody, "_unary", doubled_tanh)
    result = kiln.debug.bisect(*model_and_input, verbose=False)
    assert result.rung == "backend" and result.culprit_pass is None
    assert result.passes and not any(run.ok for run in result.passes)
    kiln.reset()
    with torch.no_grad(), watch() as built:  # the same kernels again: their names are their code's hash
        kiln.compile(model_and_input[0])(model_and_input[1])
    graph = getattr(built[0], "runtime", built[0])
    functions = {k.name: graph.artifact.kernels[k.name][0] for k in graph.schedule.kernels}
    with_tanh = [k.name for k in graph.schedule.kernels if "tanh" in kernel_ops(k)]
    assert len(functions) >= 3 and len(with_tanh) == 1
    assert result.culprit_kernel == functions[with_tanh[0]]
    assert [k.function for _, k in result.wrong_kernels] == [functions[with_tanh[0]]]
    (finding,) = result.graphs
    assert finding.check.lowering.ok and not finding.compiled.ok
    assert f"in kernel {result.culprit_kernel}" in str(result) and "tanh x1" in str(result)


def test_a_wrong_captured_graph_is_named_at_the_capture_rung(model_and_input, monkeypatch):
    captured = kiln.api.capture

    def wrong_capture(fn, backend, *args):
        def wrong_graph(gm, example_inputs):
            _tanh_to_sigmoid(gm)
            return backend(gm, example_inputs)

        return captured(fn, wrong_graph, *args)

    monkeypatch.setattr(kiln.api, "capture", wrong_capture)
    result = kiln.debug.bisect(*model_and_input, verbose=False)
    assert result.rung == "capture" and [run.name for run in result.rungs] == ["capture"]


def test_a_wrong_aot_graph_is_named_at_the_aot_rung_from_the_command_line(tmp_path, monkeypatch, capsys):
    def wrong_aten_graph(gm, example_inputs):
        _tanh_to_sigmoid(gm)
        return gm

    monkeypatch.setattr(backends, "run_as_is", wrong_aten_graph)
    script = tmp_path / "repro.py"
    script.write_text("import torch\n"
                      "from tests.debug.test_bisect import TanhModel\n"
                      "torch.manual_seed(0)\n"
                      "model = TanhModel().eval()\n"
                      "inputs = (torch.randn(4, 16),)\n")
    assert kiln_main(["bisect", str(script)]) == 1
    out = capsys.readouterr().out
    assert "goes wrong at rung `aot`" in out and "capture  0 (identical)" in out


class _Cache:
    """A transformers KV cache's shape: an object holding lists of objects holding tensors."""

    def __init__(self, keys):
        self.layers = [_Layer(k) for k in keys]


class _Layer:
    def __init__(self, keys):
        self.keys, self.dtype = keys, keys.dtype


def test_an_object_holding_tensors_is_compared_by_what_it_holds():
    from kiln.debug.tolerance import compare

    keys = [torch.randn(2, 3), torch.randn(4)]
    assert compare({"cache": _Cache(keys)}, {"cache": _Cache([k.clone() for k in keys])}).ok  # not by identity
    moved = [keys[0], keys[1] + 1]
    found = compare({"cache": _Cache(keys)}, {"cache": _Cache(moved)})
    assert not found.ok and "_Layer.keys" in found.where and "[1]" in found.where


def test_a_strided_output_is_compared():
    from kiln.debug.tolerance import compare

    expected = torch.randn(4, 6).t()  # not contiguous: its ratios cannot be viewed flat
    actual = expected.clone()
    actual[2, 1] += 1
    found = compare(expected, actual)
    assert not found.ok and found.where == "output[2, 1]"
