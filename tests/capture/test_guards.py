"""Each guard kind: a call that breaks the assumption recompiles, one that keeps it does not."""

import pytest
import torch

import kiln
from kiln.capture.guards import GuardSet, Guard
from kiln.capture.sources import LocalSource
from tests.capture.util import assert_same


def _entries(compiled) -> int:
    return len(compiled.kiln_cache.entries)


def _compiled(fn):
    return kiln.compile(fn, backend="eager", fullgraph=True)


def test_tensor_match_dtype_shape_stride_requires_grad():
    f = _compiled(lambda x: x * 2)
    x = torch.randn(3, 4)
    f(x)
    f(torch.randn(3, 4))
    assert _entries(f) == 1
    for changed in (x.double(), torch.randn(5, 4), torch.randn(4, 3).t(), x.clone().requires_grad_()):
        before = _entries(f)
        torch.testing.assert_close(f(changed), changed * 2)
        assert _entries(f) == before + 1
        f(changed)
        assert _entries(f) == before + 1


def test_equals_on_python_constants():
    f = _compiled(lambda x, n: x + n)
    x = torch.ones(2)
    f(x, 1)
    f(x, 1)
    assert _entries(f) == 1
    torch.testing.assert_close(f(x, 2), x + 2)
    assert _entries(f) == 2
    torch.testing.assert_close(f(x, 2.0), x + 2.0)  # 2 == 2.0, but the type differs
    assert _entries(f) == 3


def test_type_and_length_match_on_containers():
    f = _compiled(lambda xs: sum(xs))
    a, b, c = torch.ones(2), torch.ones(2), torch.ones(2)
    f([a, b])
    f([a, b])
    assert _entries(f) == 1
    torch.testing.assert_close(f([a, b, c]), a + b + c)
    assert _entries(f) == 2
    torch.testing.assert_close(f((a, b)), a + b)
    assert _entries(f) == 3


def test_id_match_on_functions():
    f = _compiled(lambda act, x: act(x))
    x = torch.randn(4)
    f(torch.relu, x)
    f(torch.relu, x)
    assert _entries(f) == 1
    torch.testing.assert_close(f(torch.sigmoid, x), torch.sigmoid(x))
    assert _entries(f) == 2


def test_global_state_grad_mode():
    f = _compiled(lambda x: x * 3)
    x = torch.randn(2, requires_grad=True)
    assert f(x).requires_grad
    with torch.no_grad():
        assert not f(x).requires_grad
    assert _entries(f) == 2


def test_module_attribute_change_recompiles():
    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.factor = 2.0

        def forward(self, x):
            return x * self.factor

    m = Scale()
    f = kiln.compile(m, backend="eager", fullgraph=True)
    x = torch.ones(3)
    torch.testing.assert_close(f(x), x * 2)
    m.factor = 5.0
    torch.testing.assert_close(f(x), x * 5)
    assert _entries(f) == 2


def test_recompile_limit_stops_the_storm(caplog):
    f = kiln.compile(lambda x, n: x + n, backend="eager", fullgraph=True, options={"recompile_limit": 3})
    x = torch.zeros(2)
    with kiln.config.patch({"debug.logs": "recompiles"}):
        for n in range(8):  # (floats: an int that changes becomes a symbolic int instead)
            torch.testing.assert_close(f(x, n + 0.5), x + n + 0.5)
    assert _entries(f) == 3
    assert f.kiln_cache.eager_calls == 5
    assert any("recompile limit (3) reached" in r.getMessage() for r in caplog.records)
    assert any("EQUALS" in r.getMessage() and "failed" in r.getMessage() for r in caplog.records)


def test_guards_are_logged_and_compiled_to_one_function(caplog):
    with kiln.config.patch({"debug.logs": "guards"}):
        kiln.compile(lambda x: x + 1, backend="eager")(torch.ones(2))
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "TENSOR_MATCH" in text and "def check(L):" in text


