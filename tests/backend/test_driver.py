"""The backend driver: its stages in order, timed and named, the IR verifier under KILN_VERIFY,
the code generator chosen by device, extern arguments read by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import fx

import kiln
from kiln import aot, compile_time
from kiln.aot import SavingGraphCompiler
from kiln.backend import Backend, driver
from kiln.ir.nodes import Buffer, Layout
from kiln.ir.program import ExternStep
from kiln.ir.verify import IRError
from kiln.passes import pipeline
from kiln.schedule import schedule
from tests.kiln_backend import private_cache  # noqa: F401  (fixture)


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)).softmax(-1))


def test_compile_time_names_every_stage_of_kiln_compile():
    model, x = MLP().eval(), torch.randn(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(model)(x), model(x))
    tree = compile_time.last()
    assert tree.name == "frame MLP" and tree.self_seconds > 0  # capture's own time
    (graph,) = tree.find("inference graph")
    names = [stage.name for stage in graph.children]
    passes = [f"pass {name}" for name in pipeline.names()]
    assert names == [*passes, "lowering", "scheduling", "codegen cpp", "build", "load"]
    assert [s.name for s in tree.children[0].children] == ["aot cache lookup", "aot", "inference graph", "aot cache store"]
    (build,) = graph.find("build")
    assert build.notes and "kernels compiled" in build.notes[0]  # a fresh cache builds
    total = sum(s.seconds for s in tree.children) + tree.self_seconds
    assert abs(total - tree.seconds) < 1e-6  # the tree adds up


def test_compile_time_recording_keeps_every_frame_and_adds_up_by_part():
    def two_frames(x):
        y = torch.relu(x) * 2
        print("", end="")  # a graph break: two frames, two trees
        return y.softmax(-1)

    x = torch.randn(4, 8)
    compiled = kiln.compile(two_frames)
    with compile_time.recording() as trees:
        torch.testing.assert_close(compiled(x), two_frames(x))
    assert len(trees) == 2 and all(tree.name.startswith("frame ") for tree in trees)
    parts = compile_time.by_part(trees)
    assert list(parts) == list(compile_time.PARTS)
    assert parts["capture"] > 0 and parts["build"] > 0 and parts["lowering"] > 0
    assert abs(sum(parts.values()) - sum(tree.seconds for tree in trees)) < 1e-6  # every second in one part
    with compile_time.recording() as later:
        compiled(x)  # compiled already: nothing to record
    assert later == []


def test_compile_time_is_logged_and_says_when_kernels_come_from_the_cache(caplog):
    fn = lambda x: (x - x.amax(-1, keepdim=True)).exp()  # noqa: E731
    x = torch.randn(4, 8)
    texts = []
    for _ in range(2):  # the second process-like run: new capture, graph from the AOT cache
        kiln.reset()
        caplog.clear()
        with kiln.config.patch({"debug.logs": ("compile_time",)}), caplog.at_level("INFO", logger="kiln.compile_time"):
            kiln.compile(fn)(x)
        texts.append(caplog.text)
    first, second = texts
    assert "frame " in first and "kernels compiled" in first
    for stage in ("capture", "aot", "pass attention", "lowering", "scheduling", "codegen cpp", "build", "load"):
        assert f" {stage} " in first
    assert "graph loaded from the AOT graph cache" in second and "loaded from the C++ cache" in second
    assert " lowering " not in second


def _schedule_reading_a_freed_buffer(program, target=None):
    scheduled = schedule(program, target)
    last = len(scheduled.steps) - 1
    frees = {k: list(v) for k, v in scheduled.memory.frees.items()}
    frees.setdefault(0, []).extend(b.name for b in scheduled.inputs if b is not None)  # freed too early
    return dataclasses.replace(scheduled, memory=dataclasses.replace(scheduled.memory, frees=frees)) if last > 0 else scheduled


@pytest.mark.parametrize("verify", [False, True])
def test_kiln_verify_checks_the_schedule(monkeypatch, verify):
    monkeypatch.setattr(driver, "schedule", _schedule_reading_a_freed_buffer)
    fn = lambda x: x.softmax(-1).mm(x.t()).relu()  # noqa: E731  (kernel, extern, kernel: three steps)
    x = torch.randn(4, 4)
    with kiln.config.patch({"debug.verify": verify, "backend.freezing": False}):
        if verify:
            with pytest.raises(IRError, match="freed after step 0"):
                Backend()(aot_graph(fn, x), [x])
        else:
            Backend()(aot_graph(fn, x), [x])


def aot_graph(fn, *inputs) -> fx.GraphModule:
    graphs = []
    aot.compile(fx.symbolic_trace(fn), list(inputs), lambda gm, example: graphs.append(gm) or gm)
    return graphs[0]


def test_kiln_verify_passes_real_graphs():
    model, x = MLP().eval(), torch.randn(4, 16)
    with torch.no_grad(), kiln.config.patch({"debug.verify": True}):
        torch.testing.assert_close(kiln.compile(model)(x), model(x))


def test_the_code_generator_is_chosen_by_device():
    assert driver.choose_codegen("cpu") == "cpp"
    assert driver.choose_codegen("cuda") == "triton"
    with kiln.config.patch({"backend.codegen": "triton"}):
        assert driver.choose_codegen("cuda") == "triton"
    with pytest.raises(NotImplementedError, match="'mps'"):
        driver.choose_codegen("mps")


@pytest.mark.parametrize("setting", ["cpp", "triton"])
def test_the_target_carries_the_traits_of_the_generator_whose_object_builds_the_graph(setting):
    # Passes and the scheduler read the generator's traits on the Target; the driver runs its
    # object from the one table, and the artifact carries the runtime's way of loading its kernels.
    gm = fx.symbolic_trace(lambda x: x.sin() + 1)
    x = torch.randn(8)
    gm.graph.find_nodes(op="placeholder")[0].meta["val"] = x
    codegen = driver.CODEGENS[setting]
    with kiln.config.patch({"backend.codegen": setting}):
        assert driver.target_for(gm).codegen is codegen.traits
    with torch.no_grad(), kiln.config.patch({"backend.codegen": setting, "backend.freezing": False}), \
            kiln.backend.watch() as built:
        kiln.compile(lambda x: x.sin() + 1)(x)
    (graph,) = built
    assert graph.artifact.codegen == codegen.name and graph.artifact.kernel_library is codegen.kernel_library
    assert (graph.aten is not None) == codegen.kernel_library.compiles_at_first_launch  # Triton's: a first-call fallback


def test_the_backend_keeps_what_it_builds_for_the_aot_cache():
    backend = Backend()
    assert isinstance(backend, SavingGraphCompiler)
    x = torch.randn(4, 8)
    compiled = backend(aot_graph(lambda x: x.sin() + 1, x), [x])
    again = backend.load(backend.save(compiled))
    torch.testing.assert_close(again(x)[0], x.sin() + 1)
    assert again.program is None  # loaded: nothing lowered again


def test_extern_arguments_are_read_and_replaced_by_name():
    x = Buffer("x", Layout.contiguous([2, 3], torch.float32))
    step = ExternStep([None], torch.ops.aten.sum.dim_IntList, (x, [1]), {"keepdim": True})
    assert step.argument("self") is x and step.argument("dim") == [1] and step.argument("keepdim") is True
    assert step.argument("dtype") is None  # not passed: the schema's default
    assert step.with_argument("dim", [0]).args == (x, [0]) and step.args == (x, [1])
    assert step.with_argument("dtype", torch.float64).kwargs == {"keepdim": True, "dtype": torch.float64}
    with pytest.raises(KeyError, match="no argument 'other'"):
        step.argument("other")


def _rewrite_without_fake_values(gm, target):
    # A careless rewrite: adds a node and forgets its fake value.
    out = next(n for n in gm.graph.nodes if n.op == "output")
    first = out.args[0][0]
    with gm.graph.inserting_before(out):
        neg = gm.graph.call_function(torch.ops.aten.neg.default, (first,))
    out.args = ((neg, *out.args[0][1:]),)
    return True


def test_kiln_verify_names_the_pass_that_broke_the_aten_graph(monkeypatch):
    from kiln.passes.verify import GraphError

    monkeypatch.setattr(pipeline, "REWRITES", [*pipeline.REWRITES, ("careless", _rewrite_without_fake_values)])
    x = torch.randn(4, 8)
    with kiln.config.patch({"debug.verify": True}):
        with pytest.raises(GraphError, match="after pass careless: node neg"):
            Backend()(aot_graph(lambda x: x.sin() + 1, x), [x])
