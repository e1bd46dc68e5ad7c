"""nn.Modules: submodules, parameters and buffers read by identity, `forward` inlined with hooks.

A module reached from the frame is pinned once (ID_MATCH for the root), then its children are
read through `_modules`/`_parameters`/`_buffers` without a guard each: the MODULE_STRUCTURE guard
(kiln/capture/module_watch.py) notices any later registration on a module the capture read.
Parameters and buffers become `get_attr` nodes holding the real tensors.
"""

from __future__ import annotations

import collections
import functools
import inspect
import types
from typing import Any, Sequence


import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.modules import module as module_file
from torch.utils.hooks import RemovableHandle

from kiln.capture import module_watch
from kiln.capture.break_records import Unsupported, unsupported
from kiln.capture.guards import Guard
from kiln.capture.sources import AttrSource, ConstSource, InstanceDictSource, ItemSource, KeysSource, Source
from kiln.capture.user_exceptions import raise_real
from kiln.capture.variables.base import Variable
from kiln.capture.variables.constant import ConstantVariable, is_literal, is_plain_data, plain_data
from kiln.capture.variables.containers import DictVariable, IteratorVariable, ListViewVariable, TupleVariable
from kiln.capture.variables.functions import BoundMethodVariable
from kiln.capture.variables.objects import UserObjectVariable, class_lookup, wrap_class_attr, _MISSING
from kiln.capture.variables.tensor import TensorVariable
from kiln.capture.variables.wrapping import wrap, wrap_constant_result

_GLOBAL_HOOKS = ("_global_backward_pre_hooks", "_global_backward_hooks", "_global_forward_hooks",
                 "_global_forward_pre_hooks", "_global_forward_hooks_always_called", "_global_forward_hooks_with_kwargs")
_CONTAINER_TYPES = (nn.ModuleList, nn.Sequential, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)