def test_first_failure_names_the_guard():
    guards = GuardSet()
    guards.add(Guard("EQUALS", LocalSource("n", 0), 3))
    guards.add(Guard("TYPE_MATCH", LocalSource("s", 1), str))
    compiled = guards.compile()
    assert compiled.check((3, "a"))
    assert not compiled.check((4, "a"))
    assert compiled.first_failure((3, 1.0)).kind == "TYPE_MATCH"


class _Point:
    def __init__(self, v):
        self.v = v


class _OtherPoint(_Point):
    pass


class _Slotted:
    __slots__ = ("v", "extra")

    def __init__(self, v):
        self.v = v


class _Knob:
    gain = 2.0


def _reads_missing_attribute(x, obj):
    return x + (obj.extra if hasattr(obj, "extra") else 0)


# kind -> (function, first arguments, same again (no recompile), arguments that violate the guard)
_KINDS = {
    "TENSOR_MATCH": (lambda x: x + 1, lambda: (torch.ones(2),), lambda: (torch.zeros(2),), lambda: (torch.ones(3),)),
    "EQUALS": (lambda x, n: x + n, lambda: (torch.ones(2), 1), lambda: (torch.ones(2), 1), lambda: (torch.ones(2), 2)),
    "TYPE_MATCH": (lambda x, p: x + p.v, lambda: (torch.ones(2), _Point(1)), lambda: (torch.ones(2), _Point(1)),
                   lambda: (torch.ones(2), _OtherPoint(1))),
    "ID_MATCH": (lambda f, x: f(x), lambda: (torch.relu, torch.ones(2)), lambda: (torch.relu, torch.ones(2)),
                 lambda: (torch.neg, torch.ones(2))),
    "LENGTH_MATCH": (lambda xs: sum(xs), lambda: ([torch.ones(2)] * 2,), lambda: ([torch.zeros(2)] * 2,),
                     lambda: ([torch.ones(2)] * 3,)),
    "HASATTR": (_reads_missing_attribute, lambda: (torch.ones(2), _Slotted(1)), lambda: (torch.ones(2), _Slotted(2)),
                lambda: (torch.ones(2), _with_extra(_Slotted(1)))),
    "DICT_CONTAINS": (_reads_missing_attribute, lambda: (torch.ones(2), _Point(1)), lambda: (torch.ones(2), _Point(2)),
                      lambda: (torch.ones(2), _with_extra(_Point(1)))),
    "DICT_CONTAINS shadowing": (lambda x, k: x * k.gain, lambda: (torch.ones(2), _Knob()), lambda: (torch.ones(2), _Knob()),
                      lambda: (torch.ones(2), _with_gain(_Knob()))),
}


def _with_extra(p):
    p.extra = 5
    return p


def _with_gain(k):
    k.gain = 7.0
    return k


@pytest.mark.parametrize("kind", list(_KINDS))
def test_each_guard_kind_recompiles_only_when_violated(kind):
    fn, first, same, violating = _KINDS[kind]
    kind = kind.split()[0]
    f = _compiled(fn)
    assert_same(f(*first()), fn(*first()))
    assert kind in {g.kind for g in f.kiln_cache.entries[0].guards.guards}
    assert_same(f(*same()), fn(*same()))
    assert _entries(f) == 1
    bad = violating()
    assert f.kiln_cache.entries[0].guards.first_failure(f.kiln_cache.binder(*bad)).kind == kind
    assert_same(f(*bad), fn(*violating()))
    assert _entries(f) == 2


@pytest.mark.parametrize("change", ["autocast", "default_dtype"])
def test_global_state_autocast_and_default_dtype(change):
    f = _compiled(lambda x: torch.ones(2) @ x)
    x = torch.ones(2, 2)
    f(x)
    f(x)
    assert _entries(f) == 1
    if change == "autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert f(x).dtype == torch.bfloat16
    else:
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            assert f(x.double()).dtype == torch.float64
        finally:
            torch.set_default_dtype(old)
    assert _entries(f) == 2
    assert f(x).dtype == torch.float32
    assert _entries(f) == 2


