"""Graph breaks that resume: the graph ends before what kiln cannot capture, that runs natively,
and the rest of the frame is captured as a resume function. Each test compares with eager and
counts the graphs the backend received."""

import enum

import pytest
import torch
from torch import nn

import kiln
from kiln.capture.break_records import BREAKS


class Counting:
    """A backend that runs graphs as they are and remembers each one."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    def ops(self):
        return [sum(n.op in ("call_function", "call_method") for n in gm.graph.nodes) for gm in self.graphs]


def _compiled(fn, **kwargs):
    kiln.reset()
    backend = Counting()
    return kiln.compile(fn, backend=backend, **kwargs), backend


def _same(a, b):
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b)
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b


def _check(fn, *args, graphs):
    """Compiled `fn` matches eager on two calls; the first compiles `graphs` graphs, the second none."""
    compiled, backend = _compiled(fn)
    _same(compiled(*args), fn(*args))
    assert len(backend.graphs) == graphs
    _same(compiled(*args), fn(*args))
    assert len(backend.graphs) == graphs
    return backend


def middle(x):
    a = x.sin() + 1
    print("a is", a)
    return a.cos() * 2


def test_a_break_in_the_middle_of_a_function(capsys):
    backend = _check(middle, torch.randn(3), graphs=2)
    assert backend.ops() == [2, 2]
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4 and out[0] == out[1] and out[0].startswith("a is tensor(")  # once per call, as eager
    assert BREAKS[-1].kind == "unsupported_call" and BREAKS[-1].resumed
    assert BREAKS[-1].lineno == middle.__code__.co_firstlineno + 2 and BREAKS[-1].function == "middle"


def test_a_printed_tensor_prints_what_eager_prints(capsys):
    def f(x):
        y = x * 3
        print(y, sep="", end="!\n")  # keyword arguments at the break
        return y - 1

    x = torch.arange(4.0)
    compiled, backend = _compiled(f)
    _same(compiled(x), f(x))
    compiled_out, eager_out = capsys.readouterr().out.split("!\n")[:2]
    assert compiled_out == eager_out == str(x * 3)
    assert len(backend.graphs) == 2


def loop(x):
    for i in range(3):
        x = x * 2 + i
        print("step", i)
    return x.sin()


def test_a_break_in_a_loop_body(capsys):
    # Each iteration's break resumes in the loop with the iterator's remaining items: the graphs
    # are the first iteration, the two that follow (one resume function, two entries), the end.
    _check(loop, torch.randn(4), graphs=4)
    assert capsys.readouterr().out.count("step") == 12  # 3 per call: 2 compiled, 2 eager


def test_a_data_dependent_branch_in_a_loop_over_a_list():
    def f(x, ws):
        seen = []
        for w in ws:
            x = x @ w
            if x.sum() > 0:
                x = x.relu()
            seen.append(x.shape[0])
        return x, seen

    torch.manual_seed(0)
    _check(f, torch.randn(4), [torch.randn(4, 4) for _ in range(3)], graphs=4)


def helper(t):
    u = t * 2
    print("in helper")
    return u + 1


def calls_helper(x):
    a = x.exp()
    b = helper(a)
    return b.sin()


def test_a_break_inside_an_inlined_callee_compiles_the_callee_as_its_own_frame(capsys):
    # calls_helper breaks at the call; helper is compiled on its own and breaks at print.
    backend = _check(calls_helper, torch.randn(3), graphs=4)
    assert backend.ops() == [1, 1, 1, 1]  # exp | t * 2 | u + 1 | sin
    assert [r.function for r in BREAKS] == ["helper"]  # recorded once, where it happened


class Inner(nn.Module):
    def forward(self, x):
        x = x + 1
        print("inner")
        return x * 2


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner, self.lin = Inner(), nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(self.inner(self.lin(x)))


def test_a_break_inside_a_submodule(capsys):
    torch.manual_seed(0)
    model = Outer()
    compiled, backend = _compiled(model)
    x = torch.randn(2, 4)
    _same(compiled(x), model(x))
    _same(compiled(x), model(x))
    assert len(backend.graphs) == 4  # lin | x + 1 | x * 2 | lin


def in_no_grad(x):
    with torch.no_grad():
        y = x * 2
        print("inside no_grad")
        z = y + 1
    return z * x, z.requires_grad, torch.is_grad_enabled()


def test_a_break_inside_no_grad_keeps_the_blocks_grad_mode(capsys):
    x = torch.randn(3, requires_grad=True)
    backend = _check(in_no_grad, x, graphs=2)
    compiled, _ = _compiled(in_no_grad)
    out, z_requires_grad, grad_on = compiled(x)
    assert not z_requires_grad and grad_on and torch.is_grad_enabled()
    (grad,) = torch.autograd.grad(out.sum(), x)
    (expected,) = torch.autograd.grad(in_no_grad(x)[0].sum(), x)
    torch.testing.assert_close(grad, expected)
    assert backend.ops()[0] >= 1


def test_nested_grad_mode_blocks(capsys):
    def f(x):
        with torch.no_grad():
            a = x * 2
            with torch.enable_grad():
                b = x * 3
                print("both")
                c = b * a
            d = c + 1
        return d, c.requires_grad, d.requires_grad

    _check(f, torch.randn(3, requires_grad=True), graphs=2)


def test_item_feeding_an_if():
    def f(x):
        n = x.sum().item()
        if n > 0:
            return x + n
        return x - n

    compiled, backend = _compiled(f)
    for x in (torch.ones(3), -torch.ones(3)):
        _same(compiled(x), f(x))
    # one graph before .item(); the resume function once per value of n it was called with
    assert len(backend.graphs) == 3
    assert BREAKS[0].kind == "data_dependent"


def test_graph_work_after_a_break_uses_the_breaks_value():
    def f(x):
        y = x.relu()
        k = int(y.sum().item() * 10) % 3 + 1
        return y * k + y.cos(), k

    backend = _check(f, torch.tensor([0.31, 0.2, -1.0]), graphs=2)
    assert backend.ops() == [2, 3]  # relu, sum | mul, cos, add


def test_a_local_first_assigned_after_the_break_stays_unbound_until_then():
    def f(x, flag):
        if flag:
            late = x + 1
        print("break")
        if not flag:
            return x * 2
        return late * 2

    compiled, backend = _compiled(f)
    for flag in (True, False):
        _same(compiled(torch.ones(2), flag), f(torch.ones(2), flag))


def test_an_exception_after_the_break_reaches_the_user_with_its_line():
    def f(x):
        print("before")
        raise ValueError("after the break")

    compiled, _ = _compiled(f)
    with pytest.raises(ValueError, match="after the break"):
        compiled(torch.ones(1))


def test_fullgraph_turns_the_break_into_an_error():
    compiled, _ = _compiled(middle, fullgraph=True)
    with pytest.raises(kiln.CaptureError, match="print"):
        compiled(torch.ones(2))


def test_the_kiln_backend_compiles_each_graph(capsys):
    kiln.reset()
    compiled = kiln.compile(calls_helper)
    x = torch.randn(8)
    _same(compiled(x), calls_helper(x))
    assert compiled.kiln_cache.fallback is None
    assert [e.graph is not None for e in compiled.kiln_cache.entries] == [True]


def in_autocast(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = x @ w
        print("inside autocast")
        z = y @ w
    return z.float() + 1, y.dtype, z.dtype, torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("backend", ["counting", "kiln"])
def test_a_break_inside_autocast_keeps_the_blocks_state(backend, capsys):
    torch.manual_seed(0)
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    if backend == "counting":
        _check(in_autocast, x, w, graphs=2)
    else:
        kiln.reset()
        compiled = kiln.compile(in_autocast)
        for _ in range(2):
            _same(compiled(x, w), in_autocast(x, w))
        assert compiled.kiln_cache.fallback is None
    assert not torch.is_autocast_enabled("cpu")


def test_a_break_inside_no_grad_with_the_kiln_backend(capsys):
    kiln.reset()
    compiled = kiln.compile(in_no_grad)
    x = torch.randn(3, requires_grad=True)
    out, z_requires_grad, grad_on = compiled(x)
    expected = in_no_grad(x)
    _same((out.detach(), z_requires_grad, grad_on), (expected[0].detach(), *expected[1:]))
    (grad,) = torch.autograd.grad(out.sum(), x)
    (want,) = torch.autograd.grad(expected[0].sum(), x)
    torch.testing.assert_close(grad, want)
    assert torch.is_grad_enabled()


def test_a_break_inside_a_hooked_submodule_compiles_its_forward_as_a_frame_of_its_own(capsys):
    torch.manual_seed(0)
    model = Outer()
    model.inner.register_forward_hook(lambda module, args, out: out + 1)
    compiled, backend = _compiled(model)
    x = torch.randn(2, 4)
    _same(compiled(x), model(x))
    # lin | x + 1 | x * 2 | lin: the hooked module called by nn.Module (its hook run eagerly), its forward compiled
    assert len(backend.graphs) == 4 and "forward" not in model.inner.__dict__
    assert any("hooks run eagerly" in b.explanation and b.resumed for b in BREAKS)


def test_a_break_in_a_hook_compiles_the_modules_forward_as_a_frame_of_its_own(capsys):
    seen = []

    @torch.compiler.disable
    def hook(module, args):
        seen.append(1)

    lin = nn.Linear(4, 4)
    lin.register_forward_pre_hook(hook)
    compiled, backend = _compiled(nn.Sequential(nn.ReLU(), lin))
    x = torch.randn(2, 4)
    _same(compiled(x), lin(x.relu()))
    assert seen == [1, 1] and any("torch._C._nn.linear" in gm.code for gm in backend.graphs)


def test_a_sparse_tensor_input_runs_the_frame_eagerly_with_a_record():
    # A sparse tensor has no strides to guard on: the frame runs eagerly, recorded, instead of
    # raising out of guard generation.
    BREAKS.clear()
    dense = torch.tensor([[0.0, 2.0], [3.0, 0.0]])
    fn, backend = _compiled(lambda s, d: torch.sparse.mm(s, d) + 1)
    sparse = dense.to_sparse_csr()
    torch.testing.assert_close(fn(sparse, dense), torch.sparse.mm(sparse, dense) + 1)
    assert backend.graphs == []
    assert BREAKS and BREAKS[0].kind == "sparse_tensor"


def test_a_torch_function_given_an_object_no_graph_can_spell_is_inlined():
    # An nn.Module passed to a torch Python function: as a graph constant the graph's code would
    # name a class it does not import (NameError when run); the function's body is captured instead.
    BREAKS.clear()
    distance = nn.PairwiseDistance()
    a, p, n = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4)
    fn = lambda a, p, n: torch.nn.functional.triplet_margin_with_distance_loss(  # noqa: E731
        a * 2, p, n, distance_function=distance).sin()
    compiled, backend = _compiled(fn)
    torch.testing.assert_close(compiled(a, p, n), fn(a, p, n))
    assert len(backend.graphs) == 1 and BREAKS == []
    assert "PairwiseDistance" not in backend.graphs[0].code


def test_masked_reductions_are_graph_calls_without_a_break():
    # torch.masked's ops live in torch.masked._ops, whose helpers build a class at run time (an
    # opcode kiln does not capture): they are graph calls, traced by the AOT layer, as torch's others.
    BREAKS.clear()
    x = torch.randn(3, 4)
    mask = x > 0
    fn = lambda x: torch.masked.sum(x, 0, mask=mask) + torch.masked.softmax(x, 1, mask=mask)  # noqa: E731
    compiled, backend = _compiled(fn)
    torch.testing.assert_close(compiled(x), fn(x), equal_nan=True)
    assert len(backend.graphs) == 1 and BREAKS == []


def test_an_op_returning_a_sparse_tensor_is_left_to_eager_with_a_record():
    BREAKS.clear()
    x = torch.tensor([[0.0, 2.0], [3.0, 0.0]])
    compiled, backend = _compiled(lambda x: (x * 2).to_sparse())
    torch.testing.assert_close(compiled(x).to_dense(), (x * 2))
    assert BREAKS and {r.kind for r in BREAKS} == {"sparse_tensor"}


class Mode(str, enum.Enum):
    NONE = "none"


class Level(enum.IntEnum):
    HIGH = 2


def _enum_locals_over_a_break(x, mode=Mode.NONE, level=Level.HIGH):
    y = x + 1
    print("break")  # a graph break with enum constants among the live locals (HF's BLOOM)
    return y * level if mode is Mode.NONE else y


def test_enum_constants_live_across_a_break_are_rebuilt_as_themselves(capsys):
    compiled, backend = _compiled(_enum_locals_over_a_break)
    x = torch.randn(3)
    _same(compiled(x), _enum_locals_over_a_break(x))
    assert len(backend.graphs) == 2


def test_a_failure_inside_kilns_capture_runs_the_frame_eagerly_and_says_so(monkeypatch):
    from kiln.capture import cache

    def broken(*args, **kwargs):
        raise AssertionError("an invariant of the interpreter")

    monkeypatch.setattr(cache, "capture", broken)
    kiln.reset()

    def fn(x):
        return x * 2

    compiled = kiln.compile(fn)
    with pytest.warns(Warning, match="kiln's capture failed: AssertionError"):
        _same(compiled(torch.ones(2)), fn(torch.ones(2)))
    assert BREAKS[-1].kind == "internal_error" and BREAKS[-1].function == "fn"
    with pytest.raises(AssertionError, match="invariant"):
        kiln.compile(lambda x: x + 1, fullgraph=True)(torch.ones(2))


class Doubled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class WithAFunction(nn.Module):
    """HF's BLOOM: an autograd.Function in a closure-bearing forward (its GeLU)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        offset = 1.0

        def shifted(y):
            return y + offset

        return shifted(Doubled.apply(self.lin(x))).relu()


