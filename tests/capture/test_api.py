"""kiln.compile's arguments, backends, fallbacks and errors."""

import pytest
import torch

import kiln
from kiln.capture import BREAKS


def test_bad_arguments_name_the_argument_and_accepted_values():
    f = lambda x: x  # noqa: E731
    with pytest.raises(ValueError, match="backend must be one of 'kiln', 'aot_eager', 'eager'"):
        kiln.compile(f, backend="inductor")
    with pytest.raises(TypeError, match="fullgraph must be True or False"):
        kiln.compile(f, fullgraph="yes")
    with pytest.raises(ValueError, match="dynamic must be None, False or True"):
        kiln.compile(f, dynamic="auto")
    with pytest.raises(ValueError, match="mode must be one of"):
        kiln.compile(f, mode="fast")
    with pytest.raises(ValueError, match="unknown option 'unroll'; accepted options: recompile_limit"):
        kiln.compile(f, options={"unroll": 1})
    with pytest.raises(TypeError, match="fn_or_module must be"):
        kiln.compile(3)


def test_decorator_forms():
    @kiln.compile
    def f(x):
        return x + 1

    @kiln.compile(backend="eager", fullgraph=True)
    def g(x):
        return x * 2

    x = torch.ones(2)
    torch.testing.assert_close(f(x), x + 1)
    torch.testing.assert_close(g(x), x * 2)
    assert g.__name__ == "g"


def test_custom_backend_gets_the_torch_level_graph():
    seen = []

    def backend(gm, example_inputs):
        seen.append((gm, example_inputs))
        return gm.forward

    def f(x, y):
        return torch.nn.functional.relu(x @ y).sum(dim=0)

    x, y = torch.randn(3, 4), torch.randn(4, 5)
    torch.testing.assert_close(kiln.compile(f, backend=backend)(x, y), f(x, y))
    (gm, inputs), = seen
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.nn.functional.relu in targets
    assert [tuple(t.shape) for t in inputs] == [(3, 4), (4, 5)]


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_real_backends(backend):
    def f(x, w):
        return torch.nn.functional.gelu(x @ w) + 1

    x, w = torch.randn(8, 16), torch.randn(16, 4)
    compiled = kiln.compile(f, backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(x, w), f(x, w))
    assert len(compiled.kiln_cache.entries) == 1


def _prints(x):
    y = x + 1
    print("y is", y)
    return y * 2


def _prints_in_try(x):
    y = x + 1
    try:
        print("y is", y)
    finally:
        y = y * 2
    return y


def test_a_break_inside_a_try_block_falls_back_with_a_record(capsys):
    kiln.reset()
    compiled = kiln.compile(_prints_in_try, backend="eager")
    x = torch.ones(2)
    torch.testing.assert_close(compiled(x), _prints_in_try(x))
    assert compiled.kiln_cache.fallback is not None
    record = BREAKS[-1]
    assert record.kind == "unsupported_call" and not record.resumed
    assert record.filename == __file__ and record.lineno == _prints_in_try.__code__.co_firstlineno + 3
    assert "print" in record.explanation and "inside a try block" in record.explanation and record.hint
    assert capsys.readouterr().out == "y is tensor([2., 2.])\n" * 2


def test_a_frame_that_runs_eagerly_is_warned_once_with_the_reason(capsys):
    import warnings

    def eager_only(x):  # a code object of its own: the warning is once per code object
        try:
            print("y")
        finally:
            return x * 2

    kiln.reset()
    compiled = kiln.compile(eager_only, backend="eager")
    x = torch.ones(2)
    with pytest.warns(RuntimeWarning, match=r"eager_only runs eagerly, without kiln's speed-up: \[unsupported_call\]") as caught:
        compiled(x)
    assert caught[0].filename == __file__  # the user's call
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled(x)  # not again
        kiln.compile(eager_only, backend="eager")(x)  # nor for the same code compiled again

    def silenced(x):
        try:
            print("y")
        finally:
            return x * 3

    with warnings.catch_warnings(), kiln.config.patch({"capture.warn_eager_frames": False}):
        warnings.simplefilter("error")
        kiln.compile(silenced, backend="eager")(x)
    capsys.readouterr()