def test_module_structure_child_replaced_recompiles():
    m = torch.nn.Sequential(torch.nn.ReLU())
    f = kiln.compile(m, backend="eager", fullgraph=True)
    x = torch.randn(4)
    assert_same(f(x), x.relu())
    assert_same(f(x), x.relu())
    assert _entries(f) == 1
    m[0] = torch.nn.Tanh()
    assert_same(f(x), x.tanh())
    assert _entries(f) == 2


def test_assigning_a_module_attribute_no_capture_read_keeps_the_entries():
    # HF's generate sets `model._previous_max_cache_length` whenever it makes a static cache of
    # another length; its forward never reads it. Such a write changes nothing a graph decided on:
    # no recompile. One the capture read (an instance attribute, or a name it looked up first on the
    # instance and found on the class) recompiles, and so does any write once `vars(self)` was read.
    class Scaled(torch.nn.Module):
        factor = 2.0

        def __init__(self):
            super().__init__()
            self.offset = 1.0

        def forward(self, x):
            return x * self.factor + self.offset

    model = Scaled()
    f = kiln.compile(model, backend="eager", fullgraph=True)
    x = torch.ones(3)
    assert_same(f(x), x * 2 + 1)
    model._previous_length = 7  # read by no capture
    model._previous_length = 8
    assert_same(f(x), x * 2 + 1)
    assert _entries(f) == 1
    model.offset = 5.0  # read: the next call recompiles with it
    assert_same(f(x), x * 2 + 5)
    assert _entries(f) == 2
    model.factor = 3.0  # an instance attribute now shadows the class's the capture read
    assert_same(f(x), x * 3 + 5)
    assert _entries(f) == 3

    class Everything(torch.nn.Module):
        def forward(self, x):
            return x * len(vars(self))

    whole = Everything()
    g = kiln.compile(whole, backend="eager", fullgraph=True)
    n = len(vars(whole))
    assert_same(g(x), x * n)
    whole.extra = 1  # vars(self) was read: every attribute counts
    assert_same(g(x), x * (n + 1))
    assert _entries(g) == 2


def test_autocast_on_another_device_keeps_an_entry_captured_with_it_off():
    # With autocast off at capture, one C call checks that no device's is on; when one is (here
    # XPU's, which changes nothing for CPU tensors) each checked device's state is read exactly.
    f = _compiled(lambda x: torch.ones(2) @ x)
    x = torch.ones(2, 2)
    f(x)
    torch.set_autocast_enabled("xpu", True)
    try:
        assert torch._C._is_any_autocast_enabled()
        assert f(x).dtype == torch.float32
    finally:
        torch.set_autocast_enabled("xpu", False)
    assert _entries(f) == 1


def test_a_method_replaced_on_the_class_after_compiling_recompiles():
    class Scale(torch.nn.Module):
        def forward(self, x):
            return x * 2

    model = Scale()
    f = kiln.compile(model)
    x = torch.ones(3)
    assert_same(f(x), x * 2)
    Scale.forward = lambda self, x: x * 3  # the class's dict changes: its bound view sees it
    assert_same(f(x), x * 3)
    assert _entries(f) == 2


def test_a_compiled_entry_does_not_keep_its_input_tensors_alive():
    # The TENSOR_MATCH guard keeps what it checks (type, dtype, device, sizes, strides,
    # requires_grad), not the tensor: a compiled function held its first call's inputs (and their
    # memory) for as long as it lived (found by Dynamo's test_release_input_memory).
    import gc
    import weakref

    x = torch.rand(4)
    ref = weakref.ref(x)
    compiled = kiln.compile(lambda t: t + t, backend="eager")
    torch.testing.assert_close(compiled(x), x + x)
    del x
    gc.collect()
    assert ref() is None
    y = torch.rand(4)
    torch.testing.assert_close(compiled(y), y + y)  # the entry still matches a tensor like it
    assert len(compiled.kiln_cache.entries) == 1
    assert not compiled.kiln_cache.entries[0].guards.check(compiled.kiln_cache.binder(torch.rand(5)))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_one_tensor_passed_twice_and_two_tensors_are_different_entries(backend):
    # Dynamo's test_repros.py test_avoid_dupe_specialization: after f(x, x), f(x, y) reused the
    # graph traced with one input for both (a wrong result).
    def f(x, y):
        return (x + y) * 1

    compiled = kiln.compile(f, backend=backend)
    for grad in (True, False):
        x, y = torch.randn(4, requires_grad=grad), torch.randn(4, requires_grad=grad)
        torch.testing.assert_close(compiled(x, x), f(x, x))
        torch.testing.assert_close(compiled(x, y), f(x, y))
        torch.testing.assert_close(compiled(y, y), f(y, y))


