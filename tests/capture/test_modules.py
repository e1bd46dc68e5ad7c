"""nn.Modules under kiln.compile: containers, hooks, the compiled module as the original, training."""

import copy

import pytest
import torch
from torch import nn

import kiln
from tests.capture.util import assert_same


def compile_and_compare(module, *args, entries=1):
    """Compile `module` (fullgraph), call it and the original, compare; returns the compiled module."""
    compiled = kiln.compile(module, backend="eager", fullgraph=True)
    expected = module(*args)
    actual = compiled(*args)
    assert_same(actual, expected)
    assert len(compiled.kiln_cache.entries) == entries
    assert compiled.kiln_cache.fallback is None
    return compiled


class Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 3)})
        self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x).relu()
        x = self.layers[-1](x) + self.layers[0](x)
        x = self.seq(x) + self.seq[0](x) + self.seq[-1](x)
        for i, layer in enumerate(self.seq):
            if i < 2:
                x = layer(x)
        outs = {name: head(x) for name, head in self.heads.items()}
        outs["n"] = len(self.layers) + len(self.heads)
        outs["sum"] = sum(self.heads[k](x).sum() for k in self.heads)
        outs["has_a"] = "a" in self.heads
        return outs


def test_containers_iteration_and_indexing():
    torch.manual_seed(0)
    compile_and_compare(Blocks(), torch.randn(2, 4))


def test_sequential_compiled_directly():
    torch.manual_seed(0)
    compile_and_compare(nn.Sequential(nn.Linear(3, 5), nn.GELU(), nn.LayerNorm(5), nn.Linear(5, 2)), torch.randn(4, 3))


def test_module_list_slice():
    class Sliced(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(3, 3) for _ in range(4)])

        def forward(self, x):
            for layer in self.layers[1:3]:
                x = layer(x)
            return x

    torch.manual_seed(0)
    compile_and_compare(Sliced(), torch.randn(2, 3))


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 3)
        self.scale = 1.0

    def forward(self, x):
        return self.proj(x) * self.scale


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Inner()
        self.register_buffer("offset", torch.ones(3))

    def forward(self, x):
        return self.inner(x) + self.offset


def test_forward_hooks_on_module_and_submodule():
    torch.manual_seed(0)
    model = Outer()
    seen = []
    model.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
    model.register_forward_hook(lambda mod, args, out: out + 1)
    model.inner.register_forward_hook(lambda mod, args, out: out * 3)
    model.inner.register_forward_pre_hook(lambda mod, args, kwargs: (args, kwargs), with_kwargs=True)

    def record_only(mod, args, out):
        seen.append(type(mod).__name__)

    model.inner.proj.register_forward_hook(record_only)
    x = torch.randn(2, 3)
    compiled = kiln.compile(model, backend="eager", fullgraph=True)
    expected = model(x)
    count = len(seen)
    actual = compiled(x)
    assert_same(actual, expected)
    # the hook's list append is replayed: eager and compiled both appended once per call
    assert len(seen) == count + 1


def test_hook_registered_after_compile_is_followed():
    torch.manual_seed(0)
    model = Outer()
    compiled = compile_and_compare(model, torch.randn(2, 3))
    handle = model.register_forward_hook(lambda mod, args, out: out * -1)
    x = torch.randn(2, 3)
    assert_same(compiled(x), model(x))
    handle.remove()
    assert_same(compiled(x), model(x))