def test_an_unsupported_python_warns_and_runs_eagerly(monkeypatch):
    from kiln.capture import bytecode

    monkeypatch.setattr(bytecode, "PY", (3, 14))
    model = torch.nn.Linear(2, 2)
    with pytest.warns(RuntimeWarning, match=r"supports Python 3.11, 3.12 and 3.13, not 3.14; torch.compile\(model, backend=\"kiln\"\)"):
        assert kiln.compile(model) is model  # eager, as told
    with pytest.raises(RuntimeError, match="not 3.14"):
        kiln.compile(model, fullgraph=True)


def test_a_break_is_recorded_with_the_users_line(capsys):
    kiln.reset()
    compiled = kiln.compile(_prints, backend="eager")
    x = torch.ones(2)
    torch.testing.assert_close(compiled(x), _prints(x))
    assert compiled.kiln_cache.fallback is None
    record = BREAKS[-1]
    assert record.kind == "unsupported_call" and record.resumed
    assert record.filename == __file__ and record.lineno == _prints.__code__.co_firstlineno + 2
    assert "print" in record.explanation and record.hint


def test_fullgraph_raises_with_the_users_line():
    compiled = kiln.compile(_prints, backend="eager", fullgraph=True)
    with pytest.raises(kiln.CaptureError) as info:
        compiled(torch.ones(2))
    assert f"{__file__}:{_prints.__code__.co_firstlineno + 2}" in str(info.value)


def test_data_dependent_branch_is_recorded():
    def f(x):
        if x.sum() > 0:
            return x
        return -x

    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    for x in (torch.ones(4), -torch.ones(4)):
        torch.testing.assert_close(compiled(x), f(x))
    assert BREAKS[-1].kind == "data_dependent_branch" and BREAKS[-1].resumed


def test_user_exception_behaves_as_in_eager():
    def f(x, n):
        if n < 0:
            raise ValueError("negative")
        return x + n

    compiled = kiln.compile(f, backend="eager")
    with pytest.raises(ValueError, match="negative"):
        compiled(torch.ones(1), -1)
    torch.testing.assert_close(compiled(torch.ones(1), 2), torch.ones(1) + 2)


def test_reset_forgets_entries():
    compiled = kiln.compile(lambda x: x + 1, backend="eager")
    compiled(torch.ones(1))
    assert len(compiled.kiln_cache.entries) == 1
    kiln.reset()
    assert len(compiled.kiln_cache.entries) == 0
    compiled(torch.ones(1))
    assert len(compiled.kiln_cache.entries) == 1


def test_is_compiling_is_true_while_capturing():
    def f(x):
        return x + 1 if torch.compiler.is_compiling() else x - 1

    torch.testing.assert_close(kiln.compile(f, backend="eager", fullgraph=True)(torch.zeros(1)), torch.ones(1))


def test_debug_dir_gets_graph_guards_and_runner_in_pipeline_order(tmp_path):
    def f(x, n):
        return x.sin() * n

    with kiln.config.patch({"debug.dump_dir": str(tmp_path)}):
        kiln.compile(f, backend="aot_eager")(torch.randn(3), 2)
    (run,) = tmp_path.iterdir()
    folders = sorted(p.name for p in run.iterdir())
    assert folders[0].startswith("000_capture_") and len(folders) >= 2  # then the AOT layer's folder
    files = sorted((run / folders[0]).iterdir())
    assert [p.name for p in files] == ["00_captured_graph.py", "01_guards.txt", "02_runner.py"]
    graph, guards, runner = (p.read_text() for p in files)
    assert "torch.sin" in graph or "sin()" in graph
    assert "TENSOR_MATCH" in guards and "EQUALS" in guards and "def check(L):" in guards
    assert "def run(L):" in runner


def test_a_fault_in_kiln_runs_the_frame_eagerly_with_a_record(monkeypatch):
    from kiln.capture.opcodes import HANDLERS

    def broken(tx, inst):
        raise KeyError("a bug of kiln's own")

    monkeypatch.setitem(HANDLERS, "BINARY_OP", broken)

    def f(x):
        return x + 1

    x = torch.randn(3)
    compiled = kiln.compile(f, backend="eager")
    torch.testing.assert_close(compiled(x), x + 1)
    record = compiled.kiln_cache.fallback
    assert record.kind == "internal_error" and "KeyError" in record.explanation and record.lineno > 0
    with pytest.raises(kiln.CaptureError, match="internal_error"):
        kiln.compile(f, backend="eager", fullgraph=True)(x)