def test_a_size_and_a_tuple_of_the_same_sizes_are_different_inputs():
    # Dynamo's test_repros.py test_size_typematch: a torch.Size was guarded as a tuple.
    def f(x, y):
        return y + 1 if isinstance(x, torch.Size) else y + 2

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    y = torch.zeros(1)
    for x in (torch.Size((3,)), (3,), torch.Size((3,)), (3,)):
        torch.testing.assert_close(compiled(x, y), f(x, y))
    assert len(compiled.kiln_cache.entries) == 2


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (the eager frame is told once per code object)
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_inputs_sharing_memory_written_in_place_run_eagerly_and_right(backend):
    # Dynamo's test_dicts.py test_canonical_graph_overlapping_unsqueeze_with_mutation: two views of
    # one tensor, each written in place; the AOT layer wrote each back from its own value (a wrong
    # result), and f(a, a) added once. Such a frame runs eagerly, recorded.
    def f(x, y):
        x.add_(1)
        y.add_(1)
        return x

    base = torch.ones(4)
    compiled = kiln.compile(f, backend=backend)
    out = compiled(base.unsqueeze(0), base.unsqueeze(0))
    assert_same(out, torch.full((1, 4), 3.0))
    a = torch.ones(3)
    compiled(a, a)
    assert_same(a, torch.full((3,), 3.0))
    assert compiled.kiln_cache.fallback.kind == "aliased_input_mutation"


def test_distinct_inputs_written_in_place_stay_compiled():
    def f(x, y):
        x.add_(1)
        y.add_(1)
        return x + y

    compiled = kiln.compile(f, backend="aot_eager")
    a, b = torch.ones(3), torch.ones(3)
    assert_same(compiled(a, b), torch.full((3,), 4.0))
    assert compiled.kiln_cache.fallback is None and len(compiled.kiln_cache.entries) == 1