def test_compiled_module_behaves_as_original():
    torch.manual_seed(0)
    model = Outer()
    compiled = kiln.compile(model, backend="eager", fullgraph=True)
    assert compiled.inner is model.inner
    assert compiled.offset is model.offset
    assert compiled.inner.scale == 1.0
    assert [n for n, _ in compiled.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert all(a is b for a, b in zip(compiled.parameters(), model.parameters()))
    assert list(compiled.state_dict()) == list(model.state_dict()) == ["offset", "inner.proj.weight", "inner.proj.bias"]
    assert [n for n, _ in compiled.named_modules()] == [n for n, _ in model.named_modules()]
    assert compiled.training is model.training


def test_load_state_dict_through_compiled():
    torch.manual_seed(0)
    model, other = Outer(), Outer()
    compiled = compile_and_compare(model, torch.randn(2, 3))
    compiled.load_state_dict(other.state_dict())
    x = torch.randn(2, 3)
    assert_same(compiled(x), other(x))
    assert_same(model.inner.proj.weight, other.inner.proj.weight)


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        y = self.lin(x)
        if self.training:
            return y * 2
        return y - 1


def test_train_eval_switching_recompiles_and_follows():
    torch.manual_seed(0)
    model = Branchy()
    compiled = kiln.compile(model, backend="eager", fullgraph=True)
    x = torch.randn(2, 3)
    assert_same(compiled(x), model(x))
    assert compiled.eval() is compiled
    assert not model.training
    assert_same(compiled(x), model(x))
    assert_same(compiled(x), model.lin(x) - 1)
    model.train()
    assert compiled.training
    assert_same(compiled(x), model.lin(x) * 2)
    # every change of a watched module retires the entries captured before it (module_watch.py)
    assert len(compiled.kiln_cache.entries) in (2, 3)
    assert compiled.kiln_cache.fallback is None


def test_train_eval_switching_on_submodule_through_compiled():
    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = Branchy()

        def forward(self, x):
            return self.body(x) + (1.0 if self.training else 0.0)

    torch.manual_seed(0)
    model = Wrapper()
    compiled = compile_and_compare(model, torch.randn(2, 3))
    x = torch.randn(2, 3)
    for mode in (False, True, False, True):
        compiled.train(mode)
        assert model.training is mode and model.body.training is mode
        assert_same(compiled(x), model(x))
    compiled.body.eval()  # only the submodule
    assert model.training and not model.body.training
    assert_same(compiled(x), model.body.lin(x) - 1 + 1.0)


def test_attribute_change_after_compile():
    torch.manual_seed(0)
    model = Outer()
    compiled = compile_and_compare(model, torch.randn(2, 3))
    model.inner.scale = 2.0
    x = torch.randn(2, 3)
    assert_same(compiled(x), model(x))
    compiled.inner.scale = -1.5  # through the compiled module
    assert model.inner.scale == -1.5
    assert_same(compiled(x), model(x))


def test_attribute_set_on_compiled_module_reaches_original():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.k = 1.0

        def forward(self, x):
            return x * self.k

    model = Scaled()
    compiled = compile_and_compare(model, torch.randn(3))
    compiled.k = 4.0
    assert model.k == 4.0
    x = torch.randn(3)
    assert_same(compiled(x), x * 4.0)


def test_replacing_a_submodule():
    torch.manual_seed(0)
    model = Outer()
    compiled = compile_and_compare(model, torch.randn(2, 3))
    model.inner.proj = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    x = torch.randn(2, 3)
    assert_same(compiled(x), model(x))
    compiled.inner = Inner()
    assert model.inner is compiled.inner
    assert_same(compiled(x), model(x))


def test_parameter_updated_in_place_is_seen():
    torch.manual_seed(0)
    model = Outer()
    compiled = compile_and_compare(model, torch.randn(2, 3))
    with torch.no_grad():
        model.inner.proj.weight.mul_(2)
    x = torch.randn(2, 3)
    assert_same(compiled(x), model(x))


def test_training_step_gradients_match_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, backend="eager", fullgraph=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(3):
        x, target = torch.randn(5, 4), torch.randn(5, 1)
        loss = nn.functional.mse_loss(compiled(x), target)
        ref_loss = nn.functional.mse_loss(reference(x), target)
        assert_same(loss, ref_loss)
        opt.zero_grad()
        ref_opt.zero_grad()
        loss.backward()
        ref_loss.backward()
        for p, q in zip(model.parameters(), reference.parameters()):
            assert_same(p.grad, q.grad)
        opt.step()
        ref_opt.step()
    assert len(compiled.kiln_cache.entries) == 1


def test_module_with_kwargs_and_structured_output():
    class KW(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(2, 2)

        def forward(self, x, *, mask=None, scale=1.0):
            y = self.a(x) * scale
            if mask is not None:
                y = y.masked_fill(mask, 0.0)
            return {"y": y, "pair": (y.sum(), scale)}

    torch.manual_seed(0)
    model = KW()
    compiled = kiln.compile(model, backend="eager", fullgraph=True)
    x, mask = torch.randn(3, 2), torch.rand(3, 2) > 0.5
    assert_same(compiled(x, mask=mask, scale=2.0), model(x, mask=mask, scale=2.0))
    assert_same(compiled(x), model(x))


def test_module_method_calling_super_forward():
    class Base(nn.Linear):
        def forward(self, x):
            return super().forward(x).relu()

    torch.manual_seed(0)
    compile_and_compare(Base(3, 3), torch.randn(2, 3))


def test_module_returning_self_attribute_list_is_guarded():
    class Cfg(nn.Module):
        def __init__(self):
            super().__init__()
            self.sizes = [1, 2]

        def forward(self, x):
            return x * len(self.sizes)

    model = Cfg()
    compiled = compile_and_compare(model, torch.randn(2))
    model.sizes.append(3)  # in-place change of a mutable attribute: guarded where read
    x = torch.randn(2)
    assert_same(compiled(x), x * 3)


def test_building_a_module_inside_is_unsupported():
    def f(x):
        return nn.Linear(2, 2)(x)

    import pytest

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    with pytest.raises(kiln.CaptureError):
        compiled(torch.randn(2))
    fallback = kiln.compile(f, backend="eager")
    assert fallback(torch.randn(2)).shape == (2,)


class Config:
    def __init__(self):
        self.scale = 2.0
        self.use_bias = True


class Configured(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.lin = nn.Linear(3, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        y = self.lin(x) * self.config.scale
        if self.config.use_bias:
            y = y + 1
        return y


def test_config_object_changed_in_place_after_compile():
    torch.manual_seed(0)
    model = Configured(Config())
    compiled = compile_and_compare(model, torch.randn(2, 3))
    x = torch.randn(2, 3)
    model.config.scale = -3.0
    assert_same(compiled(x), model(x))
    model.config.use_bias = False
    assert_same(compiled(x), model(x))


def test_counter_written_in_forward_is_replayed():
    torch.manual_seed(0)
    model, reference = Configured(Config()), None
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, backend="eager", fullgraph=True)
    x = torch.randn(2, 3)
    for _ in range(3):
        assert_same(compiled(x), reference(x))
    assert model.calls == reference.calls == 3


def test_batchnorm_running_stats_updated_in_training():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    reference = copy.deepcopy(model)
    compiled = kiln.compile(model, backend="eager", fullgraph=True)
    for _ in range(2):
        x = torch.randn(5, 3)
        assert_same(compiled(x), reference(x))
    assert_same(model[1].running_mean, reference[1].running_mean)
    assert_same(model[1].running_var, reference[1].running_var)
    assert int(model[1].num_batches_tracked) == int(reference[1].num_batches_tracked) == 2
    model.eval()
    reference.eval()
    x = torch.randn(5, 3)
    assert_same(compiled(x), reference(x))


def test_dropout_eval_is_identity_and_train_is_random():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5)).eval()
    compiled = compile_and_compare(model, torch.randn(4, 3))
    model.train()
    torch.manual_seed(1)
    actual = compiled(torch.ones(64, 3))
    torch.manual_seed(1)
    expected = model(torch.ones(64, 3))
    assert_same(actual, expected)


class ClampsItsShift(nn.Module):
    """HF's Swin: every call sets `shift` (never read before) and re-assigns `window` the value it
    reads; the first call changes `shift` from its constructor's value."""

    def __init__(self):
        super().__init__()
        self.window, self.shift = 7, 3

    def forward(self, x):
        if x.shape[-1] <= self.window:
            self.shift = 0
            self.window = min(x.shape[-1], self.window)
        return torch.roll(x, self.shift, -1) if self.shift else x * 2


@pytest.mark.parametrize("width,entries", [(7, 1), (5, 2)])
def test_a_forward_that_sets_its_own_attributes_compiles_once(width, entries):
    # Width 7: `window` keeps the 7 it read, `shift` is never read: one entry for every call.
    # Width 5: the first call changes `window` from the 7 its graph read (a second entry, which
    # reads 5 and writes 5 back: it serves every later call).
    module = ClampsItsShift()
    compiled = kiln.compile(ClampsItsShift(), backend="eager", fullgraph=True)
    x = torch.randn(2, width)
    for _ in range(4):
        assert_same(compiled(x), module(x))
    assert len(compiled.kiln_cache.entries) == entries
    assert (compiled.shift, compiled.window) == (0, width)


class Counts(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls = self.calls + 1  # read, then a new value: the next call's graph must see it
        return x * self.calls


def test_a_forward_that_updates_what_it_read_sees_each_new_value():
    compiled = kiln.compile(Counts(), backend="eager")
    x = torch.ones(3)
    assert [compiled(x)[0].item() for _ in range(3)] == [1.0, 2.0, 3.0]


def test_a_frames_own_writes_still_retire_other_frames_that_read_them():
    module = ClampsItsShift()
    reader = kiln.compile(lambda x: x + module.shift, backend="eager", fullgraph=True)
    x = torch.zeros(2, 5)
    assert reader(x)[0, 0].item() == 3.0
    kiln.compile(module, backend="eager", fullgraph=True)(x)  # sets module.shift = 0
    assert reader(x)[0, 0].item() == 0.0


def test_eval_again_between_calls_keeps_the_compiled_entry():
    # `model.eval()` before every call re-assigns `training = False` on each module: no change.
    # (Dropout reads `training`: train() then is a change its graph decided on.)
    compiled = kiln.compile(nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5), nn.ReLU()).eval(), backend="eager",
                            fullgraph=True)
    x = torch.randn(2, 3)
    for _ in range(3):
        compiled.eval()
        compiled(x)
    assert len(compiled.kiln_cache.entries) == 1
    compiled.train()
    compiled(x)
    assert len(compiled.kiln_cache.entries) == 2  # a real change still retires the entry


