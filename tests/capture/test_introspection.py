"""isinstance, issubclass, type(), getattr/hasattr, callable and class names while capturing."""

import collections
import dataclasses
import enum
import inspect
import numbers
import typing
from collections import abc

import pytest
import torch
from torch import nn

import kiln
from kiln.capture.break_records import CaptureError
from tests.capture.util import check


class Base:
    kind = "base"

    def __init__(self, value=1):
        self.value = value

    def method(self):
        return self.value

    def __eq__(self, other):  # lets `check` compare the arguments after the call
        return type(self) is type(other) and vars(self).keys() == vars(other).keys() and all(
            torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(vars(self).values(), vars(other).values()))


class Child(Base):
    kind = "child"


class Other:
    def __eq__(self, other):
        return type(self) is type(other)


class WithCall:
    def __call__(self, x):
        return x + 1

    def __eq__(self, other):
        return type(self) is type(other)


class Slots:
    __slots__ = ("a",)

    def __init__(self):
        self.a = 3

    def __eq__(self, other):
        return type(self) is type(other) and self.a == other.a


class WithGetattr:
    def __getattr__(self, name):
        if name.startswith("dyn_"):
            return len(name)
        raise AttributeError(name)

    def __eq__(self, other):
        return type(self) is type(other)


@dataclasses.dataclass
class Config:
    size: int = 4
    name: str = "cfg"


class Mode(enum.Enum):
    A = 1
    B = 2


class Pair(typing.NamedTuple):
    left: int
    right: int


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.scale = 2.0

    def forward(self, x):
        return self.linear(x) * self.scale


# --- isinstance ------------------------------------------------------------------------------------


def test_isinstance_of_constants_and_bool_int_subtleties():
    def f(x, i, b, fl, s, none):
        return (x, isinstance(i, int), isinstance(b, int), isinstance(b, bool), isinstance(i, bool), isinstance(fl, int),
                isinstance(fl, float), isinstance(i, float), isinstance(i, (float, int)), isinstance(s, str),
                isinstance(s, (int, (bytes, str))), isinstance(none, type(None)), isinstance(i, numbers.Number),
                isinstance(b, numbers.Integral), isinstance(fl, numbers.Real), isinstance(i, object), isinstance(i, ()))

    check(f, torch.randn(2), 3, True, 1.5, "s", None)


def test_isinstance_of_containers():
    def f(x, items, pair, table, named):
        return (x, isinstance(items, list), isinstance(items, tuple), isinstance(pair, tuple), isinstance(table, dict),
                isinstance(table, collections.OrderedDict), isinstance(items, (list, tuple)), isinstance(named, tuple),
                isinstance(named, Pair), isinstance(items, abc.Sequence), isinstance(table, abc.Mapping),
                isinstance(pair, abc.Iterable), isinstance({1}, set), isinstance(x.shape, tuple), isinstance(x.shape, torch.Size),
                isinstance(range(3), abc.Sequence), isinstance(items, abc.Mapping))

    check(f, torch.randn(2), [1, 2], (1, 2), {"a": 1}, Pair(1, 2))


def test_isinstance_of_tensors_and_modules():
    block = Block()

    def f(x, p):
        return (x * 2, isinstance(x, torch.Tensor), isinstance(x, nn.Parameter), isinstance(p, nn.Parameter),
                isinstance(p, torch.Tensor), isinstance(block, nn.Module), isinstance(block, Block),
                isinstance(block.linear, nn.Linear), isinstance(block.linear, (nn.Conv1d, nn.Linear)),
                isinstance(block, nn.Linear), isinstance(x, (int, float)), isinstance(x + 1, torch.Tensor),
                isinstance(block.linear.weight, nn.Parameter), isinstance(block.scale, float), isinstance(x, nn.Module))

    check(f, torch.randn(3), nn.Parameter(torch.randn(2)))


def test_isinstance_of_user_classes():
    def f(x, obj, child, other):
        made = Child(5)
        return (x, isinstance(obj, Base), isinstance(child, Base), isinstance(obj, Child), isinstance(other, Base),
                isinstance(child, (Other, Child)), isinstance(made, Base), isinstance(made, Other), isinstance(Base, type),
                isinstance(Mode.A, Mode), isinstance(Mode.A, enum.Enum), isinstance(Config(), Config), isinstance(obj, object))

    check(f, torch.randn(2), Base(), Child(), Other())


def test_isinstance_picks_branch():
    def f(x, v):
        if isinstance(v, torch.Tensor):
            return x + v
        if isinstance(v, (list, tuple)):
            return x + sum(v)
        if isinstance(v, bool):
            return x * 0 if v else x
        return x * v

    for v in (torch.ones(2), [1, 2], (3.0,), True, False, 4, 0.5):
        check(f, torch.randn(2), v)