def test_an_autograd_function_in_a_closure_bearing_forward_runs(capsys):
    module = WithAFunction()
    compiled = kiln.compile(module)
    x = torch.randn(3, 4)
    with torch.no_grad():
        for _ in range(2):
            _same(compiled(x), module(x))


def short_circuit(a, b):
    both = a.sum() > b.sum() and a.sum() > 0
    either = a.max() > 5 or b.min() < -1
    if both:
        return a * 2, either
    return b * 3, either


def test_and_or_over_tensor_conditions_resume():
    # `x and y` / `x or y` on tensors decide a jump that keeps the value (3.11's
    # JUMP_IF_FALSE_OR_POP / JUMP_IF_TRUE_OR_POP): the graph breaks there and resumes on the side
    # taken, the kept value on the stack; the whole frame had run eagerly (found by Dynamo's
    # test_control_flow4/5).
    for a, b in ((torch.ones(4), torch.full((4,), -2.0)), (torch.full((4,), -2.0), torch.ones(4))):
        compiled, backend = _compiled(short_circuit)
        _same(compiled(a, b), short_circuit(a, b))
        assert backend.graphs and compiled.kiln_cache.fallback is None


def test_torch_func_transforms_run_eagerly_between_graphs():
    # Traced inside, vmap's graph replayed outside its level raised functorch's "tensor may have
    # escaped" error to the user.
    def fn(x):
        y = torch.vmap(torch.Tensor.acos_)(x)
        g = torch.func.grad(lambda t: (t * t).sum())(x.sin())
        return y is x, g.cos()

    x = torch.rand(4, 1)
    got, want = kiln.compile(fn, backend="eager")(x.clone()), fn(x.clone())
    assert got[0] is want[0] is True
    torch.testing.assert_close(got[1], want[1])