class ReadsItsDict(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 1

    def forward(self, x):
        scale = self.__dict__["scale"]  # read as the whole dict: still a read before the write
        self.scale = scale + 1
        return x * scale


def test_a_forward_that_reads_its_dict_before_writing_sees_each_new_value():
    compiled = kiln.compile(ReadsItsDict(), backend="eager")
    x = torch.ones(2)
    assert [compiled(x)[0].item() for _ in range(3)] == [1.0, 2.0, 3.0]


def test_registering_on_a_module_inside_takes_effect():
    # A module's _modules/_parameters/_buffers are read as copies of the tables: a registration
    # through them (ModuleDict.update/__setitem__, add_module, register_buffer/parameter) breaks
    # the graph and runs in Python, on the module's own table — found by Dynamo's test
    # test_dict_reconstruct_keeps_original_order, where kiln had dropped ModuleDict.update.
    relu, sig = nn.ReLU(), nn.Sigmoid()

    def update(md, x):
        md.update({"b": sig})
        return x + 1

    def setitem(md, x):
        md["b"] = sig
        return x + 1

    def add(md, x):
        md.add_module("b", sig)
        return x * 2

    def buffers(m, x):
        m.register_buffer("scale", x * 3)
        m.register_parameter("w", nn.Parameter(torch.ones(2)))
        return x + len(m._modules)

    for fn in (update, setitem, add):
        md = nn.ModuleDict({"a": relu})
        x = torch.randn(2)
        out = kiln.compile(fn, backend="eager")(md, x)
        assert list(md.keys()) == ["a", "b"] and md["b"] is sig, fn.__name__
        assert_same(out, fn(nn.ModuleDict({"a": relu}), x))
        with pytest.raises(kiln.CaptureError, match="registering a module, parameter or buffer"):
            kiln.compile(fn, backend="eager", fullgraph=True)(nn.ModuleDict({"a": relu}), x)
    m, x = nn.Linear(2, 2), torch.randn(2)
    compiled = kiln.compile(buffers, backend="eager")
    assert_same(compiled(m, x), x)
    assert_same(m.scale, x * 3)
    assert "w" in dict(m.named_parameters())
    # Resumed after each registration, never run eagerly: register_parameter's `param.grad_fn`
    # once read as an AttributeError, wrongly, and the frame fell back.
    assert compiled.kiln_cache.fallback is None


class Enumerating(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
        self.register_buffer("s", torch.ones(3))

    def forward(self, x):
        for _, p in self.named_parameters():
            x = x + p.sum()
        for p in self.parameters(recurse=False):
            x = x + p.sum()  # (none: every parameter is a child's)
        for p in self.b.parameters():
            x = x * 1.0 + p.mean()
        for _, m in self.named_modules():
            if isinstance(m, nn.Linear):
                x = m(x)
        for _ in self.children():
            x = x + 1
        for _, p in self.b.named_parameters(prefix="b"):
            x = x + p.sum()
        buffers = [n for n, _ in self.named_buffers()]
        return x, buffers, [n for n, _ in self.b.named_children()], len(list(self.modules())), list(self.buffers())[0]


def test_named_parameters_and_the_other_enumerations_capture_whole():
    # nn.Module's generators over `yield from` (named_parameters, parameters, buffers, children,
    # modules and their named forms): one graph, eager's names and values — among the programs
    # Dynamo captures whole that kiln broke on.
    compile_and_compare(Enumerating().eval(), torch.randn(2, 3))


def test_an_enumeration_follows_a_reordered_table():
    # Dynamo's test_modules.py test_buffer_order/test_param_order/test_module_order: a write into
    # a module's table itself reorders what buffers()/parameters()/children() give; kiln kept the
    # first order (a wrong result) where the MODULE_STRUCTURE guard cannot see the write.
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.b1 = nn.Buffer(torch.ones(1))
            self.b2 = nn.Buffer(torch.ones(2))
            self.a = nn.Linear(1, 1)
            self.c = nn.Linear(1, 1, bias=False)

    m, coeffs = M(), [2.0, 3.0, 5.0]

    def fn(x):
        for i, b in enumerate(m.buffers()):
            x = x + b.sum() * coeffs[i]
        for i, (name, p) in enumerate(m.named_parameters()):
            x = x + p.sum() * coeffs[i % 3]
        for i, child in enumerate(m.children()):
            x = x + child.weight.sum() * coeffs[i]
        return x

    compiled = kiln.compile(fn, backend="eager")
    assert_same(compiled(torch.ones(1)), fn(torch.ones(1)))
    m._buffers["b1"] = m._buffers.pop("b1")
    assert_same(compiled(torch.ones(1)), fn(torch.ones(1)))
    m.a._parameters["weight"] = m.a._parameters.pop("weight")
    assert_same(compiled(torch.ones(1)), fn(torch.ones(1)))
    m._modules["a"] = m._modules.pop("a")
    assert_same(compiled(torch.ones(1)), fn(torch.ones(1)))
    assert len(compiled.kiln_cache.entries) == 4


_MODULE_CALL_AT_IMPORT = nn.Module.__call__


def test_module_call_compared_by_identity_inside():
    # Dynamo's test_repros.py test_is_symbolic_tracing (a trainer's "is FX tracing" check):
    # `nn.Module.__call__ is not saved` was True inside kiln's capture.
    def fn(x):
        if nn.Module.__call__ is not _MODULE_CALL_AT_IMPORT:
            return x * 2
        return x * 4

    torch.testing.assert_close(kiln.compile(fn, backend="eager", fullgraph=True)(torch.ones(2)), fn(torch.ones(2)))


def test_a_forward_storing_a_tensor_on_its_module():
    # Dynamo's test_modules.py test_assign_does_not_exist: `self.attr = tensor` inside forward is
    # set for real after the graph; read back on the next call it is an input (one recompile,
    # when the attribute first appears, then none).
    class Running(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            previous = getattr(self, "last", None)
            y = self.lin(x)
            if previous is not None:
                y = y + previous
            self.last = y * 2
            return y

    torch.manual_seed(0)
    model, reference = Running().eval(), Running().eval()
    reference.load_state_dict(model.state_dict())
    compiled = kiln.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(2, 4)
            torch.testing.assert_close(compiled(x), reference(x))
            torch.testing.assert_close(model.last, reference.last)
    assert len(compiled.kiln_cache.entries) == 2


class LazyOffset(torch.nn.modules.lazy.LazyModuleMixin, nn.Module):
    """A lazy module of the user's whose parameter is made by its first call (no
    UninitializedParameter: `has_uninitialized_params()` is False from the start)."""

    def initialize_parameters(self, x):
        with torch.no_grad():
            self.offset = nn.Parameter(torch.full(x.shape[-1:], 0.5))

    def forward(self, x):
        return x + self.offset


@pytest.mark.parametrize("make", [lambda: nn.Sequential(nn.LazyLinear(6), nn.ReLU(), nn.LazyLinear(2)), LazyOffset])
def test_a_lazy_modules_first_call_materializes_it_and_compiles_one_graph(make):
    model = make()
    compiled = kiln.compile(model, backend="eager", fullgraph=True)
    x = torch.randn(3, 4)
    out = compiled(x)  # the first call: made while capturing, from x's shape
    assert not any(isinstance(p, nn.parameter.UninitializedParameter) for p in model.parameters())
    torch.testing.assert_close(out, model(x))
    torch.testing.assert_close(compiled(x * 2), model(x * 2))
    if isinstance(model, nn.Sequential):
        assert type(model[0]) is nn.Linear and model[0].weight.shape == (6, 4)
    assert not hasattr(model, "_initialize_hook")


class SquaredReLU(nn.Module):
    """A module without parameters, as HF's activations are."""

    def __init__(self, offset=0.0):
        super().__init__()
        self.offset = offset

    def forward(self, x):
        return torch.relu(x + self.offset) ** 2


def test_a_module_without_parameters_built_inside_is_traced_and_returned_anew():
    def fn(x):
        act = SquaredReLU(offset=0.5)
        return act(x) + nn.Tanh()(x), act

    compiled = kiln.compile(fn, backend="eager", fullgraph=True)
    x = torch.randn(4)
    out, act = compiled(x)
    torch.testing.assert_close(out, fn(x)[0])
    out2, act2 = compiled(x)
    assert type(act) is SquaredReLU and act.offset == 0.5 and act is not act2  # a new module each call, as in eager


def test_a_module_with_parameters_built_inside_breaks_the_graph():
    def fn(x):
        return nn.Linear(4, 4)(x)

    with pytest.raises(kiln.CaptureError, match="building the module Linear inside a compiled function with parameters"):
        kiln.compile(fn, backend="eager", fullgraph=True)(torch.randn(2, 4))
    state = torch.random.get_rng_state()
    kiln.compile(fn, backend="eager")(torch.randn(2, 4))  # (runs eagerly; the trial drew nothing for good)
    assert not torch.equal(state, torch.random.get_rng_state())  # eager's own draw only


def test_a_module_built_inside_is_one_object_wherever_it_is_kept():
    def fn(x):
        act = nn.ReLU()
        return act(x), {"a": act, "b": act}, [act]

    _, held, listed = kiln.compile(fn, backend="eager", fullgraph=True)(torch.randn(2))
    assert held["a"] is held["b"] is listed[0]


def test_a_module_built_inside_from_another_module_breaks_the_graph():
    def fn(x):
        act = nn.ReLU()
        return nn.Sequential(act)(x)  # (Sequential keeps act itself: not rebuilt from constants)

    with pytest.raises(kiln.CaptureError, match="building the module Sequential inside a compiled function from values"):
        kiln.compile(fn, backend="eager", fullgraph=True)(torch.randn(2))


def test_a_slice_of_a_module_container_is_a_container_of_its_class():
    # (a tuple before: calling `seq[1:](x)` raised "'tuple' object is not callable" to the user)
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
            self.ml = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

        def forward(self, x):
            y = self.seq[1:](x)
            for m in self.ml[1:]:
                y = m(y)
            return y, len(self.seq[:2]), type(self.seq[1:]) is nn.Sequential, self.ml[::2]

    m, x = M(), torch.randn(2, 4)
    got, want = kiln.compile(m, backend="eager", fullgraph=True)(x), m(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1:3] == want[1:3] and type(got[3]) is nn.ModuleList and list(got[3]) == list(want[3])

    l1, l2 = nn.Linear(5, 5), nn.Linear(5, 5)

    def built_inside(x):
        return nn.Sequential(l1, l2)[1:](x)

    x = torch.randn(5, 5)
    torch.testing.assert_close(kiln.compile(built_inside, backend="eager")(x), built_inside(x))


class WithPredict(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3)

    def forward(self, x):
        return self.linear(x).relu()

    def predict(self, x):
        return self(x).argmax(-1)  # the original module called from its own method

    def fail(self, x):
        self(x)
        raise ValueError("a failure of the user's own")


def _calls_compiled(compiled):
    """The graphs the compiled forward a routed method uses has captured (counted through its cache)."""
    route = compiled.__dict__["_forward_route"]
    return 0 if route.compiled is None else len(route.compiled[1].kiln_cache.entries)


def test_a_method_called_through_the_compiled_module_runs_the_module_compiled():
    """`kiln.compile(model).generate(...)`: HF's method calls `self(...)` on the original module,
    which would run eagerly; through the wrapper, the original's forward is the compiled one for
    the method's duration, and only then."""
    torch.manual_seed(0)
    module = WithPredict().eval()
    compiled = kiln.compile(module, backend="eager", fullgraph=True)
    x = torch.randn(2, 4)
    assert torch.equal(compiled.predict(x), module.predict(x))
    assert _calls_compiled(compiled) == 1 and "forward" not in module.__dict__
    assert compiled.predict.__name__ == "predict"
    with pytest.raises(ValueError, match="of the user's own"):
        compiled.fail(x)
    assert "forward" not in module.__dict__  # put back after a failure too
    module.predict(x)  # the original, called directly: eager, nothing captured
    assert _calls_compiled(compiled) == 1


def test_a_forward_the_user_set_on_the_instance_is_the_one_compiled_and_is_put_back():
    module = WithPredict().eval()

    def doubled(x):
        return WithPredict.forward(module, x) * 2

    module.forward = doubled
    compiled = kiln.compile(module, backend="eager", fullgraph=True)
    x = torch.randn(2, 4)
    assert torch.equal(compiled.predict(x), (module.linear(x).relu() * 2).argmax(-1))
    assert module.__dict__["forward"] is doubled and _calls_compiled(compiled) == 1


def test_a_forward_a_routed_method_sets_is_kept():
    """A method that wraps the forward it finds (accelerate's hooks do) keeps its wrapper: the
    route puts back the original's forward only where its compiled one is still in place."""
    module = WithPredict().eval()
    compiled = kiln.compile(module, backend="eager", fullgraph=True)

    def wrap(self):
        inner = self.forward
        self.forward = lambda x: inner(x) + 1

    WithPredict.wrap = wrap
    try:
        compiled.wrap()
    finally:
        del WithPredict.wrap
    x = torch.randn(2, 4)
    torch.testing.assert_close(module(x), module.linear(x).relu() + 1)


def test_a_forward_compiled_already_is_compiled_again_from_its_original():
    """`model.forward = kiln.compile(model.forward)` then `kiln.compile(model)`: the routed forward is
    the original function compiled with the module's settings, not kiln's wrapper captured (its
    timing code would break the graph)."""
    kiln.reset()
    module = WithPredict().eval()
    module.forward = kiln.compile(module.forward, backend="eager")
    compiled = kiln.compile(module, backend="eager", fullgraph=True)
    x = torch.randn(2, 4)
    assert torch.equal(compiled.predict(x), module.linear(x).relu().argmax(-1))
    assert _calls_compiled(compiled) == 1 and kiln.capture.BREAKS == []