def test_the_extensions_alias_pattern_is_pythons():
    # The aliasing guard calls the extension's alias_pattern where the process has it: the same
    # indices as Python's for repeated objects, views of one tensor, empty tensors (sharing no
    # memory), meta tensors and devices, and the same refusal of a non-tensor by storage.
    from kiln.capture.guards import alias_pattern
    from kiln.native import python_door

    native = python_door.module().alias_pattern
    base, other = torch.randn(4, 4), torch.randn(3)
    empty = torch.empty(0)
    meta = torch.empty(3, device="meta")
    cases = [[], [base], [base, base[1], other, base, empty, torch.empty(0), other[1:], empty],
             [meta, torch.empty(3, device="meta"), base, meta], [base.t(), base.view(-1), torch.randn(4, 4)],
             # parts of one storage: disjoint rows, touching ends, a column (its span crosses the rows'),
             # a strided part, and another dtype's view of the same bytes
             [base[0], base[1], base[1:3], base[:, 0], base[3, ::2], base[3].view(torch.int32), base.view(-1)[4:8]]]
    for values in cases:
        for by_storage in (False, True):
            pattern = native(values, by_storage)
            assert pattern == alias_pattern(values, by_storage), (values, by_storage)
            # With the expected pattern: whether it is that one, the same in both.
            others = [pattern, pattern[:-1], pattern + (0,), tuple(i + 1 for i in pattern), (*pattern[:-1], "0"),
                      (*pattern[:-1], 2 ** 80)]
            for expected in others[: 1 if not pattern else None]:
                want = expected == pattern
                assert native(values, by_storage, expected) is want, (values, by_storage, expected)
                assert alias_pattern(values, by_storage, expected) is want, (values, by_storage, expected)
    assert native((1, 2, 1), False) == alias_pattern((1, 2, 1)) == (0, 1, 0)
    assert native((1, 2, 1), False, None) == (0, 1, 0)
    with pytest.raises(TypeError, match="expected must be a tuple"):
        native((1, 2), False, [0, 1])
    with pytest.raises(TypeError, match="item 0 is int"):
        native((1, 2), True)
    assert python_door.alias_pattern_function() is native


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (the eager frame is told once per code object)
@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_disjoint_parts_of_one_buffer_written_in_place_stay_compiled(backend):
    # Dynamo's rule too: inputs of one storage whose memory does not overlap are independent
    # inputs (two layers' KV caches cut from one allocation); parts that overlap run eagerly.
    def f(x, y):
        x.add_(1)
        y.mul_(2)
        y.add_(x.sum())
        return x + y

    compiled = kiln.compile(f, backend=backend)
    for first, second in ((0, 4), (8, 12), (12, 4)):
        buffer, reference = torch.arange(16.0), torch.arange(16.0)
        out = compiled(buffer[first:first + 4], buffer[second:second + 4])
        assert_same(out, f(reference[first:first + 4], reference[second:second + 4]))
        assert_same(buffer, reference)
    assert compiled.kiln_cache.fallback is None and len(compiled.kiln_cache.entries) == 1
    buffer, reference = torch.arange(16.0), torch.arange(16.0)
    out = compiled(buffer[0:4], buffer[2:6])  # overlapping: the aliasing guard fails, eager from then on
    assert_same(out, f(reference[0:4], reference[2:6]))
    assert_same(buffer, reference)
    assert compiled.kiln_cache.fallback.kind == "aliased_input_mutation"


def test_a_kv_cache_cut_from_one_allocation_is_written_in_place_by_a_compiled_step():
    class Layer:
        def __init__(self, keys, values):
            self.keys, self.values = keys, values

    def layers_of(store):
        return [Layer(store[i, 0], store[i, 1]) for i in range(store.shape[0])]

    def step(layers, x, position):
        out = x.new_zeros(x.shape[-1])
        for layer in layers:
            layer.keys.index_copy_(0, position, x)
            layer.values.index_copy_(0, position, x * 2)
            out = out + layer.keys.sum(0) + layer.values.sum(0)
        return out

    store, reference = torch.zeros(3, 2, 8, 4), torch.zeros(3, 2, 8, 4)
    layers, reference_layers = layers_of(store), layers_of(reference)
    compiled = kiln.compile(step)
    for t in range(4):
        x = torch.randn(1, 4)
        assert_same(compiled(layers, x, torch.tensor([t])), step(reference_layers, x, torch.tensor([t])))
        assert_same(store, reference)
    assert compiled.kiln_cache.fallback is None and len(compiled.kiln_cache.entries) == 1


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (the eager frame is told once per code object)
def test_aliasing_guard_through_the_extension_sees_one_tensor_passed_twice():
    from kiln.native import python_door

    native = python_door.module().alias_pattern  # loaded: the guards call it

    def f(x, y):
        x.add_(1)
        return x + y

    compiled = kiln.compile(f, backend="aot_eager")
    assert_same(compiled(torch.ones(3), torch.ones(3)), torch.full((3,), 3.0))
    assert_same(compiled(torch.ones(3), torch.ones(3)), torch.full((3,), 3.0))
    (entry,) = compiled.kiln_cache.entries
    assert any(value is native for value in entry.guards.check.__globals__.values())
    c = torch.ones(3)
    assert_same(compiled(c, c), torch.full((3,), 4.0))  # y is x: written before it is read
    assert_same(c, torch.full((3,), 2.0))
    assert compiled.kiln_cache.fallback.kind == "aliased_input_mutation"