class ModuleVariable(UserObjectVariable):
    def __init__(self, value: nn.Module, source: Source | None, path: str = "") -> None:
        super().__init__(value, source)
        self.path = path or (str(source.label) if isinstance(source, ConstSource) and source.label else "self")
        module_watch.watch(value)
        _watch_hook_changes()

    def describe(self) -> str:
        return f"module {self.path} ({type(self.value).__name__})"

    def _child(self, tx: Any, name: str, child: nn.Module) -> "ModuleVariable":
        key = ConstSource(child, f"{self.path}.{name}")
        cached = tx.output.wrapped.get(key)
        if cached is None:
            cached = ModuleVariable(child, key, f"{self.path}.{name}")
            tx.output.wrapped[key] = cached
        return cached

    def _instance_attr(self, tx: Any, name: str) -> Variable | None:
        # Plain attributes of a watched module need no guard of their own (module_watch.py);
        # only what is reached through a mutable one (a list's items, an object's fields) does.
        written, value = tx.output.side_effects.pending_attr(self, name)
        if written:
            return value
        tx.output.side_effects.record_module_read(self.value, name)
        module_watch.note_read(self.value, name)
        if name not in self.value.__dict__:
            return None
        value = self.value.__dict__[name]
        if is_immutable(value):
            return wrap_constant_result(value)
        if isinstance(value, torch.Tensor):
            return wrap(tx, value, AttrSource(self.source, name))
        if isinstance(value, (list, dict, set)):
            # Read where it was found, the instance dict: the watch stands for the attribute, and a
            # guard on a dict's item reached from a constant through instance dicts alone is a stable
            # read (guards.stable_reads), checked only when a watched dict changed, where through the
            # attribute it was checked on every call (HF's attention modules' `_kernel_funcs`: 60
            # of the 329 lines a llama-160m decode step's guards ran on every call).
            return wrap(tx, value, ItemSource(InstanceDictSource(self.source), name))
        return wrap(tx, value, ConstSource(value, f"{self.path}.{name}"))

    def _registered(self, tx: Any, name: str) -> Variable | None:
        m = self.value
        d = m.__dict__
        if name in d.get("_parameters", {}) or name in d.get("_buffers", {}):
            tensor = d["_parameters"].get(name) if name in d["_parameters"] else d["_buffers"].get(name)
            if tensor is None:
                return ConstantVariable(None)
            return tx.output.add_attr(tensor, AttrSource(self.source, name), f"{self.path}.{name}")
        if name in d.get("_modules", {}):
            child = d["_modules"][name]
            return ConstantVariable(None) if child is None else self._child(tx, name, child)
        return None

    def getattr(self, tx: Any, name: str) -> Variable:
        if name == "__class__":
            return super().getattr(tx, name)
        if name == "__dict__":  # every attribute read at once, as it was on entry
            tx.output.side_effects.record_module_read(self.value, name)
            module_watch.note_read(self.value, name)
        if name in ("_modules", "_parameters", "_buffers"):
            table = getattr(self.value, name)
            entries = DictVariable.from_pairs([(ConstantVariable(k), self._registered(tx, k)) for k in table]).entries
            return RegistryVariable(entries, AttrSource(self.source, name), f"{name} of {self.describe()}")
        raw, owner = class_lookup(type(self.value), name)
        if raw is not _MISSING and (isinstance(raw, property) or hasattr(type(raw), "__set__")):
            return wrap_class_attr(tx, raw, owner, name, self)
        if name in _ENUMERATIONS and raw is getattr(nn.Module, name, None):
            return EnumerationVariable(self, name)
        found = self._instance_attr(tx, name)
        if found is not None:
            return found
        if raw is not _MISSING:
            if raw is nn.Module.__call__ or raw is nn.Module._call_impl:
                return BoundMethodVariable(ModuleCallVariable(raw), self)
            return wrap_class_attr(tx, raw, owner, name, self)
        registered = self._registered(tx, name)
        if registered is not None:
            return registered
        hook, _ = class_lookup(type(self.value), "__getattr__")
        if isinstance(hook, types.FunctionType) and hook is not nn.Module.__getattr__:
            return wrap_constant_result(hook).call(tx, [self, ConstantVariable(name)], {})
        raise raise_real(AttributeError(f"'{type(self.value).__name__}' object has no attribute '{name}'"))

    def setattr(self, tx: Any, name: str, value: Variable) -> None:
        if isinstance(value, ModuleVariable) or name in self.value._parameters or name in self.value._buffers or name in self.value._modules:
            raise unsupported("unsupported_setattr", f"assigning module/parameter/buffer {name!r} of {self.describe()} inside a compiled function")
        # (A plain tensor attribute, `self.cache = x + 1`, is set for real after the graph runs, as
        # any object's attribute; read on a later call it is an input, not a frozen constant.)
        tx.output.side_effects.record_setattr(self, name, value)

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        raw, owner = class_lookup(type(self.value), "__call__")
        if raw is nn.Module.__call__ or raw is nn.Module._call_impl:
            return call_module(tx, self, args, kwargs)
        return wrap_class_attr(tx, raw, owner, "__call__", self).call(tx, args, kwargs)

    # --- containers: ModuleList, Sequential, ModuleDict ---------------------------------------

    def _children(self, tx: Any) -> list[tuple[str, Variable]]:
        return [(k, self._registered(tx, k)) for k in (*self.value._modules, *self.value._parameters)]

    def iterate(self, tx: Any) -> list[Variable]:
        if isinstance(self.value, (nn.ModuleDict, nn.ParameterDict)):
            return [ConstantVariable(k) for k, _ in self._children(tx)]
        if isinstance(self.value, _CONTAINER_TYPES):
            return [v for _, v in self._children(tx)]
        return super().iterate(tx)

    def length(self, tx: Any) -> int:
        if isinstance(self.value, _CONTAINER_TYPES):
            return len(self._children(tx))
        return super().length(tx)

    def truth(self, tx: Any) -> bool:
        if isinstance(self.value, _CONTAINER_TYPES):
            return bool(self._children(tx))
        return super().truth(tx)

    def call_method(self, tx: Any, name: str, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if isinstance(self.value, _CONTAINER_TYPES):
            children = self._children(tx)
            if name == "__getitem__":
                key = args[0].as_constant()
                if isinstance(key, str):
                    return self._registered(tx, key) or _key_error(key)
                if isinstance(key, slice):  # (a container of the same class, as nn's own __getitem__ gives)
                    return SlicedModulesVariable([v for _, v in children][key], type(self.value), [k for k, _ in children][key])
                try:
                    return children[key][1]
                except IndexError:
                    raise raise_real(IndexError(f"index {key} is out of range")) from None
            if name == "__len__":
                return ConstantVariable(len(children))
            if name == "__iter__":
                return IteratorVariable(self.iterate(tx))
            if name == "__contains__":
                return ConstantVariable(args[0].as_constant() in dict(children))
            if name in ("keys", "values", "items") and isinstance(self.value, (nn.ModuleDict, nn.ParameterDict)):
                pick = {"keys": lambda k, v: ConstantVariable(k), "values": lambda k, v: v, "items": lambda k, v: TupleVariable([ConstantVariable(k), v])}[name]
                return ListViewVariable([pick(k, v) for k, v in children], f"dict_{name}")
        if name == "__call__":
            return self.call(tx, args, kwargs)
        return super().call_method(tx, name, args, kwargs)


class SlicedModulesVariable(TupleVariable):
    """`seq[1:]` of an nn.Sequential / ModuleList / ParameterList: the same children in a new
    container of its class — iterated, indexed and measured as the children, and a Sequential's
    called as its forward runs them; rebuilt as a container of that class where it outlives the
    graph (`sliced_container`)."""

    def __init__(self, items: list[Variable], cls: type, keys: list[str]) -> None:
        super().__init__(items)
        self.module_cls, self.keys = cls, keys

    def python_type(self) -> type:
        return self.module_cls

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if not issubclass(self.module_cls, nn.Sequential) or len(args) != 1 or kwargs:
            raise unsupported("unsupported_call", f"calling a slice of a {self.module_cls.__name__} with these arguments")
        value = args[0]
        for module in self.items:
            value = module.call(tx, [value], {})
        return value


def sliced_container(cls: type, keys: list[str], items: list[Any]) -> Any:
    """The container `cls` holding `items`, as nn's `__getitem__` of a slice builds it."""
    if issubclass(cls, nn.Sequential):
        return cls(collections.OrderedDict(zip(keys, items)))
    return cls(items)


# --- hooks added or removed after capture ---------------------------------------------------------

_HOOK_TABLES = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
_HOOK_REGISTRATIONS = ("register_forward_pre_hook", "register_forward_hook", "register_full_backward_pre_hook",
                       "register_full_backward_hook", "register_backward_hook")
_hooks_watched = False


def _bump_version_after(method: Any) -> Any:
    @functools.wraps(method)
    def registering(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        handle = method(self, *args, **kwargs)
        if self in module_watch.STATE.watched:
            module_watch.STATE.version += 1
        return handle

    return registering


def _removing(remove: Any) -> Any:
    @functools.wraps(remove)
    def remove_hook(handle: RemovableHandle) -> None:
        table = handle.hooks_dict_ref()
        remove(handle)
        if table is not None and any(getattr(m, name, None) is table for m in list(module_watch.STATE.watched) for name in _HOOK_TABLES):
            module_watch.STATE.version += 1

    return remove_hook


def _watch_hook_changes() -> None:
    """Hooks are added by `register_*_hook` and removed through their handle, neither of which
    goes through `__setattr__`: count both as structure changes of a watched module, so a
    captured frame that inlined (or skipped) a module's hooks is captured again."""
    global _hooks_watched
    if _hooks_watched:
        return
    for name in _HOOK_REGISTRATIONS:
        setattr(nn.Module, name, _bump_version_after(getattr(nn.Module, name)))
    RemovableHandle.remove = _removing(RemovableHandle.remove)  # type: ignore[method-assign]
    _hooks_watched = True


def is_immutable(value: Any) -> bool:
    if is_literal(value):
        return True
    return type(value) in (tuple, frozenset) and all(is_immutable(v) for v in value)


def _key_error(key: Any) -> Variable:
    raise raise_real(KeyError(key))


_ENUMERATIONS = ("parameters", "named_parameters", "buffers", "named_buffers", "children", "named_children",
                 "modules", "named_modules")


class EnumerationVariable(Variable):
    """`module.named_parameters()` and its kind (nn.Module's own methods, not a subclass's): the
    module's structure is known while capturing (the MODULE_STRUCTURE guard watches it), so the
    items are listed by the method itself, on the real module, and each becomes what reading it
    by name would (a parameter a get_attr, a submodule a module variable). The methods are
    generators over `yield from`, which kiln's capture does not interpret."""

    def __init__(self, module: ModuleVariable, name: str) -> None:
        super().__init__(None)
        self.module, self.name = module, name

    def python_type(self) -> type:
        return types.MethodType

    def _by_path(self, tx: Any, path: str) -> Variable:
        var: Variable = self.module
        for part in path.split(".") if path else ():
            found = var._registered(tx, part) if isinstance(var, ModuleVariable) else None
            if found is None:
                raise unsupported("unsupported_call", f"{self.name}() of {self.module.describe()}: {path!r} is not a registered name")
            var = found
        return var

    _TABLES = {"parameters": ("_parameters",), "buffers": ("_buffers",), "children": ("_modules",), "modules": ()}

    def _guard_order(self, tx: Any, module: nn.Module) -> None:
        """The enumeration's order is its tables' key order, which a write into a table itself
        (`module._buffers[k] = module._buffers.pop(k)`) changes unseen by the MODULE_STRUCTURE
        guard: each table it may read has its keys guarded, in order (every submodule's, with or
        without `recurse`: a guard too many costs a comparison, never a wrong order)."""
        kind = self.name.removeprefix("named_")
        walks = kind != "children"
        tables = self._TABLES[kind] + (("_modules",) if walks else ())
        modules = module.named_modules() if walks else [("", module)]
        for path, sub in modules:
            source = self._by_path(tx, path).source
            if source is None:
                raise unsupported("unsupported_call", f"{self.name}() of {self.module.describe()}: a module kiln cannot read again")
            for table in tables:
                tx.output.guards.add(Guard("EQUALS", KeysSource(AttrSource(source, table)), list(getattr(sub, table).keys())))

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        try:
            consts = [a.as_constant() for a in args]
            kw = {k: v.as_constant() for k, v in kwargs.items()}
        except Exception:  # noqa: BLE001 - an argument that is not a constant
            raise unsupported("unsupported_call", f"{self.name}() of {self.module.describe()} with arguments that are not constants") from None
        module = self.module.value
        tx.output.side_effects.record_module_read(module, "__dict__")
        named = self.name.startswith("named_")
        method = getattr(nn.Module, self.name if named else f"named_{self.name}")
        if not named:  # parameters(recurse) is named_parameters(recurse=recurse), names dropped
            consts, kw = [], {**({"recurse": consts[0]} if consts else {}), **kw}
        try:
            pairs = list(method(module, *consts, **kw))
        except Exception as e:  # noqa: BLE001 - the user's own error (a bad argument), raised as eager raises it
            raise raise_real(e) from None
        self._guard_order(tx, module)
        # Names are the caller's `prefix` and a path from the module.
        prefix = inspect.signature(method).bind(module, *consts, **kw).arguments.get("prefix", "")
        items = []
        for path, _ in pairs:
            relative = path[len(prefix) + 1:] if prefix and path.startswith(prefix + ".") else ("" if path == prefix else path)
            var = self._by_path(tx, relative)
            items.append(TupleVariable([ConstantVariable(path), var]) if named else var)
        return IteratorVariable(items)


class RegistryVariable(DictVariable):
    """A module's `_modules`, `_parameters` or `_buffers` as read: a copy of the table, so a
    change made through it (`add_module`, `register_buffer`, `ModuleDict.update`, ...) would be
    lost; it breaks the graph instead, and the change runs in Python (as assigning a module,
    parameter or buffer does: ModuleVariable.setattr)."""

    def __init__(self, entries: dict, source: Source, owner: str) -> None:
        super().__init__(entries, source)  # (rebuilt at a break as the module's own table, not a copy)
        self.owner = owner

    def _changed(self, tx: Any) -> None:
        raise unsupported("unsupported_setattr", f"changing {self.owner} (registering a module, parameter or "
                                                 f"buffer) inside a compiled function")


class ModuleCallVariable(Variable):
    """`nn.Module.__call__` itself (reached through super() or the class): call_module on args[0].
    `value`: the function it stands for (`Module.__call__ is f` compares it)."""

    def __init__(self, value: Any) -> None:
        super().__init__(None)
        self.value = value

    def is_constant(self) -> bool:
        return True

    def as_constant(self) -> Any:
        return self.value

    def python_type(self) -> type:
        return types.FunctionType

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        if not args or not isinstance(args[0], ModuleVariable):
            raise unsupported("unsupported_call", "nn.Module.__call__ on something kiln does not see as a module")
        return call_module(tx, args[0], args[1:], kwargs)


def _guard_no_global_hooks(tx: Any) -> None:
    for name in _GLOBAL_HOOKS:
        table = getattr(module_file, name, None)
        if table is None:
            continue
        if table:
            raise unsupported("unsupported_hook", f"global nn.Module hooks ({name}) are not supported while capturing")
        tx.output.guards.add(Guard("LENGTH_MATCH", ConstSource(table, f"torch.nn.modules.module.{name}"), 0))


class EphemeralModuleVariable(ModuleVariable):
    """A module without parameters or buffers built inside the compiled function from constants
    (`nn.GELU()`, HF's `ACT2CLS["relu"]`): built for real while capturing, its forward traced;
    where it outlives the call it is built again by the runner, a new object each call as in eager."""

    def __init__(self, value: nn.Module, args: tuple, kwargs: dict) -> None:
        super().__init__(value, ConstSource(value, f"{type(value).__qualname__}()"), f"{type(value).__qualname__}()")
        self.rebuilt_by = (type(value), args, kwargs)

    def setattr(self, tx: Any, name: str, value: Variable) -> None:
        raise unsupported("unsupported_setattr", f"setting attribute {name!r} of {self.describe()}, built inside the "
                          "compiled function", "build the module outside the compiled code")


def ephemeral_module(tx: Any, cls: type, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
    """`cls(*args, **kwargs)` for an nn.Module class inside the trace (EphemeralModuleVariable), or
    a break where the module holds state a new call would make anew (parameters drawn at random)."""
    why = None
    if not all(is_plain_data(a) and _literal(plain_data(a)) for a in (*args, *kwargs.values())):
        why = "from values that are not constants (numbers, strings, None and containers of them)"
    else:
        real_args, real_kwargs = tuple(plain_data(a) for a in args), {k: plain_data(v) for k, v in kwargs.items()}
        rng = torch.random.get_rng_state()
        try:
            module = cls(*real_args, **real_kwargs)
        except Exception as error:  # noqa: BLE001 - the user's constructor raised: in their code
            raise raise_real(error) from None
        if next(module.parameters(), None) is not None or next(module.buffers(), None) is not None:
            why = "with parameters or buffers, made anew on every call"
        elif not torch.equal(torch.random.get_rng_state(), rng):
            why = "drawing random numbers"
        if why is not None:
            torch.random.set_rng_state(rng)
    if why is not None:
        raise unsupported("unsupported_call", f"building the module {cls.__qualname__} inside a compiled function {why}",
                          "build modules outside the compiled code")
    return EphemeralModuleVariable(module, real_args, real_kwargs)


def _literal(value: Any) -> bool:
    """A constant the runner can spell again as a new equal value (not an object whose identity
    the module would keep: a module given to `nn.ModuleDict` is the caller's own)."""
    if isinstance(value, (tuple, list)):
        return all(_literal(v) for v in value)
    if isinstance(value, dict):
        return all(_literal(k) and _literal(v) for k, v in value.items())
    return is_literal(value)


def call_module(tx: Any, module: ModuleVariable, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
    """What `nn.Module._call_impl` does: forward pre-hooks, forward, forward hooks, all inlined."""
    m = module.value
    _guard_no_global_hooks(tx)
    if isinstance(m, LazyModuleMixin) and hasattr(m, "_initialize_hook"):  # (removed by its first call)
        _initialize_lazy(module, args, kwargs)
    if m._backward_hooks or m._backward_pre_hooks:
        raise unsupported("unsupported_hook", f"backward hooks on {module.describe()} are not supported while capturing")
    args = list(args)
    for hook_id, hook in list(m._forward_pre_hooks.items()):
        hook_var = _hook(tx, module, hook, "forward pre-hook")
        if hook_id in m._forward_pre_hooks_with_kwargs:
            result = _call_hook(tx, hook_var, [module, TupleVariable(args), _kwargs_dict(kwargs)])
            if not (result.is_constant() and result.as_constant() is None):
                new_args, new_kwargs = result.iterate(tx)
                args, kwargs = new_args.iterate(tx), {k.as_constant(): new_kwargs.getitem(tx, k) for k in new_kwargs.iterate(tx)}
        else:
            result = _call_hook(tx, hook_var, [module, TupleVariable(args)])
            if not (result.is_constant() and result.as_constant() is None):
                args = result.iterate(tx) if isinstance(result, TupleVariable) else [result]
    output = module.getattr(tx, "forward").call(tx, args, kwargs)
    for hook_id, hook in list(m._forward_hooks.items()):
        hook_var = _hook(tx, module, hook, "forward hook")
        if hook_id in m._forward_hooks_with_kwargs:
            result = _call_hook(tx, hook_var, [module, TupleVariable(args), _kwargs_dict(kwargs), output])
        else:
            result = _call_hook(tx, hook_var, [module, TupleVariable(args), output])
        if not (result.is_constant() and result.as_constant() is None):
            output = result
    return output


def _call_hook(tx: Any, hook: Variable, args: list[Variable]) -> Variable:
    try:
        return hook.call(tx, args, {})
    except Unsupported as error:
        # A break in a hook is a break inside the module's call: the frame resumes after the call,
        # made with the hooks run by nn.Module as always and the forward compiled as a frame of
        # its own (resume_at_break.compiled_callee).
        error.inlined = True
        raise


def _initialize_lazy(module: ModuleVariable, args: Sequence[Variable], kwargs: dict[str, Variable]) -> None:
    """A lazy module's first call (`nn.LazyLinear`, a `LazyModuleMixin` of the user's): its
    parameters made from the shapes of the arguments, now, as eager's first call makes them (its
    forward pre-hook `_infer_parameters`, run for real on zero tensors of the arguments' shapes),
    so the trace reads the module it becomes. Initializing has no effect a later call repeats."""
    try:
        real_args = [_stand_in(a) for a in args]
        real_kwargs = {k: _stand_in(v) for k, v in kwargs.items()}
    except TypeError as error:
        raise unsupported("unsupported_call", f"the first call of lazy {module.describe()} with {error}",
                          "call it once before compiling") from None
    m = module.value
    with torch.no_grad():
        m._infer_parameters(m, tuple(real_args), real_kwargs)


def _stand_in(var: Variable) -> Any:
    """A real value like `var` for a lazy module's initialization: zeros of a tensor's shape and
    dtype, containers of stand-ins, constants as they are."""
    from kiln.capture.variables.containers import BaseSequenceVariable, NamedTupleVariable

    if isinstance(var, TensorVariable):
        shape = [s if isinstance(s, int) else int(s.node.hint) for s in var.example.shape]
        return torch.zeros(shape, dtype=var.example.dtype, device=var.example.device)
    if isinstance(var, NamedTupleVariable):
        return var.python_type()(*[_stand_in(item) for item in var.items])
    if isinstance(var, BaseSequenceVariable) and var.python_type() in (list, tuple):
        return var.python_type()(_stand_in(item) for item in var.items)
    if isinstance(var, DictVariable) and var.python_type() is dict:
        return {_stand_in(k): _stand_in(v) for k, v in var.entries.values()}
    if var.is_constant():
        return var.as_constant()
    raise TypeError(f"an argument kiln has no value for ({var.describe()})")


def _hook(tx: Any, module: ModuleVariable, hook: Any, what: str) -> Variable:
    # With a source, what the hook changes in its closure (a list it appends to) is replayed.
    # The hook itself is pinned: adding or removing one moves the module_watch version.
    return wrap(tx, hook, ConstSource(hook, f"{module.path} {what}"))


def _kwargs_dict(kwargs: dict[str, Variable]) -> Variable:
    return DictVariable.from_pairs([(ConstantVariable(k), v) for k, v in kwargs.items()])


