"""The compiled frame's runner: call the graph, replay side effects, rebuild the return value.

Generated as Python source, like the guards: `run(L)` reads the graph's inputs through their
sources, calls the compiled graph once, applies the recorded side effects and returns the
function's result rebuilt around the graph's flat tensor outputs (tuples, lists, dicts,
dataclasses and ModelOutputs, constants, and objects the frame received).
"""

from __future__ import annotations

import collections
import copy
import functools
import itertools
import math
import types
import warnings
import weakref
from collections import defaultdict
from typing import Any, Callable

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.utils._sympy.printers import PythonPrinter

from kiln.capture import reentry
from kiln.capture.break_records import unsupported
from kiln.capture.sources import Namespace
from kiln.capture.user_exceptions import ExceptionVariable
from kiln.capture.variables import containers as c
from kiln.capture.variables.autograd_function import FunctionApplyVariable
from kiln.capture.variables.base import BoundBuiltinMethod, Variable
from kiln.capture.variables.builtins import CatchWarningsVariable, CycleIteratorVariable, EndlessIteratorVariable, LazyIteratorVariable, UnboundBuiltinMethod
from kiln.capture.variables.constant import ConstantMethodVariable, ConstantVariable
from kiln.capture.variables.functions import (BoundMethodVariable, CellVariable, GeneratorVariable, NestedFunctionVariable, PartialVariable,
                                              RealCellVariable)
from kiln.capture.variables.modules import EphemeralModuleVariable, SlicedModulesVariable, sliced_container
from kiln.capture.variables.numpy_arrays import NumpyArrayVariable, NumpyMethodVariable, ndarray_of
from kiln.capture.model_output_builder import ModelOutputBuilder
from kiln.capture.variables.objects import ModelOutputVariable, PythonModuleVariable, UserIteratorVariable, UserObjectVariable, new_container_object
from kiln.capture.variables.symbolic import SymNodeVariable
from kiln.capture.variables.tensor import TensorMethodVariable, TensorVariable
from kiln.capture.variables.torch_fns import GradModeFunctionVariable, GradModeVariable
from kiln.capture.variables.weakrefs import WeakRefVariable


def _set_attributes(obj: Any, attrs: dict, through_dict: Any = ()) -> None:
    for key, value in attrs.items():
        if key in through_dict:  # (written into `obj.__dict__` past a data descriptor of that name)
            object.__getattribute__(obj, "__dict__")[key] = value
        else:
            object.__setattr__(obj, key, value)


def _new_object(cls: type) -> Any:
    return cls.__new__(cls)