def test_tensors_read_only_at_a_break_do_not_pin_aliasing():
    # torchdynamo's test_subgraphs.py test_resume_paths_join: condition tensors, one object passed
    # for several of them, are read only by the breaks; pinning which were one object made 12
    # frames where 7 do.
    def fn(x, c1, c2):
        x = x + 1
        if c1:
            x = x + 2
        if c2:
            x = x + 4
        return x + 7

    compiled = kiln.compile(fn, backend="eager")
    v, t, f = torch.randn(4), torch.tensor([True]), torch.tensor([False])
    for a in (t, f):
        for b in (t, f):
            assert_same(compiled(v, a, b), fn(v, a, b))
    assert len(compiled.kiln_cache.entries) == 1


@pytest.mark.parametrize("read, switch", [
    (torch.autograd._profiler_enabled, lambda: torch.autograd.profiler.profile()),
    (torch.is_inference_mode_enabled, lambda: torch.inference_mode()),
    (torch.are_deterministic_algorithms_enabled,
     lambda: __import__("torch.testing._internal.common_utils", fromlist=["x"]).DeterministicGuard(True)),
])
def test_process_settings_the_trace_reads_are_guarded(read, switch):
    # (before, the profiler's state was a constant of the first graph: under the profiler, the
    # function took the branch of a call without it)
    def fn(x):
        return x + 1 if read() else x - 1

    compiled = kiln.compile(fn, backend="eager")
    x = torch.zeros(2)
    torch.testing.assert_close(compiled(x), fn(x))
    with switch():
        torch.testing.assert_close(compiled(x), fn(x))
    torch.testing.assert_close(compiled(x), fn(x))
    assert len(compiled.kiln_cache.entries) == 2


def test_identity_of_tensor_inputs_no_op_reads_is_guarded():
    # `a is b` decided while capturing on two inputs the graph never reads was unguarded: a call
    # with two objects took the branch of a call with one (a wrong result).
    def f(a, b, y):
        return y * 2 if a is b else y * 3

    compiled = kiln.compile(f, backend="eager")
    t, u, y = torch.ones(1), torch.ones(1), torch.ones(2)
    for args in ((t, t, y), (t, u, y), (t, t, y)):
        torch.testing.assert_close(compiled(*args), f(*args))


# Guards that read no input (globals, classes, a config's attributes, closures) run only when what
# they read changed (kiln/capture/guards.py `stable_reads`, the extension's `Watch`).

SCALES = {"x": 2.0}


class _Settings:
    factor = 3.0


SETTINGS = _Settings()
SETTINGS.offset = 1.0


def _stable_runs(f) -> list[int]:
    """Counts, in a list, each run of the stable guards of `f`'s first entry from now on."""
    (entry, *_) = f.kiln_cache.entries
    scope = entry.guards.check.__globals__
    assert "check_stable" in scope, entry.guards.source_code
    runs, stable = [0], scope["check_stable"]

    def counted():
        runs[0] += 1
        return stable()

    scope["check_stable"] = counted
    return runs


@pytest.fixture
def watch_available():
    from kiln.native import python_door

    python_door.module()  # built if the cache lacks it
    if not python_door.module().dict_versions:
        pytest.skip("this Python does not version its dicts (3.14 and later): every guard runs on every call")