def test_isinstance_with_bad_class_argument_raises_type_error():
    def f(x, v):
        try:
            result = isinstance(v, 3)
        except TypeError:
            result = "type error"
        return x, result

    check(f, torch.randn(2), 1)


# --- issubclass and type ------------------------------------------------------------------------


def test_issubclass():
    def f(x):
        return (x, issubclass(Child, Base), issubclass(Base, Child), issubclass(bool, int), issubclass(int, bool),
                issubclass(Child, (Other, Base)), issubclass(Block, nn.Module), issubclass(nn.Parameter, torch.Tensor),
                issubclass(Mode, enum.Enum), issubclass(list, abc.Sequence), issubclass(dict, abc.Sequence),
                issubclass(Child, object), issubclass(Pair, tuple), issubclass(type(x), torch.Tensor))

    check(f, torch.randn(2))


def test_type_comparisons():
    def f(x, i, b, s, obj, items):
        return (x, type(i) is int, type(b) is int, type(b) is bool, type(i) == int, type(s) is str, type(obj) is Base,
                type(obj) is Child, type(obj) == Child, type(items) is list, type(x) is torch.Tensor, type(i) in (int, float),
                type(None) is type(None), type(obj) is not Base, type(i) is type(b), type(Base) is type, type(x.shape))

    check(f, torch.randn(2), 3, True, "s", Child(), [1])


def test_type_names():
    block = Block()

    def f(x, obj, i):
        return (x, type(obj).__name__, type(i).__name__, type(x).__name__, type(block).__name__, type(block.linear).__name__,
                obj.__class__.__name__, Child.__name__, Child.__qualname__, type(obj).__module__ == __name__,
                x.__class__.__name__, type([]).__name__, type(Mode.A).__name__, block.__class__.__name__, len.__name__,
                Child.__mro__[1].__name__, [c.__name__ for c in Child.__mro__], Child.__mro__[1] is Base)

    check(f, torch.randn(2), Child(), 4)


def test_type_call_builds_instance():
    def f(x, obj):
        twin = type(obj)(obj.value + 1)
        return x + twin.value, type(twin).__name__, type(twin) is type(obj)

    check(f, torch.randn(2), Child(3))


# --- getattr, hasattr, callable -----------------------------------------------------------------


def test_getattr_with_and_without_default():
    block = Block()

    def f(x, obj, name):
        return (x * getattr(obj, "value"), getattr(obj, name), getattr(obj, "missing", None), getattr(obj, "missing", x).shape,
                getattr(obj, "kind"), getattr(Child, "kind"), getattr(block, "scale"), getattr(block, "nothing", 7),
                getattr(x, "shape"), getattr(x, "nope", "d"), getattr(x, "ndim"), getattr(3, "real"), getattr("s", "zz", 0),
                getattr(obj, "method")(), getattr(block.linear, "out_features"), getattr(block, "linear").in_features)

    check(f, torch.randn(3), Child(2), "kind")


def test_getattr_missing_without_default_raises_attribute_error():
    def f(x, obj):
        try:
            getattr(obj, "missing")
        except AttributeError:
            found = False
        else:
            found = True
        return x, found

    check(f, torch.randn(2), Base())


def test_getattr_through_user_getattr_hook():
    def f(x, obj):
        return x + getattr(obj, "dyn_abc"), getattr(obj, "other", -1), hasattr(obj, "dyn_z"), hasattr(obj, "zzz")

    check(f, torch.randn(2), WithGetattr())


def test_getattr_module_parameters_by_name():
    block = Block()

    def f(x):
        out = x
        for name in ("weight", "bias"):
            out = out + getattr(block.linear, name).sum()
        return out, getattr(block.linear, "bias") is block.linear.bias

    check(f, torch.randn(3))


def test_hasattr_on_user_objects_modules_and_tensors():
    block = Block()

    def f(x, obj, slots):
        return (x, hasattr(obj, "value"), hasattr(obj, "missing"), hasattr(obj, "method"), hasattr(obj, "kind"),
                hasattr(Child, "method"), hasattr(slots, "a"), hasattr(slots, "b"), hasattr(block, "linear"),
                hasattr(block, "scale"), hasattr(block, "missing"), hasattr(block, "forward"), hasattr(block.linear, "weight"),
                hasattr(x, "shape"), hasattr(x, "view"), hasattr(x, "missing"), hasattr(3, "real"), hasattr("s", "upper"),
                hasattr([], "append"), hasattr({}, "append"), hasattr(Mode.A, "name"), hasattr(Config(), "size"))

    check(f, torch.randn(2), Child(), Slots())