class Reconstructor:
    def __init__(self, size_symbols: dict[Any, tuple[Any, int]] | None = None) -> None:
        self.ns = Namespace()
        # Each symbol of a dynamic input dimension -> (the input's source, the dimension), or of a
        # symbolic int input -> (its source, None): a symbolic int alive at a graph break is
        # computed again from them, never returned by the graph.
        self.size_symbols = size_symbols or {}
        self.outputs: list[fx.Node] = []
        self._index: dict[fx.Node, int] = {}
        # Objects made in the trace are built once into a local, so `return p, [p]` keeps identity.
        self.prelude: list[str] = []
        self._built: dict[int, str] = {}
        # Cells' contents, set after everything is built: a closure may hold the cell it is in.
        self.cell_contents: list[str] = []

    def graph_output(self, node: fx.Node) -> str:
        if node not in self._index:
            self._index[node] = len(self.outputs)
            self.outputs.append(node)
        return f"outs[{self._index[node]}]"

    def const(self, value: Any) -> str:
        # Exact types: a str or int enum (HF's `Action.NONE`) is one too, and its repr is no literal.
        if value is None or type(value) in (bool, int, str, bytes) or type(value) is float and math.isfinite(value):
            return repr(value)
        return self.ns.bind(value, "K")

    def expr(self, var: Variable) -> str:
        if id(var) in self._built:
            return self._built[id(var)]
        if (var.source is None or isinstance(var, EphemeralModuleVariable)) and self._is_new_mutable(var):
            return self._build_once(var)
        return self._expr(var)

    @staticmethod
    def _is_new_mutable(var: Variable) -> bool:
        if isinstance(var, EphemeralModuleVariable):  # (one module however many places hold it)
            return True
        if isinstance(var, UserObjectVariable):
            return var.is_new
        if isinstance(var, TensorVariable):  # (one the trace set attributes on: set on the output, once)
            return bool(var.attrs)

        # (A named tuple of a subclass with an instance __dict__ takes attributes: one object,
        # so that `tup.c = v` run at a graph break is seen through every reference.)
        return (isinstance(var, (ModelOutputVariable, c.DictVariable, c.SetVariable, NestedFunctionVariable))
                or type(var) in (c.ListVariable, c.DequeVariable)
                or isinstance(var, c.NamedTupleVariable) and getattr(var.cls, "__dictoffset__", 0) != 0)

    def cell(self, var: Variable | None) -> str:
        """A closure cell at a graph break (kiln/capture/resume_at_break.py): one made in the trace
        is built once, so every closure holding it shares it; one that existed before is the
        object itself (a pinned function's) or the resume function's parameter it came in."""
        if var is None:
            return f"{self.ns.bind(types.CellType, 'T')}()"
        if id(var) in self._built:
            return self._built[id(var)]
        if isinstance(var, RealCellVariable):  # (a write to it is replayed before it is used: side_effects.py)
            return var.cell_source.expr(self.ns) if var.cell_source is not None else self.ns.bind(var.cell, "C")
        if not isinstance(var, CellVariable):
            raise unsupported("unsupported_output", f"a closure cell holding {var.describe()}")
        name = self._built[id(var)] = f"_o{len(self._built)}"
        self.prelude.append(f"{name} = {self.ns.bind(types.CellType, 'T')}()")
        if var.contents is not None:
            self.cell_contents.append(f"{name}.cell_contents = {self.expr(var.contents)}")
        return name

    def _function(self, var: NestedFunctionVariable, name: str) -> None:
        """Lines building the function made in the trace into the local `name`."""
        defaults = f"({''.join(self.expr(d) + ', ' for d in var._defaults)})" if var._defaults else "None"
        closure = f"({''.join(self.cell(cell) + ', ' for cell in var._closure)})" if var._closure else "None"
        code, f_globals = self.ns.bind(var.code, "K"), self.ns.bind(var.f_globals, "K")
        self.prelude.append(f"{name} = {self.ns.bind(types.FunctionType, 'T')}({code}, {f_globals}, {var.code.co_name!r}, "
                            f"{defaults}, {closure})")
        self.prelude.append(f"{name}.__qualname__ = {var.qualified_name()!r}")
        if var._kwdefaults:
            kwdefaults = ", ".join(f"{k!r}: {self.expr(v)}" for k, v in var._kwdefaults.items())
            self.prelude.append(f"{name}.__kwdefaults__ = {{{kwdefaults}}}")
        for slot, value in var.attrs.items():
            if slot != "__qualname__":
                self.prelude.append(f"{name}.{slot} = {self.expr(value)}")
        if var.dict.entries:
            self.prelude.append(f"{name}.__dict__.update({self.expr(var.dict)})")

    def _build_once(self, var: Variable) -> str:
        name = f"_o{len(self._built)}"
        self._built[id(var)] = name
        if isinstance(var, NestedFunctionVariable):
            self._function(var, name)
        elif isinstance(var, EphemeralModuleVariable):
            self.prelude.append(f"{name} = {self._expr(var)}")
        elif isinstance(var, UserObjectVariable):
            # Bound before its attributes are built, so an attribute may refer back to it.
            contents = getattr(var, "container", None)
            if contents is None:
                self.prelude.append(f"{name} = {self.ns.bind(_new_object, 'F')}({self.ns.bind(var.cls, 'T')})")
            else:  # a dict or set subclass made in the trace: its contents too
                self.prelude.append(f"{name} = {self.ns.bind(new_container_object, 'F')}({self.ns.bind(var.cls, 'T')}, {self._expr(contents)})")
            attrs = "{" + ", ".join(f"{k!r}: {self.expr(v)}" for k, v in var.attrs.items()) + "}"
            # object.__setattr__ fills __slots__ and __dict__ alike (a class's own __setattr__ is
            # not run again: the trace already ran it).
            through_dict = f", {sorted(var.dict_writes)!r}" if var.dict_writes else ""
            self.prelude.append(f"{self.ns.bind(_set_attributes, 'F')}({name}, {attrs}{through_dict})")
        else:
            self.prelude.append(f"{name} = {self._expr(var)}")
            if getattr(var, "attrs", None):  # (attributes the trace set on a tensor or a named tuple)
                attrs = "{" + ", ".join(f"{k!r}: {self.expr(v)}" for k, v in var.attrs.items()) + "}"
                self.prelude.append(f"{self.ns.bind(_set_attributes, 'F')}({name}, {attrs})")
        return name

    def _expr(self, var: Variable) -> str:
        if isinstance(var, EphemeralModuleVariable):  # (built inside from constants: built again, a new object)
            cls, args, kwargs = var.rebuilt_by
            arguments = [self.const(a) for a in args] + [f"{k}={self.const(v)}" for k, v in kwargs.items()]
            return f"{self.ns.bind(cls, 'T')}({', '.join(arguments)})"
        if isinstance(var, TensorVariable):
            if var.source is not None and var.node.op in ("placeholder", "get_attr"):
                return var.source.expr(self.ns)
            return self.graph_output(var.node)
        if isinstance(var, NumpyArrayVariable):  # (an input as the caller's object; else its tensor's array)
            if var.source is not None and var.node.op == "placeholder":
                return var.source.expr(self.ns)
            return f"{self.ns.bind(ndarray_of, 'F')}({self.graph_output(var.node)})"
        if var.source is not None and not isinstance(var, ConstantVariable):
            return var.source.expr(self.ns)
        if isinstance(var, ConstantVariable):
            return self.const(var.value)
        if isinstance(var, PythonModuleVariable):  # (`import torch.fx` inside binds a local: the module itself)
            return self.ns.bind(var.value, "M")
        if isinstance(var, SymNodeVariable):
            return self._size_expr(var)
        if isinstance(var, WeakRefVariable) and var.referent is not None:  # (made inside: a new reference to it)
            return f"{self.ns.bind(weakref.ref, 'T')}({self.expr(var.referent)})"
        if isinstance(var, c.SizeVariable):
            return f"{self.ns.bind(torch.Size, 'T')}([{', '.join(self.expr(i) for i in var.items)}])"
        if isinstance(var, SlicedModulesVariable):
            return (f"{self.ns.bind(sliced_container, 'F')}({self.ns.bind(var.module_cls, 'T')}, {var.keys!r}, "
                    f"[{', '.join(self.expr(i) for i in var.items)}])")
        if isinstance(var, c.NamedTupleVariable):
            return f"{self.ns.bind(var.constructor(), 'T')}({', '.join(self.expr(i) for i in var.items)})"
        if isinstance(var, c.DequeVariable):
            return f"{self.ns.bind(collections.deque, 'T')}([{', '.join(self.expr(i) for i in var.items)}], {var.maxlen!r})"
        if isinstance(var, c.ListVariable):
            return f"[{', '.join(self.expr(i) for i in var.items)}]"
        if isinstance(var, c.ListViewVariable):
            # A dict view (keys(), values(), items()) as the user's code returned it: its type
            # (dict_items, ...), a view of a dict of those items (kiln keeps no tie to the dict).
            if var.kind == "dict_items":
                pairs = "".join(f"({self.expr(p.items[0])}, {self.expr(p.items[1])}), " for p in var.items)
                return f"{self.ns.bind(dict, 'T')}(({pairs})).items()"
            if var.kind == "dict_keys":
                return f"{self.ns.bind(dict, 'T')}.fromkeys(({''.join(self.expr(i) + ', ' for i in var.items)})).keys()"
            return f"{self.ns.bind(dict, 'T')}(enumerate(({''.join(self.expr(i) + ', ' for i in var.items)}))).values()"
        if isinstance(var, c.TupleVariable):
            return f"({''.join(self.expr(i) + ', ' for i in var.items)})"
        if isinstance(var, c.DictVariable):
            body = "{" + ", ".join(f"{self.expr(k)}: {self.expr(v)}" for k, v in var.entries.values()) + "}"
            if var.cls is defaultdict:  # defaultdict(factory, {...})
                factory = "None" if var.default_factory is None else self.expr(var.default_factory)
                return f"{self.ns.bind(var.cls, 'T')}({factory}, {body})"
            return body if var.cls is dict else f"{self.ns.bind(var.cls, 'T')}({body})"
        if isinstance(var, PartialVariable):  # (one made in the trace: made again over what it holds)
            parts = [self.expr(var.func), *(self.expr(a) for a in var.args), *(f"{k}={self.expr(v)}" for k, v in var.kwargs.items())]
            return f"{self.ns.bind(functools.partial, 'T')}({', '.join(parts)})"
        if isinstance(var, CatchWarningsVariable):  # (not entered: a new one, as the trace made)
            return f"{self.ns.bind(warnings.catch_warnings, 'T')}(**{self.const(var.settings)})"
        if isinstance(var, ExceptionVariable):  # an exception made, not raised (`return x, StopIteration(1)`): made again
            if var.value is not None:
                return f"{self.ns.bind(copy.copy, 'F')}({self.ns.bind(var.value, 'K')})"
            return f"{self.ns.bind(var.exc_type, 'T')}({', '.join(self.expr(a) for a in var.args)})"
        if isinstance(var, GradModeVariable) and (var.prior is None or var.cls is torch.set_grad_enabled):
            # A grad-mode object alive at a break, not (yet) a block entered: `ctx = set_grad_enabled(True)`
            # (switched on construction, it restores its prior on exit), `torch.no_grad()` not entered.
            return f"{self.ns.bind(reentry.grad_mode_object, 'F')}({self.ns.bind(var.cls, 'T')}, {var.enabled!r}, {var.prior!r})"
        if isinstance(var, GradModeFunctionVariable):
            return f"{self.ns.bind(reentry.with_grad_mode, 'F')}({var.enabled!r}, {self.expr(var.fn)})"
        if isinstance(var, UserIteratorVariable):  # (the object itself: its state is replayed as any object's)
            return self.expr(var.obj)
        if isinstance(var, CycleIteratorVariable):  # a cycle starting where it has got to
            return f"{self.ns.bind(itertools.cycle, 'T')}(({''.join(self.expr(i) + ', ' for i in var.rest())}))"
        if isinstance(var, EndlessIteratorVariable):  # count/repeat from where it has got to
            step = f", {self.const(var.step)}" if var.kind is itertools.count else ""
            return f"{self.ns.bind(var.kind, 'T')}({self.expr(var.item)}{step})"
        if isinstance(var, LazyIteratorVariable):  # map/zip/filter over what its iterators have left
            fn = [] if var.kind is zip else [self.expr(var.fn)]
            rest = var.seqs if var.iterators is None else var.iterators
            return f"{self.ns.bind(var.kind, 'T')}({', '.join(fn + [self.expr(it) for it in rest])})"
        if isinstance(var, c.IteratorVariable):  # a running loop's iterator, at a graph break
            return f"{self.ns.bind(iter, 'F')}(({''.join(self.expr(i) + ', ' for i in var.items[var.position:])}))"
        if isinstance(var, c.MappingProxyVariable):  # (a view of the dict: the caller's own where it has a source)
            return f"{self.ns.bind(types.MappingProxyType, 'T')}({self.expr(var.contents)})"
        if isinstance(var, c.SetVariable):
            items = ", ".join(self.expr(i) for i in var.entries.values())
            return f"{self.ns.bind(var.python_type(), 'T')}([{items}])"
        if isinstance(var, ModelOutputVariable):
            # (`cls(**fields)` learned once, then copied: its constructor costs ~15 µs a call.)
            build = ModelOutputBuilder(var.cls, tuple(var.fields))
            return f"{self.ns.bind(build, 'B')}({', '.join(self.expr(v) for v in var.fields.values())})"
        if isinstance(var, GeneratorVariable) and var.iterator is None:
            # A generator nothing has asked an item of yet: its function called again on the same
            # arguments makes the same generator, its body not run until the caller asks.
            arguments = [self.expr(a) for a in var.args] + [f"{k}={self.expr(v)}" for k, v in var.kwargs.items()]
            return f"{self.expr(var.fn)}({', '.join(arguments)})"
        method = self._method(var)
        if method is not None:
            return method
        real = getattr(var, "value", None)
        if real is not None and var.is_constant():
            return self.const(real)
        raise unsupported("unsupported_output", f"returning {var.describe()} from a compiled function")


    def _size_expr(self, var: SymNodeVariable) -> str:
        """A symbolic int (or float, bool) alive at a graph break, as Python that computes it from
        the sizes of the inputs the runner reads: its expression over the shape environment's
        symbols, each symbol read from the input dimension it stands for (the graph returns tensors
        only). A number read from tensor data (capture.scalar_outputs' unbacked symbols) exists only
        in the graph: the graph returns it."""
        expr = var.value.node.expr
        symbols = sorted(expr.free_symbols, key=str)
        unknown = [str(s) for s in symbols if s not in self.size_symbols]
        if unknown and free_unbacked_symbols(var.value):
            return self.graph_output(var.node)
        if unknown:
            raise unsupported("unsupported_output", f"returning {var.describe()} from a compiled function "
                                                    f"({', '.join(unknown)}: not the size of an input)")
        sizes = ", ".join(self._symbol_read(*self.size_symbols[s]) for s in symbols)
        body = f"{self.ns.bind(var.python_type(), 'T')}({PythonPrinter().doprint(expr)})"
        return f"(lambda {', '.join(map(str, symbols))}: {body})({sizes})" if symbols else body

    def _symbol_read(self, source: Any, dim: int | None) -> str:
        """Where the runner reads a symbol's value: an input's size, or an int input itself."""
        return source.expr(self.ns) if dim is None else f"{source.expr(self.ns)}.size({dim})"

    def _method(self, var: Variable) -> str | None:
        """A method read but not called yet: on the stack at a graph break (`x.item` of `x.item()`)."""
        if isinstance(var, TensorMethodVariable):
            return f"{self.expr(var.tensor)}.{var.name}"
        if isinstance(var, NumpyMethodVariable):
            return f"{self.expr(var.array)}.{var.name}"
        if isinstance(var, FunctionApplyVariable):
            return f"{self.ns.bind(var.cls, 'T')}.apply"
        if isinstance(var, BoundBuiltinMethod) and var.name == "__exit__" and isinstance(var.obj, GradModeVariable):
            # A grad-mode block the graph ended inside: entered again here, left by this __exit__.
            return f"{self.ns.bind(reentry.reentered_grad_mode_exit, 'F')}({var.obj.prior!r}, {var.obj.enabled!r})"
        if isinstance(var, BoundBuiltinMethod) and var.name == "__exit__" and hasattr(var.obj, "block_state"):
            enabled, dtype = var.obj.block_state()  # an autocast block, likewise
            return f"{self.ns.bind(reentry.reentered_autocast_exit, 'F')}({enabled!r}, {self.ns.bind(dtype, 'K')})"
        if isinstance(var, BoundBuiltinMethod) and var.name.isidentifier():
            return f"{self.expr(var.obj)}.{var.name}"
        if isinstance(var, BoundMethodVariable):
            return f"{self.ns.bind(types.MethodType, 'T')}({self.expr(var.func)}, {self.expr(var.obj)})"
        if isinstance(var, UnboundBuiltinMethod):
            return f"{self.ns.bind(getattr(var.cls, var.name), 'K')}"
        if isinstance(var, ConstantMethodVariable):
            return f"{self.ns.bind(getattr(var.obj, var.name), 'K')}"
        return None