def test_a_fault_in_kiln_after_the_interpreter_falls_back_with_a_record(monkeypatch):
    # A fault past the interpreter (building the frame's runner) runs the frame eagerly, recorded;
    # under fullgraph the error is raised as it is (the backend's errors, a bad setting's
    # ValueError among them, go through the same path and must reach the caller unchanged).
    from kiln.capture import frame

    def broken(output):
        raise AttributeError("a bug of kiln's own")

    monkeypatch.setattr(frame, "_no_generator_left_in_a_block", broken)

    def f(x):
        return x * 3

    x = torch.randn(3)
    compiled = kiln.compile(f, backend="eager")
    torch.testing.assert_close(compiled(x), x * 3)
    assert compiled.kiln_cache.fallback.kind == "internal_error"
    with pytest.raises(AttributeError, match="a bug of kiln's own"):  # (under fullgraph: raised as it is)
        kiln.compile(f, backend="eager", fullgraph=True)(x)


def test_a_slice_with_a_tensor_bound_is_recorded_as_an_unsupported_index():
    def f(x, t):
        return (x * 2)[:t] + 1

    kiln.reset()
    compiled = kiln.compile(f, backend="eager")
    x, t = torch.arange(6.0), torch.tensor(3)
    torch.testing.assert_close(compiled(x, t), f(x, t))
    assert BREAKS[-1].kind == "unsupported_index" and "slice" in BREAKS[-1].explanation


def test_compiling_a_compiled_function_or_module_compiles_the_original():
    # The outer call's backend and settings win, as Dynamo's nested optimize does; the inner
    # compiled object keeps its own (found by Dynamo's test_nested_optimize).
    seen = {"inner": 0, "outer": 0}

    def counting(name):
        def backend(gm, example_inputs):
            seen[name] += 1
            return gm.forward
        return backend

    def fn(x):
        return torch.relu(torch.cos(x) + torch.sin(x))

    inner = kiln.compile(fn, backend=counting("inner"), fullgraph=True)
    outer = kiln.compile(inner, backend=counting("outer"), fullgraph=True)
    x = torch.randn(4)
    torch.testing.assert_close(outer(x), fn(x))
    assert seen == {"inner": 0, "outer": 1}
    torch.testing.assert_close(inner(x), fn(x))
    assert seen == {"inner": 1, "outer": 1}
    module = torch.nn.Linear(3, 3)
    twice = kiln.compile(kiln.compile(module, backend=counting("inner")), backend=counting("outer"))
    y = torch.randn(2, 3)
    torch.testing.assert_close(twice(y), module(y))
    assert seen == {"inner": 1, "outer": 2}


def test_an_exception_kiln_predicts_wrongly_falls_back_with_a_record(monkeypatch):
    # kiln's interpreter raising where the function returns (a bug of kiln's: a 3.13 opcode read
    # wrongly did this) must not pass silently: eager's result, a record, a warning at the
    # user's line, and eager calls from then on.
    from kiln.capture.opcodes import HANDLERS
    from kiln.capture.user_exceptions import raise_real

    def wrong(tx, inst):
        raise raise_real(ZeroDivisionError("made up"))

    monkeypatch.setitem(HANDLERS, "BINARY_OP", wrong)

    def f(x):
        return x + 1

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    with pytest.warns(RuntimeWarning, match=r"raised ZeroDivisionError\('made up'\) where the function returns") as caught:
        out = compiled(torch.ones(2))
    torch.testing.assert_close(out, torch.full((2,), 2.0))
    assert caught[0].filename == __file__
    assert compiled.kiln_cache.fallback.kind == "internal_error" and not compiled.kiln_cache.entries
    torch.testing.assert_close(compiled(torch.ones(2)), torch.full((2,), 2.0))
    assert compiled.kiln_cache.eager_calls == 2