def test_hasattr_after_setattr_in_compiled_code():
    def f(x, obj):
        before = hasattr(obj, "extra")
        obj.extra = x * 2
        setattr(obj, "other", 3)
        return x, before, hasattr(obj, "extra"), hasattr(obj, "other"), getattr(obj, "other")

    check(f, torch.randn(2), Base())


def test_callable():
    block = Block()

    def helper():
        return 1

    def f(x, obj, fn_obj):
        return (x, callable(obj), callable(fn_obj), callable(helper), callable(len), callable(Base), callable(block),
                callable(block.forward), callable(x), callable(3), callable("s"), callable(None), callable(obj.method),
                callable(torch.relu), callable(x.view), callable(lambda: 0), callable(print), callable([]))

    check(f, torch.randn(2), Base(), WithCall())


def test_callable_object_is_called():
    def f(x, fn_obj):
        if callable(fn_obj):
            return fn_obj(x)
        return x

    check(f, torch.randn(2), WithCall())


def test_dataclass_and_enum_introspection():
    def f(x, cfg, mode):
        names = [field.name for field in dataclasses.fields(cfg)]
        return (x * cfg.size, names, dataclasses.is_dataclass(cfg), dataclasses.is_dataclass(x), mode is Mode.A,
                mode == Mode.B, mode.name, mode.value, isinstance(mode, Mode), type(mode).__name__)

    check(f, torch.randn(2), Config(), Mode.A)
    check(f, torch.randn(2), Config(size=2), Mode.B)


def test_isinstance_of_data_dependent_value_is_unsupported():
    # Branching on tensor data is a graph break (issue 7); the fallback still runs it right.
    def f(x):
        if isinstance(x, torch.Tensor) and x.sum() > 0:
            return x + 1
        return x - 1

    with pytest.raises(CaptureError):
        kiln.compile(f, backend="eager", fullgraph=True)(torch.ones(2))
    fallback = kiln.compile(f, backend="eager")
    for x in (torch.ones(2), -torch.ones(2)):
        torch.testing.assert_close(fallback(x), f(x))


def test_locals_and_vars_read_the_users_variables():
    # Dynamo's test_repros.py test_locals/vars_traced_correctly_under_compile: locals() ran for real
    # behind a break, in the resume function, whose frame holds its stack slots and not the
    # user's names (a wrong result: the view was skipped).
    def f(x):
        if x.dim() > 2:
            batch, seq, hidden = x.shape
            x = x.view(-1, hidden)
        x = x + 1
        if "batch" in locals() and "seq" in vars():
            x = x.view(batch, seq, -1)
        scale = 2

        def g():
            return scale

        return x * g(), sorted(locals())

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(2, 3, 4)
    got, want = compiled(x), f(x)
    torch.testing.assert_close(got[0], want[0])
    assert got[1] == want[1]


def test_eval_of_the_frames_own_variables_runs_the_frame_eagerly():
    # eval/exec without a namespace read the calling frame: behind a break that would be a
    # resume function's frame, so the frame is not resumed but run as the user wrote it.
    def f(x):
        y = x + 1
        print("a break")
        return eval("y * 2")

    with pytest.warns(RuntimeWarning, match="frame_dependent"):
        got = kiln.compile(f, backend="eager")(torch.ones(2))
    torch.testing.assert_close(got, torch.full((2,), 4.0))
    with pytest.raises(CaptureError, match="frame_dependent"):
        kiln.compile(lambda x: eval("x + 1"), backend="eager", fullgraph=True)(torch.ones(2))


def test_a_signatures_parameters_iterated_and_tested():
    # Dynamo's test_repros.py test_validate_model_kwargs (as HF's generate checks model kwargs).
    import inspect

    def forward(a, b):
        return torch.sin(a) + torch.cos(b)

    def f(**kwargs):
        accepted = set(inspect.signature(forward).parameters)
        unused = [k for k, v in kwargs.items() if v is not None and k not in accepted]
        return forward(**{k: v for k, v in kwargs.items() if k in accepted}), unused, len(inspect.signature(forward).parameters)

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x, y = torch.randn(3), torch.randn(3)
    got, want = compiled(a=x, b=y, c=None), f(a=x, b=y, c=None)
    torch.testing.assert_close(got[0], want[0])
    assert got[1:] == want[1:]


# --- Dynamo's tests of Python (issue 55): class subscripts, modules, C getters, builtins --------------


def test_annotations_evaluated_in_a_def_subscript_generic_classes():
    # A nested def's annotations run when the def runs (torch.utils._pytree's tree_map_only does this).
    T = typing.TypeVar("T")

    def f(x):
        def inner(fn: abc.Callable[[T], typing.Any]) -> abc.Callable[[typing.Any], typing.Any]:
            return fn

        return inner(lambda t: t + 1)(x), dict[str, int], list[int]

    check(f, torch.randn(3))