def test_partials_made_before_a_break_are_alive_after_it():
    import functools

    def mul(x, y):
        return x * y

    def fn(x):
        by_name, by_position = functools.partial(mul, y=x), functools.partial(mul, x + 1)
        kiln.graph_break()
        return by_name(x) + by_position(x)

    x = torch.randn(3)
    compiled = kiln.compile(fn, backend="eager")
    torch.testing.assert_close(compiled(x), fn(x))
    assert not compiled.kiln_cache.fallback


_ASSERTING = """
def f(x):
    b = x.sin()
    assert x[0] == 3, "first must be 3"
    assert not (x[1] == 0)
    assert x[2]
    return x.cos() + b


def g(x):
    assert x > 0
    return x
"""


def test_an_assert_on_a_one_element_tensor_is_checked_in_the_graph():
    namespace = {}
    exec(compile(_ASSERTING, "asserting.py", "exec"), namespace)  # (not rewritten by pytest, as a test's own asserts are)
    f = namespace["f"]

    compiled = kiln.compile(f, backend="aot_eager", fullgraph=True)  # (one graph: no break at the asserts)
    good = torch.tensor([3.0, 4, 5])
    torch.testing.assert_close(compiled(good), f(good))
    for bad, message in (([2.0, 4, 5], "first must be 3"), ([3.0, 0, 5], ""), ([3.0, 4, 0], "")):
        with pytest.raises(RuntimeError, match=message):
            compiled(torch.tensor(bad))
    with pytest.raises(kiln.CaptureError):  # (a tensor of many elements: eager refuses its truth, kiln breaks there)
        kiln.compile(namespace["g"], fullgraph=True)(torch.randn(3))