def test_guards_on_globals_a_class_and_an_instance_run_only_after_a_change(watch_available):
    def fn(x):
        return x * SCALES["x"] * _Settings.factor + SETTINGS.offset

    f = _compiled(fn)
    x = torch.ones(3)
    torch.testing.assert_close(f(x), fn(x))  # compiled: no guard ran yet
    runs = _stable_runs(f)
    for _ in range(5):
        torch.testing.assert_close(f(x), fn(x))
    assert runs[0] == 1 and _entries(f) == 1  # the first check, then none
    # Each change: the stable guards run again and fail (a new entry), or hold (the first entry).
    for change, undo in ((lambda: SCALES.update(x=5.0), lambda: SCALES.update(x=2.0)),
                         (lambda: setattr(_Settings, "factor", 4.0), lambda: setattr(_Settings, "factor", 3.0)),
                         (lambda: setattr(SETTINGS, "offset", 7.0), lambda: setattr(SETTINGS, "offset", 1.0))):
        before = _entries(f)
        change()
        try:
            torch.testing.assert_close(f(x), fn(x))
            assert _entries(f) == before + 1
        finally:
            undo()
        runs[0] = 0
        torch.testing.assert_close(f(x), fn(x))
        assert _entries(f) == before + 1 and runs[0] == 1  # the first entry's guards hold again
        torch.testing.assert_close(f(x), fn(x))
        assert runs[0] == 1


class _KernelTable(torch.nn.Module):
    """A module whose plain dict attribute names the function its forward calls (as HF's attention
    modules keep `_kernel_funcs`)."""

    def __init__(self):
        super().__init__()
        self.funcs = {"act": torch.relu}

    def forward(self, x):
        return self.funcs["act"](x) + 1


def test_a_module_dicts_items_are_stable_guards_and_their_changes_are_seen(watch_available):
    table = _KernelTable()
    f = _compiled(lambda x: table(x))
    x = torch.randn(4)
    torch.testing.assert_close(f(x), torch.relu(x) + 1)
    every_call = f.kiln_cache.entries[0].guards.source_code.split("def check_stable")[0]
    assert "'funcs'" not in every_call and ".funcs" not in every_call, every_call
    runs = _stable_runs(f)
    for _ in range(3):
        torch.testing.assert_close(f(x), torch.relu(x) + 1)
    assert runs[0] == 1 and _entries(f) == 1  # read through instance dicts: checked once, not every call
    table.funcs["act"] = torch.tanh  # the dict's item changes
    torch.testing.assert_close(f(x), torch.tanh(x) + 1)
    table.funcs = {"act": torch.sigmoid}  # the attribute itself (the module's watch)
    torch.testing.assert_close(f(x), torch.sigmoid(x) + 1)
    table.__dict__["funcs"] = {"act": torch.relu}  # past nn.Module.__setattr__: the instance dict's version
    torch.testing.assert_close(f(x), torch.relu(x) + 1)


def test_an_attribute_written_by_specialized_bytecode_or_a_replaced_dict_is_seen(watch_available):
    class Config:
        pass

    config = Config()
    config.scale = 2.0

    def fn(x):
        return x * config.scale

    f = _compiled(fn)
    x = torch.ones(2)
    torch.testing.assert_close(f(x), x * 2)
    for i in range(200):  # CPython specializes the store after a few runs (its inline values, 3.11+)
        config.scale = float(i)
    torch.testing.assert_close(f(x), x * 199)
    config.__dict__ = {"scale": 6.0}
    torch.testing.assert_close(f(x), x * 6)
    config.__dict__["scale"] = 7.0
    torch.testing.assert_close(f(x), x * 7)


def test_a_closure_cell_changed_by_nonlocal_is_seen(watch_available):
    def make():
        scale = 2.0

        def fn(x):
            return x * scale

        def set_scale(value):
            nonlocal scale
            scale = value

        return fn, set_scale

    fn, set_scale = make()
    f = _compiled(lambda x: fn(x) + 1)
    x = torch.ones(2)
    torch.testing.assert_close(f(x), x * 2 + 1)
    set_scale(3.0)
    torch.testing.assert_close(f(x), x * 3 + 1)
    set_scale(2.0)
    torch.testing.assert_close(f(x), x * 2 + 1)
    assert _entries(f) == 2