def test_a_compiled_container_module_answers_truth_length_and_items_as_the_original():
    # Dynamo's test_repros.py test_compiled_module_truthiness: an empty ModuleList compiled was true.
    empty, filled = torch.nn.ModuleList(), torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    assert not kiln.compile(empty) and len(kiln.compile(empty)) == 0
    compiled = kiln.compile(filled)
    assert compiled and len(compiled) == 1 and compiled[0] is filled[0] and filled[0] in compiled
    assert list(compiled) == list(filled)
    assert kiln.compile(torch.nn.Linear(2, 2))  # a module without __len__ is true
    with pytest.raises(TypeError):
        len(kiln.compile(torch.nn.Linear(2, 2)))


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_saved_tensor_hooks_run_for_the_program_only(backend):
    # Dynamo's test_repros.py test_unpack_hooks_dont_run_during_tracing: the user's pack hook ran
    # 5 times for one product, kiln's own tracing saving tensors under it.
    def f(x, y):
        return x * y

    compiled = kiln.compile(f, backend=backend)
    counts = {"pack": 0, "unpack": 0}

    def pack(t):
        counts["pack"] += 1
        return t

    def unpack(t):
        counts["unpack"] += 1
        return t

    x, y = torch.ones(4, requires_grad=True), torch.ones(4)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = compiled(x, y)
        assert counts == {"pack": 1, "unpack": 0}
        out.sum().backward()
        assert counts == {"pack": 1, "unpack": 1}
    torch.testing.assert_close(x.grad, y)


def test_builtins_aten_ops_and_callable_objects_compile():
    # Dynamo's test_repros.py test_function_in_skipfiles (torch.compile(torch.sin)), test_misc.py
    # test_compile_non_infra_* (torch.add, an OpOverload), test_modules.py
    # test_udo_instance_method_as_hook (an object with __call__).
    class Scale:
        def __init__(self):
            self.k = 3

        def __call__(self, x):
            return x * self.k

    x = torch.randn(4)
    torch.testing.assert_close(kiln.compile(torch.sin, backend="eager", fullgraph=True)(x), torch.sin(x))
    torch.testing.assert_close(kiln.compile(torch.ops.aten.add.Tensor, backend="eager", fullgraph=True)(x, x), x + x)
    scale = Scale()
    compiled = kiln.compile(scale, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), x * 3)
    scale.k = 5
    torch.testing.assert_close(compiled(x), x * 5)


def test_a_compiled_module_saved_and_loaded_is_compiled_again(tmp_path):
    # Dynamo's test_modules.py test_save_and_load_*: torch.save of the compiled module.
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    compiled = kiln.compile(model, backend="eager")
    x = torch.randn(2, 4)
    compiled(x)
    torch.save(compiled, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    assert type(loaded) is type(compiled) and loaded.__dict__["_cache"] is not compiled.__dict__["_cache"]
    torch.testing.assert_close(loaded(x), model(x))
    assert len(loaded.kiln_cache.entries) == 1


def test_a_compiled_function_is_a_function_and_binds_as_a_method():
    import inspect

    def scale(self, x):
        return x * self.k

    compiled = kiln.compile(scale, backend="eager")
    assert inspect.isfunction(compiled) and compiled.__wrapped__ is scale and compiled.kiln_cache.entries == []

    class Holder:
        k = 3
        apply = compiled

    torch.testing.assert_close(Holder().apply(torch.ones(2)), torch.full((2,), 3.0))


def test_fx_tracing_a_compiled_function_raises_unless_the_setting_lets_fx_trace_the_original():
    def f(x):
        return x.sin() + 1

    compiled = kiln.compile(f, backend="eager")
    with pytest.raises(RuntimeError, match="symbolically trace a function kiln.compile made"):
        torch.fx.symbolic_trace(compiled)
    with kiln.config.patch({"capture.error_on_fx_trace": False}):
        gm = torch.fx.symbolic_trace(compiled)
    x = torch.randn(3)
    torch.testing.assert_close(gm(x), f(x))
    assert compiled.kiln_cache.entries == []  # (FX traced the original; kiln compiled nothing)


def test_kiln_compile_inside_a_compiled_function_inlines_into_one_graph():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def gn(x, c=2):
        return c * x

    made_outside = kiln.compile(lambda x: x.cos(), backend="eager")

    def outer(x):
        return kiln.compile(gn, backend="eager")(x) + kiln.compile(fullgraph=True)(gn)(x, 3) + made_outside(x)

    x = torch.randn(4)
    torch.testing.assert_close(kiln.compile(outer, backend=backend, fullgraph=True)(x), gn(x) + gn(x, 3) + x.cos())
    assert len(graphs) == 1 and made_outside.kiln_cache.entries == []