def build_runner(rc: Reconstructor, input_reads: list[str], input_exprs: list[str], compiled: Callable | None,
                 side_effect_lines: list[str], result: str, finish: str | None = None) -> tuple[Callable, str]:
    """`run(L)` as generated source; returns the function and its text (for KILN_LOGS=guards).
    `input_reads` assign the locals `input_exprs` share (`sources.read_once`). With `finish` (a
    graph break), `result` is the live (stack, locals) at the break and the runner returns
    `finish(*result)`, the rest of the frame run after the side effects."""
    lines = ["def run(L):"]
    if compiled is not None:
        lines += [f"    {line}" for line in input_reads]
        lines.append(f"    outs = {rc.ns.bind(compiled, 'graph')}({', '.join(input_exprs)})")
    lines += [f"    {line}" for line in rc.prelude + rc.cell_contents]
    # Sources in the result name the inputs as they were on entry: read them before the replay.
    lines.append(f"    result = {result}")
    lines += [f"    {line}" for line in side_effect_lines]
    lines.append(f"    return {finish}(*result)" if finish else "    return result")
    text = "\n".join(lines) + "\n"
    scope: dict[str, Any] = dict(rc.ns.values)
    exec(compile(text, "<kiln frame runner>", "exec"), scope)
    return scope["run"], text