def test_tree_map_only_of_pytree_is_captured():
    def f(a, b, index):
        return torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t[index], (a, b))

    check(f, torch.randn(4, 2), torch.randn(4, 3), 2)


def test_a_module_imported_inside_is_returned_and_alive_at_a_break():
    def returns_module():
        import torch.cpu
        return torch.cpu

    assert kiln.compile(returns_module, backend="eager", fullgraph=True)() is torch.cpu

    def breaks(x):
        import torch.fx
        kiln.graph_break()
        return torch.fx is not None and x * 2

    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(breaks, backend="eager")(x), x * 2)


def test_a_property_written_in_C_is_read_for_real_and_guarded():
    from torch._C._dynamo.guards import GuardDebugInfo  # (a pybind11 class: its properties' getters are C)

    def f(x, info):
        return x.cos() if info.result else x.sin()

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x, GuardDebugInfo(True, ["a"], 0)), x.cos())
    torch.testing.assert_close(compiled(x, GuardDebugInfo(False, ["a"], 1)), x.sin())  # (the guard on .result)


def test_sys_getrecursionlimit_reads_the_users_limit_not_kilns():
    import sys

    check(lambda x: x * sys.getrecursionlimit(), torch.randn(3))


def test_id_of_a_partial_of_a_closure():
    import functools

    partial_add = functools.partial(lambda a, b: a + b, 3)

    def f(x):
        d = {id(partial_add): 5}
        return partial_add(x) * d[id(partial_add)]

    check(f, torch.randn(3))


_MEMO_KEYS = [1.0, 2.0]


def test_id_of_singletons_globals_and_input_tensors_guarded():
    def f(x, y, ref):
        memo = {id(_MEMO_KEYS): 1, id(None): 2}
        scale = memo[id(_MEMO_KEYS)] + memo[id(None)]
        return x * scale if ref == id(y) else x - scale  # (an input tensor's id: pinned to it)

    compiled = kiln.compile(f, backend="eager", fullgraph=True)
    x, y, other = torch.randn(3), torch.randn(2), torch.randn(2)
    for a, ref in ((y, id(y)), (other, id(y)), (y, id(other))):  # another tensor: guarded, compiled again
        torch.testing.assert_close(compiled(x, a, ref), f(x, a, ref))


def test_a_descriptors_get_taken_beforehand_reads_a_class_namespace():
    import inspect

    class Holder:
        a = 1
        param = inspect.Parameter("x", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=42)

    namespace_of = type.__dict__["__dict__"].__get__

    def fn(x):
        d = namespace_of(Holder)
        return x + len(d) + d["param"].default + d["a"]

    check(fn, torch.randn(3))


def test_a_property_of_the_metaclass_read_on_the_class():
    class Meta(type):
        @property
        def WORLD(cls):
            return cls._world

    class Group(metaclass=Meta):
        _world = None

    check(lambda x: x + 1 if Group.WORLD is None else x - 1, torch.randn(3))
    check(lambda x: x + 1 if torch.distributed.is_available() and torch.distributed.is_initialized() else x - 1, torch.randn(3))


def test_torch_function_overrides_are_seen_not_answered_false():
    class Overriding:
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            return torch.tensor(123) if func is torch.max else func(*args, **(kwargs or {}))

    def fn(x):
        if torch.overrides.is_tensor_like(x):
            return torch.max(x)  # (the object's __torch_function__ answers: run eagerly after a break)
        return torch.zeros(1)

    compiled = kiln.compile(fn, backend="eager")
    assert torch.equal(compiled(Overriding()), torch.tensor(123)) and torch.equal(compiled(4), torch.zeros(1))
    with pytest.raises(kiln.CaptureError):
        kiln.compile(lambda x, o: (x + 1, torch.overrides.has_torch_function((x, o))), backend="eager",
                     fullgraph=True)(torch.ones(1), Overriding())
    check(lambda x, w: (torch.overrides.has_torch_function_unary(w), x @ w), torch.randn(2, 3), nn.Parameter(torch.randn(3, 4)))


def test_changing_a_container_of_an_object_computed_while_capturing_breaks_rather_than_being_lost():
    # (kiln changed only its copy of `bound.arguments`: the frame returned the BoundArguments unchanged)
    def inner(a, b, *ar, c=10, d=11, **kw):
        pass

    def fn(x):
        bound = inspect.signature(inner).bind(1, 2, 3, d=12, e=15)
        bound.arguments["d"] = 13
        return bound, x + 1

    got, want = kiln.compile(fn, backend="eager")(torch.ones(1)), fn(torch.ones(1))
    assert got[0] == want[0] and got[0].arguments["d"] == 13
    with pytest.raises(kiln.CaptureError, match="could not be replayed"):
        kiln.compile(fn, backend="eager", fullgraph=True)(torch.ones(1))
