"""Turning real Python values into variables, with the guards that keep them valid.

`wrap(tx, value, source)` is how every value read from the frame (arguments, globals, attributes,
closure cells) enters the trace. `_build` here picks the variable kind and adds the guard that
pins what the trace will assume: TENSOR_MATCH for tensors, EQUALS for constants, ID_MATCH for functions,
classes, modules and objects reached through them, TYPE_MATCH + LENGTH_MATCH for containers.
An object pinned by identity is afterwards reached as a constant of the guard (`ConstSource`), so
deeper guards stay short.

`wrap_constant_result(value)` wraps a value computed while capturing (no source, no guard).

Both live in wrapping.py, which imports no variable kind, so that every kind can wrap the values
it reads; this module imports every kind and installs `_build` there when it is imported.
"""

from __future__ import annotations

import collections
import functools
import itertools
import types
import weakref
from collections import OrderedDict, defaultdict
from typing import Any

import torch
from torch import nn

from kiln import config
from kiln.capture.break_records import unsupported
from kiln.capture.guards import Guard
from kiln.capture.reentry import ReenteredAutocast
from kiln.capture.sources import (SEQUENCE_ITERATORS, AttrSource, ConstSource, ConvertedSource, ItemSource, KeysSource, RemainingItemsSource,
                                  Source, remaining_items)
from kiln.capture.user_exceptions import ExceptionVariable
from kiln.capture.variables import containers as c
from kiln.capture.variables import functions as f
from kiln.capture.variables import objects as o
from kiln.capture.variables import wrapping
from kiln.capture.variables.base import BoundBuiltinMethod, Variable
from kiln.capture.variables.builtins import (BuiltinVariable, EndlessIteratorVariable, count_next, count_state, count_step, has_handler,
                                            is_builtin_callable)
from kiln.capture.variables.constant import ConstantVariable, is_literal
from kiln.capture.variables.containers import wrap_dict_contents
from kiln.capture.variables.environ import EnvironVariable, is_environ
from kiln.capture.variables.modules import ModuleVariable
from kiln.capture.variables.numpy_arrays import NumpyArrayVariable, NumpyFunctionVariable, is_ndarray, numpy_counterpart, tensor_of
from kiln.capture.variables.torch_fns import (GradModeVariable, ReenteredAutocastVariable, TorchFunctionVariable, is_torch_callable,
                                              special_callable)
from kiln.capture.variables.weakrefs import WeakRefVariable
from kiln.capture.variables.wrapping import wrap, wrap_constant_result


# Standard-library Python functions computed for real on constant arguments rather than inlined
# (introspection and typing helpers: pure, and their code is not worth interpreting).
FOLDED_MODULES = {"inspect", "typing", "re", "posixpath", "genericpath", "textwrap", "string", "copy", "warnings"}


def _pin(tx: Any, value: Any, source: Source | None) -> Source | None:
    """ID_MATCH `value` at `source`; return the source to use for reads below it."""
    if source is None:
        return None
    if isinstance(source, ConstSource):
        return source
    tx.output.guards.add(Guard("ID_MATCH", source, value))
    return ConstSource(value, str(source))


def _guard(tx: Any, kind: str, source: Source | None, expected: Any) -> None:
    if tx is not None and source is not None:
        tx.output.guards.add(Guard(kind, source, expected))


def _guardable_item(value: Any) -> bool:
    """A set item one equality guard pins: a literal, an object equal only to itself, or a tuple
    or frozenset of those."""
    if type(value) in (tuple, frozenset):
        return all(_guardable_item(v) for v in value)
    return is_literal(value) or _equal_by_identity(value)


def _equal_by_identity(value: Any) -> bool:
    cls = type(value)
    return cls.__eq__ is object.__eq__ and cls.__hash__ is object.__hash__ or isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type))


def _is_plain_dict(value: Any) -> bool:
    # A subclass may override any method (a registry's `get`): it is a user object whose dict
    # methods read a guarded view of its contents (UserObjectVariable.container_view).
    return type(value) in (dict, OrderedDict, defaultdict)


GRAD_MODE_MANAGERS = (torch.no_grad, torch.enable_grad, torch.set_grad_enabled)