def test_a_watch_compares_dict_versions_instance_dicts_and_cells(watch_available):
    import gc
    import weakref

    from kiln.native import python_door

    class Owner:
        pass

    owner, table = Owner(), {"k": 1}
    owner.a = 1

    def cell_of(value):
        return (lambda: value).__closure__[0]

    cell = cell_of(4)
    watch = python_door.watch()

    def record():
        watch.record((table, owner.__dict__), ((owner, owner.__dict__),), (cell,))

    assert not watch()  # nothing recorded
    record()
    assert not watch()  # recorded, not armed: the guards have not held yet
    watch.arm()
    assert watch()
    for change in (lambda: table.update(k=2), lambda: table.pop("k"), lambda: setattr(owner, "a", 2),
                   lambda: setattr(owner, "__dict__", {"a": 2}), lambda: setattr(cell, "cell_contents", 5)):
        record()
        watch.arm()
        assert watch()
        change()
        assert not watch()
    for bad in (((["not a dict"],), (), ()), ((), ((owner, {}),), ()), ((), (), ("not a cell",))):
        with pytest.raises(TypeError, match="Watch.record"):
            watch.record(*bad)
        watch.arm()  # (a failed record leaves nothing to compare: never armed on it)
    # A watch is a GC container: a cycle through it is collected.
    held = Owner()
    loop = {"held": held}
    cycle = python_door.watch()
    loop["watch"] = cycle
    cycle.record((loop,), (), ())
    alive = weakref.ref(held)
    del held, loop, cycle
    gc.collect()
    assert alive() is None


def test_the_entry_that_ran_last_is_checked_first():
    f = _compiled(lambda x: x + 1)
    single, double = torch.ones(2), torch.ones(2, dtype=torch.float64)  # (two sizes: the second entry takes both)
    f(single)
    f(double)
    first, second = f.kiln_cache.entries
    checks = [0, 0]
    for index, entry in enumerate((first, second)):
        check = entry.guards.check

        def counted(L, index=index, check=check):
            checks[index] += 1
            return check(L)

        entry.guards.check = counted
    for _ in range(3):
        torch.testing.assert_close(f(single), single + 1)
    assert checks == [3, 1]  # the second entry was checked first once, then the first
    assert f.kiln_cache.entries == [first, second]  # (listed in the order compiled)


class _Layer:
    def __init__(self) -> None:
        self.keys, self.values = torch.zeros(2, 3), torch.zeros(2, 3)


class _Cache:
    def __init__(self, layers: int) -> None:
        self.layers = [_Layer() for _ in range(layers)]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (the eager frame is told once per code object)
def test_the_aliasing_guard_compares_the_inputs_the_other_guards_read_into_locals():
    # A decode step writes its KV cache, tensors behind two instance dicts each: the aliasing guard
    # compares them as read once by their tensor guards (the check's paths walked once, not twice),
    # and still sees one of them become another's object.
    def step(cache, x):
        for layer in cache.layers:
            layer.keys.add_(x)
            layer.values.mul_(2)
        return x + 1

    compiled = kiln.compile(step, backend="aot_eager")
    cache, reference = _Cache(3), _Cache(3)
    for _ in range(2):
        assert_same(compiled(cache, torch.ones(2, 3)), step(reference, torch.ones(2, 3)))
    (entry,) = compiled.kiln_cache.entries
    code = entry.guards.source_code
    check = code[code.index("def check(L):"):]
    aliasing = next(line for line in check.splitlines() if "), True, V" in line)
    assert "layers" not in aliasing and "(" not in aliasing.split("((", 1)[1].split(")", 1)[0], aliasing
    assert check.count("['keys']") == 3 and check.count("['values']") == 3, check
    for a, b in zip(cache.layers, reference.layers):
        assert_same(a.keys, b.keys)
        assert_same(a.values, b.values)
    cache.layers[1].values = cache.layers[0].values  # one tensor for two inputs: the guard fails
    reference.layers[1].values = reference.layers[0].values
    assert_same(compiled(cache, torch.ones(2, 3)), step(reference, torch.ones(2, 3)))
    assert_same(cache.layers[0].values, reference.layers[0].values)
    assert compiled.kiln_cache.fallback.kind == "aliased_input_mutation"