def _build(tx: Any, value: Any, source: Source | None) -> Variable:
    if type(value) is int and tx is not None and source is not None and tx.output.dynamic_int(source):
        return tx.output.add_int_input(value, source)
    if is_literal(value):
        _guard(tx, "EQUALS", source, value)
        return ConstantVariable(value, source)
    if isinstance(value, torch.Tensor):
        if tx is None:
            raise unsupported("unsupported_constant", "a tensor computed outside the graph while capturing")
        if source is None:  # (an input the next call could not read, nor a guard check)
            raise unsupported("unsupported_attribute", "a tensor held by an object kiln reached without a way to read it "
                              "again on the next call", "pass the tensor (or its holder) as an argument")
        return tx.output.add_input(value, source)
    if is_ndarray(value):
        return _ndarray_input(tx, value, source)
    if isinstance(value, torch.Size):
        _guard(tx, "EQUALS", source, value)  # (its type too: a plain tuple of the same sizes is another input)
        return c.SizeVariable([ConstantVariable(int(s)) for s in value], source)
    if isinstance(value, tuple) or type(value) is list:  # (a list subclass is an object: its class's methods)
        _guard(tx, "TYPE_MATCH", source, type(value))
        _guard(tx, "LENGTH_MATCH", source, len(value))
        # (a subclass's own __getitem__ is not how its items are read back: tuple's is)
        read_with = None if type(value).__getitem__ in (tuple.__getitem__, list.__getitem__) else type(value).__mro__[-2].__getitem__
        items = [wrap(tx, item, ItemSource(source, i, read_with)) if source is not None else _build(tx, item, None)
                 for i, item in enumerate(value)]
        if isinstance(value, list):
            return c.ListVariable(items, source)
        if hasattr(type(value), "_fields"):
            return c.NamedTupleVariable(items, type(value), source)
        return c.TupleVariable(items, source)
    if type(value) is collections.deque:
        _guard(tx, "TYPE_MATCH", source, collections.deque)
        _guard(tx, "LENGTH_MATCH", source, len(value))
        if source is not None:
            _guard(tx, "EQUALS", AttrSource(source, "maxlen"), value.maxlen)
        items = [wrap(tx, item, ItemSource(source, i)) if source is not None else _build(tx, item, None) for i, item in enumerate(value)]
        return c.DequeVariable(items, source, value.maxlen)
    if isinstance(value, dict) and _is_plain_dict(value):
        _guard(tx, "TYPE_MATCH", source, type(value))
        return wrap_dict_contents(tx, value, source)
    if type(value) is types.MappingProxyType:
        # Read through its keys and items (guarded as a dict's are, where it has a source: a
        # computed one, `inspect.signature(f).parameters`, is a constant); its dict cannot change
        # through it, and kiln never writes it.
        _guard(tx, "TYPE_MATCH", source, types.MappingProxyType)
        return c.MappingProxyVariable(wrap_dict_contents(tx, value, source), source, value)
    if type(value) in (set, frozenset) and all(_guardable_item(v) for v in value):
        # Its items fixed by one equality guard: literals by value, functions and other objects
        # whose class keeps object's equality by identity ({"PyTorch", torch.sin}).
        if isinstance(value, frozenset):
            _guard(tx, "EQUALS", source, value)
        else:
            _guard(tx, "TYPE_MATCH", source, type(value))
            _guard(tx, "EQUALS", source, set(value))
        # (an object among them is one variable with the same object reached elsewhere: pinned here by the guard)
        items = [ConstantVariable(v) if is_literal(v) else wrap(tx, v, ConstSource(v, f"an item of {source}"))
                 if tx is not None and source is not None else wrap_constant_result(v) for v in value]
        return c.SetVariable(items, source, frozen=isinstance(value, frozenset))
    if type(value) is weakref.ref and source is not None:
        _guard(tx, "TYPE_MATCH", source, weakref.ref)
        return WeakRefVariable(source=source, real=value)
    if isinstance(value, nn.Module):
        return ModuleVariable(value, _pin(tx, value, source))
    special = special_callable(value)
    if special is not None:
        _pin(tx, value, source)
        return special
    if is_torch_callable(value) and not has_handler(value):  # (torch's C helpers kiln runs as Python: fx's map_aggregate)
        _pin(tx, value, source)
        return TorchFunctionVariable(value)
    if numpy_counterpart(value) is not None:
        return NumpyFunctionVariable(value, _pin(tx, value, source))
    if is_builtin_callable(value):
        _pin(tx, value, source)
        return BuiltinVariable(value)
    if isinstance(value, types.FunctionType) and "kiln_cache" in value.__dict__ and isinstance(value.__dict__.get("__wrapped__"), types.FunctionType):
        # A function kiln.compile made, called inside another capture: its original, inlined
        # into the graph being captured (as Dynamo inlines a nested torch.compile'd function).
        _pin(tx, value, source)
        return wrap(tx, value.__wrapped__, ConstSource(value.__wrapped__, f"{source}.__wrapped__") if source is not None else None)
    if isinstance(value, types.FunctionType):
        if getattr(value, "__module__", None) in FOLDED_MODULES:
            _pin(tx, value, source)
            return BuiltinVariable(value)
        if (source is not None and source.is_local() and value.__closure__ is not None and not value.__defaults__
                and not value.__kwdefaults__):
            # A closure handed in as an argument (to a resume function, after a break in the frame
            # that made it) is a new object each call: pinned by its code and globals, its
            # cells' contents guarded as they are read, not by its identity.
            _guard(tx, "ID_MATCH", AttrSource(source, "__code__"), value.__code__)
            _guard(tx, "ID_MATCH", AttrSource(source, "__globals__"), value.__globals__)
            return f.UserFunctionVariable(value, source)
        return f.UserFunctionVariable(value, _pin(tx, value, source))
    if (isinstance(value, types.MethodType) and isinstance(value.__self__, GRAD_MODE_MANAGERS) and source is not None
            and value.__func__.__name__ == "__exit__" and hasattr(value.__self__, "prev")):
        # The `__exit__` of a grad-mode block that a graph break re-entered (resume_at_break.py).
        prior = value.__self__.prev
        _guard(tx, "EQUALS", AttrSource(AttrSource(source, "__self__"), "prev"), prior)
        return BoundBuiltinMethod(GradModeVariable(not prior, type(value.__self__), prior), value.__func__.__name__)
    if isinstance(value, types.MethodType) and type(value.__self__) is ReenteredAutocast and source is not None:
        # The `__exit__` of an autocast block that a graph break re-entered.
        block = value.__self__
        _guard(tx, "EQUALS", AttrSource(AttrSource(source, "__self__"), "prior"), block.prior)
        return BoundBuiltinMethod(ReenteredAutocastVariable(block.enabled, block.dtype, block.prior), "__exit__")
    if isinstance(value, types.MethodType):
        self_var = wrap(tx, value.__self__, None if source is None else _attr(source, "__self__")) if tx is not None else _build(None, value.__self__, None)
        func_var = wrap(tx, value.__func__, None if source is None else _attr(source, "__func__")) if tx is not None else _build(None, value.__func__, None)
        return f.BoundMethodVariable(func_var, self_var)
    if isinstance(value, functools._lru_cache_wrapper) and isinstance(getattr(value, "__wrapped__", None), types.FunctionType):
        # `functools.lru_cache` / `functools.cache` (C code): called for real on constant
        # arguments, else the wrapped function is traced (functions.py CachedFunctionVariable).
        src = _pin(tx, value, source)
        wrapped = f.UserFunctionVariable(value.__wrapped__, None if src is None else ConstSource(value.__wrapped__, f"{src}.__wrapped__"))
        return f.CachedFunctionVariable(value, wrapped, src)
    if isinstance(value, functools.partial):
        # An argument: guarded by what it holds (its function by identity, its arguments as any
        # input), so a new partial of the same function and kinds of arguments reuses the graph;
        # reached otherwise, pinned by identity. Either way what it holds is read through it.
        if tx is not None and source is not None and source.is_local() and type(value) is functools.partial:
            _guard(tx, "TYPE_MATCH", source, functools.partial)
            _guard(tx, "LENGTH_MATCH", _attr(source, "args"), len(value.args))
            _guard(tx, "EQUALS", KeysSource(_attr(source, "keywords")), list(value.keywords))
            src = source
        else:
            src = _pin(tx, value, source)

        def part(item: Any, where: Source | None) -> Variable:
            return wrap(tx, item, where) if tx is not None and src is not None else _build(tx, item, None)

        return f.PartialVariable(
            part(value.func, _attr(src, "func") if src is not None else None),
            [part(a, ItemSource(_attr(src, "args"), i) if src is not None else None) for i, a in enumerate(value.args)],
            {k: part(v, ItemSource(_attr(src, "keywords"), k) if src is not None else None) for k, v in value.keywords.items()},
            src,
        )
    if isinstance(value, type):
        return o.ClassVariable(value, _pin(tx, value, source))
    if isinstance(value, types.ModuleType):
        return o.PythonModuleVariable(value, _pin(tx, value, source))
    if isinstance(value, (staticmethod, classmethod, property, types.MethodDescriptorType, types.WrapperDescriptorType, types.BuiltinMethodType, types.MethodWrapperType, types.GetSetDescriptorType, types.MemberDescriptorType)):
        return o.OpaqueVariable(value, _pin(tx, value, source))
    if type(value) is itertools.count and source is not None and tx is not None:
        # The caller's counter (a global, a closure's): read where it stands when the graph runs
        # (an int count's value a symbolic int input, so each call does not capture again; else a
        # constant, guarded), its step guarded; the items the trace takes are taken from it after
        # the graph runs (side_effects.py).
        start, step = count_state(value)
        _guard(tx, "TYPE_MATCH", source, itertools.count)
        _guard(tx, "EQUALS", ConvertedSource(source, count_step), step)
        at = ConvertedSource(source, count_next)
        if type(start) is int and type(step) is int and config.capture.dynamic_ints:
            first = tx.output.add_int_input(start, at)
        else:
            _guard(tx, "EQUALS", at, start)
            first = ConstantVariable(start)
        return EndlessIteratorVariable(itertools.count, first, step, source)
    if type(value) in SEQUENCE_ITERATORS and source is not None:
        # An iterator of a tuple, list or range (the caller's, or a loop's handed to a resume
        # function, kiln/capture/resume_at_break.py): the items it has left, guarded as a tuple;
        # the items the trace takes are taken from it after the graph runs (side_effects.py).
        _guard(tx, "TYPE_MATCH", source, type(value))
        rest = wrap(tx, remaining_items(value), RemainingItemsSource(source))
        iterator = c.IteratorVariable(rest.items, source)
        iterator.cls = type(value)
        return iterator
    if isinstance(value, BaseException):
        return ExceptionVariable(type(value), (), value)
    if is_environ(value) and tx is not None and source is not None and not source.is_local():
        return EnvironVariable(value, _pin(tx, value, source))  # (read by name, each name guarded alone)
    # Any other object: its attributes are read (and guarded) one at a time.
    if source is not None and source.is_local():
        _guard(tx, "TYPE_MATCH", source, type(value))
        return o.UserObjectVariable(value, source)
    return o.UserObjectVariable(value, _pin(tx, value, source))


def _ndarray_input(tx: Any, value: Any, source: Source | None) -> Variable:
    """An ndarray the graph reads: its memory as a tensor input (numpy_arrays.py)."""
    if tx is None or source is None:
        raise unsupported("unsupported_attribute", "an ndarray computed outside the graph while capturing, or held "
                          "where kiln cannot read it again on the next call", "pass the array as an argument")
    if value.dtype.kind not in "biufc" or value.dtype.byteorder == ">":
        raise unsupported("unsupported_argument", f"an ndarray of dtype {value.dtype} (kiln's graphs read arrays of "
                          "booleans and native-endian numbers)", "the frame runs eagerly")
    _guard(tx, "TYPE_MATCH", source, type(value))
    tensor = tx.output.add_input(tensor_of(value), ConvertedSource(source, tensor_of))
    return NumpyArrayVariable(tensor.node, tensor.example, source)


def _attr(source: Source, name: str) -> Source:
    return AttrSource(source, name)


wrapping.install(_build)
