"""The graph a capture builds: fx nodes, fake-tensor metadata, inputs, guards and side effects.

Tensor operations met by the interpreter become `call_function`/`call_method` nodes; each is run
on fake tensors at once, so every value in the graph knows its dtype, shape and strides while the
trace goes on. Frame inputs become placeholders (with a TENSOR_MATCH guard); parameters and
buffers of captured modules become `get_attr` nodes of the graph's root module, holding the
same tensor objects, so gradients and optimizer steps reach them.
"""

from __future__ import annotations

import contextlib
import enum
import operator
import re
import sys
from typing import Any, Callable, Sequence

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.amp import autocast_mode
from torch._dispatch.python import enable_python_dispatcher
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

from kiln.capture.break_records import unsupported
from kiln.capture.dynamic import ShapeSource, placeholder, symbolic_fake
from kiln.capture.guards import Guard, GuardSet, TensorFacts, alias_pattern
from kiln.capture.known_values import KnownValues
from kiln.capture.side_effects import SideEffects
from kiln.capture.sources import Source
from kiln.capture.variables.base import Variable, made_now
from kiln.capture.variables.containers import ListVariable, NamedTupleVariable, TupleVariable, is_namedtuple_class
from kiln.capture.variables.symbolic import SymNodeVariable, has_symbolic, wrap_symbolic
from kiln.capture.variables.tensor import IDENTITY_READ, TensorVariable
from kiln.capture.variables.wrapping import wrap_constant_result
from kiln.ir.sizes import size_examples

_DATA_DEPENDENT = ("DynamicOutputShapeException", "DataDependentOutputException", "GuardOnDataDependentSymNode", "UnsupportedOperatorException")


def _node_name(text: str) -> str:
    name = re.sub(r"[^0-9a-zA-Z_]+", "_", text).strip("_")
    return name if name and not name[0].isdigit() else f"_{name}"


class OutputGraph:
    def __init__(self, frame_args: tuple) -> None:
        # The graph ops go into: the captured graph, or a branch of a higher-order op being traced
        # (tracing_into); inputs and parameters always enter the captured graph (`root_graph`).
        self.graph = self.root_graph = fx.Graph()
        self.subgraphs: dict[fx.Graph, dict[str, fx.GraphModule]] = {}  # graph -> its branches' modules, by name
        self.fake_mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=False)
        self.scalar_outputs = False  # tensor.item() kept in the graph (kiln/capture/variables/unbacked.py)
        self.guards = GuardSet()
        self.side_effects = SideEffects()
        self.known = KnownValues()  # real values of small tensors made from constants
        # One variable per real closure cell, however it is reached (a resume function's cell
        # parameter, the closure of a function that holds it): a write through one is seen by all.
        self.real_cells: dict[int, Any] = {}
        self.frame_args = frame_args
        self.inputs: list[tuple[Source, fx.Node, torch.Tensor]] = []
        self.attrs: dict[str, torch.Tensor] = {}
        self._attr_by_id: dict[int, Variable] = {}
        self.wrapped: dict[Source, Variable] = {}  # one variable per source, so reads agree
        self.generators: list = []  # the user generators run while capturing (frame.py checks how they end)
        self.wrapped_containers: dict[int, tuple[Any, Variable]] = {}  # id -> (list/dict/set, its variable)
        self.wrapped_objects: dict[int, tuple[Any, Variable]] = {}  # id -> (user object, its variable)
        self._fakes: dict[int, torch.Tensor] = {}
        self._last_input: fx.Node | None = None
        self.op_count = 0
        self.user_recursion_limit = sys.getrecursionlimit()  # (frame.py sets it before raising the limit to capture)
        self.pending_restores: list[tuple[str, Any]] = []  # autocast states to leave if capture stops
        # Which dimensions of an input tensor are symbolic (kiln/capture/dynamic.py decides).
        self.dynamic_dims: Callable[[Source, torch.Tensor], frozenset[int]] = lambda source, tensor: frozenset()
        self.dynamic_int: Callable[[Source], bool] = lambda source: False  # which int inputs are symbolic
        # (source, its symbolic fake tensor or SymInt)
        self.symbolic_inputs: list[tuple[Source, torch.Tensor | torch.SymInt]] = []
        # Global state the graph switches: it ends in the state it started in (graph_module), so
        # tracing it twice (the AOT layer does) starts both times alike; the runner sets the
        # state the frame ends in.
        self.start_grad = self.graph_grad = torch.is_grad_enabled()
        self.open_autocast: list[fx.Node] = []  # _enter_autocast nodes of blocks a resume function left

    # --- values entering the graph --------------------------------------------------------------


    def _symbolic_dispatch(self) -> Any:
        """Torch's Python dispatcher once the capture has symbolic sizes: some ops' C++ meta
        functions want concrete sizes (`trace`, `narrow_copy`, `addbmm` on symbolic inputs), and
        their Python decompositions compute the result's shape symbolically. Static captures keep
        the faster C++ path."""
        return enable_python_dispatcher() if size_examples(self.fake_mode.shape_env) else contextlib.nullcontext()
    def fake(self, tensor: torch.Tensor, dynamic: frozenset[int] = frozenset()) -> torch.Tensor:
        fake = self._fakes.get(id(tensor))
        if fake is None:
            if dynamic:
                fake = symbolic_fake(self.fake_mode, tensor, dynamic, len(self.symbolic_inputs))
            else:
                fake = self.fake_mode.from_tensor(tensor, static_shapes=True)
            self._fakes[id(tensor)] = fake
        return fake

    def add_input(self, tensor: torch.Tensor, source: Source) -> Variable:
        if tensor.layout != torch.strided:  # no sizes and strides to guard on, no fake tensor to trace with
            raise unsupported("sparse_tensor", f"{source} is a {tensor.layout} tensor; kiln captures strided tensors",
                              "the frame runs eagerly; pass a dense tensor (`.to_dense()`) to compile it")
        dynamic = self.dynamic_dims(source, tensor) if id(tensor) not in self._fakes else frozenset()
        fake = self.fake(tensor, dynamic)
        if dynamic:
            # Sizes and strides are checked by the shape environment's guards (shape_guards).
            self.symbolic_inputs.append((source, fake))
            self.guards.add(Guard("TENSOR_MATCH", source, TensorFacts.of(tensor), "dynamic"))
        else:
            self.guards.add(Guard("TENSOR_MATCH", source, TensorFacts.of(tensor)))
        node = self._placeholder(source, tensor, fake)
        var = TensorVariable(node, fake, source=source, cls=type(tensor))
        var.real = tensor  # (its instance attributes are read from it, guarded)
        return var

    def add_int_input(self, value: int, source: Source) -> Variable:
        """An int the frame reads, entering as a symbolic int (kiln/capture/dynamic.py decides
        which): a graph input whose value the shape environment's guards constrain."""
        shape_env = self.fake_mode.shape_env
        name = ShapeSource(placeholder(len(self.symbolic_inputs)))
        number = shape_env.create_unspecified_symint_and_symbol(value, name, DimDynamic.DYNAMIC)
        self.symbolic_inputs.append((source, number))
        self.guards.add(Guard("TYPE_MATCH", source, int))  # (its value: SHAPE guards)
        return SymNodeVariable(self._placeholder(source, value, number), number)

    def _placeholder(self, source: Source, value: Any, example: Any) -> fx.Node:
        """A graph input read from `source`, after the inputs added before it."""
        graph = self.root_graph
        if self._last_input is None:
            first = next(iter(graph.nodes), None)
            context = graph.inserting_before(first) if first is not None else graph.inserting_after(None)
        else:
            context = graph.inserting_after(self._last_input)
        name = _node_name(str(source))
        while any(n.op == "placeholder" and n.target == name for n in graph.nodes):
            name += "_"  # `x.a_b` and `x.a.b` clean up to the same name
        with context:
            node = graph.placeholder(name)
        self._last_input = node
        node.meta["example_value"] = example
        self.inputs.append((source, node, value))
        return node

    def add_attr(self, tensor: torch.Tensor, source: Source, path: str) -> Variable:
        """A parameter or buffer read through a module: a get_attr node holding the real tensor."""
        known = self._attr_by_id.get(id(tensor))
        if known is not None:
            return known
        name = _node_name(path) or "attr"
        while name in self.attrs:
            name += "_"
        self.attrs[name] = tensor
        node = self.root_graph.get_attr(name)
        fake = self.fake(tensor)
        node.meta["example_value"] = fake
        var = TensorVariable(node, fake, source=source, cls=type(tensor))
        self._attr_by_id[id(tensor)] = var
        return var

    # --- branches of higher-order ops (kiln/capture/variables/control_flow.py) -------------------

    @contextlib.contextmanager
    def tracing_into(self, graph: fx.Graph, where: str) -> Any:
        """Ops go into `graph` inside the block; a change to anything outside the branch is
        refused there (`where` says which branch) — it would happen whichever branch runs."""
        effects = self.side_effects
        outer, outer_refusal = self.graph, (effects.refused, effects.refused_before)
        self.graph, effects.refused, effects.refused_before = graph, where, made_now()
        try:
            yield
        finally:
            self.graph, (effects.refused, effects.refused_before) = outer, outer_refusal

    def add_subgraph(self, graph: fx.Graph, stem: str) -> fx.Node:
        """`graph` as a module of the current graph's root: a get_attr node reading it."""
        root = torch.nn.Module()
        for name, module in self.subgraphs.get(graph, {}).items():  # (a branch's own branches)
            root.add_module(name, module)
        module = fx.GraphModule(root, graph, class_name="KilnBranch")
        held = self.subgraphs.setdefault(self.graph, {})
        name, suffix = stem, len(held)
        while name in held or name in self.attrs:
            name, suffix = f"{stem}_{suffix}", suffix + 1
        held[name] = module
        return self.graph.get_attr(name)

    def subgraph_module(self, node: fx.Node) -> fx.GraphModule:
        return self.subgraphs[node.graph][node.target]

    # --- operations ---------------------------------------------------------------------------

    def call(self, kind: str, target: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        """Add a call node (`call_function` or `call_method`) and run it on fake tensors."""
        fx_args = _python_scalars(tuple(a.as_fx_arg() for a in args))
        fx_kwargs = _python_scalars({k: v.as_fx_arg() for k, v in kwargs.items()})
        odd = _unprintable((fx_args, fx_kwargs))
        if odd is not None:
            # The graph's code would name an object it cannot spell (a module, an options
            # dataclass, a function): the call runs natively behind a graph break instead.
            what = target if isinstance(target, str) else getattr(target, "__qualname__", None) or repr(target)
            raise unsupported("unsupported_argument", f"{what} takes a {type(odd).__qualname__} argument, which a "
                              "graph cannot hold as a constant", "the graph breaks at this call")
        ex_args = [a.as_example() for a in args]
        ex_kwargs = {k: v.as_example() for k, v in kwargs.items()}
        try:
            with self.fake_mode, self._symbolic_dispatch():
                if kind == "call_method":
                    result = getattr(ex_args[0], target)(*ex_args[1:], **ex_kwargs)
                else:
                    result = target(*ex_args, **ex_kwargs)
        except Exception as error:  # noqa: BLE001 - eager will run (and raise, if the user's code is wrong)
            name = type(error).__name__
            kind_name = "data_dependent_op" if name in _DATA_DEPENDENT else "op_error"
            what = target if isinstance(target, str) else getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
            first = (str(error).strip().splitlines() or [""])[0][:300]
            raise unsupported(kind_name, f"{what} could not run on fake tensors: {name}: {first}",
                              "the graph breaks at an op whose output shape depends on data" if kind_name == "data_dependent_op" else "") from None
        if any(isinstance(t, torch.Tensor) and t.layout != torch.strided for t in _leaves(result)):
            what = target if isinstance(target, str) else getattr(target, "__qualname__", None) or repr(target)
            raise unsupported("sparse_tensor", f"{what} returns a sparse tensor; kiln's graphs hold strided tensors",
                              "the graph breaks at this call")
        if not _has_tensor(result):
            if has_symbolic(result):  # arithmetic on sizes of dynamic inputs, numel(), ...
                return wrap_symbolic(self.graph, self.graph.create_node(kind, target, fx_args, fx_kwargs), result)

            if result is None and (_has_tensor(ex_args) or has_symbolic(ex_args)):
                # `x[i] = v`: no result, but a tensor changed; `torch._check(u0 >= 0)`: checked when the graph runs
                node = self.graph.create_node(kind, target, fx_args, fx_kwargs)
                self.known.record(kind, target, fx_args, fx_kwargs, node, None)
                self.op_count += 1
            return wrap_constant_result(result)
        node = self.graph.create_node(kind, target, fx_args, fx_kwargs)
        self.op_count += 1
        self.known.record(kind, target, fx_args, fx_kwargs, node, result)
        # An in-place op (`y = x.add_(1)`, `x += 1`, `out=`) returns the tensor it wrote: the same
        # object in eager (`y is x`, one item of a set), so the same variable here. Later ops read
        # its earlier node: at run time that is the same tensor, written.
        written = [(a, e) for a, e in ((args[0] if args else None, ex_args[0] if ex_args else None),
                                       (kwargs.get("out"), ex_kwargs.get("out")))]
        for var, example in written:
            if isinstance(var, TensorVariable) and example is result:
                node.meta["example_value"] = result
                return var
        return self.wrap_result(node, result)

    def wrap_result(self, node: fx.Node, value: Any) -> Variable:
        if isinstance(value, torch.Tensor):
            node.meta["example_value"] = value
            return TensorVariable(node, value)
        if isinstance(value, (tuple, list)):
            node.meta["example_value"] = value
            items = []
            for i, item in enumerate(value):
                if isinstance(item, torch.Tensor) or isinstance(item, (tuple, list)) and _has_tensor(item):
                    items.append(self.wrap_result(self.graph.call_function(operator.getitem, (node, i)), item))
                else:
                    items.append(wrap_constant_result(item))
            if isinstance(value, tuple) and is_namedtuple_class(type(value)):
                return NamedTupleVariable(items, type(value))
            return ListVariable(items) if isinstance(value, list) else TupleVariable(items)
        raise unsupported("unsupported_output", f"an operation returned {type(value).__name__} holding tensors")

    # --- the finished graph -------------------------------------------------------------------

    def shape_guards(self) -> list[Guard]:
        """The shape environment's guards over the dynamic inputs (sizes, strides, relations):
        call after everything that may add one (the trace, and the backend's own tracing)."""
        if not self.symbolic_inputs:
            return []
        fakes = [fake for _, fake in self.symbolic_inputs]
        names = [ShapeSource(placeholder(i)) for i in range(len(fakes))]
        texts = self.fake_mode.shape_env.produce_guards(fakes, names, ignore_static=False)
        by_name = {placeholder(i): source for i, (source, _) in enumerate(self.symbolic_inputs)}
        return [Guard("SHAPE", None, (text, tuple(sorted(by_name.items())))) for text in texts]

    def aliasing_guard(self) -> list[Guard]:
        """Which tensor inputs were one object (f(x, x)): the graph traced them as one, so a call
        where they are two (or two that were two are now one) must capture again. A graph that
        writes in place also pins which inputs share memory (two views of one tensor)."""
        # The graph's inputs, and the tensors whose identity the trace compared (`a is b` decided
        # while capturing on two that no op reads). Not one read only at a break (`if c:`).
        tensors = [(source, node, value) for source, node, value in self.inputs if isinstance(value, torch.Tensor)]
        read = [(source, tensor) for source, node, tensor in tensors if node.users or node.meta.get(IDENTITY_READ)]
        if len(read) < 2:
            return []
        by_storage = self.writes_in_place()
        # (one read only at a break is no graph input; one whose sizes alone the graph reads, e.g. a
        # growing KV cache's view beside the buffer it views, has no values the write could change)
        used = [tensor for _, node, tensor in tensors if any(not _reads_layout_only(user) for user in node.users)]
        if by_storage and len(set(alias_pattern(used, by_storage=True)[len(used):])) < len(used):
            # The AOT layer's functional graph would write each input back from its own value.
            raise unsupported("aliased_input_mutation", "two inputs share memory (one tensor twice, or views of one "
                              "tensor) and the graph writes in place", "the frame runs eagerly; pass separate tensors "
                              "(or a clone of one)")
        pattern = alias_pattern([tensor for _, tensor in read], by_storage=by_storage)
        return [Guard("ALIASING", None, (pattern, tuple(source for source, _ in read)), "storage" if by_storage else "")]

    def writes_in_place(self) -> bool:
        """Whether the graph has an in-place operation (`add_`, `out=`, `t[i] = v`)."""
        for node in self.graph.nodes:
            name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
            if node.op in ("call_method", "call_function") and (
                    (name.endswith("_") and not name.startswith("_")) or "out" in node.kwargs or name == "setitem"
                    or getattr(node.target, "writes_in_place", False)):
                return True
        return False

    def size_symbols(self) -> dict[Any, tuple[Source, int | None]]:
        """Each symbol that is a whole dynamic input dimension -> (the input's source, the dim);
        each that is a symbolic int input -> (its source, None)."""
        found: dict[Any, tuple[Source, int | None]] = {}
        for source, fake in self.symbolic_inputs:
            if isinstance(fake, torch.SymInt):
                if fake.node.expr.is_Symbol:
                    found.setdefault(fake.node.expr, (source, None))
                continue
            for dim, size in enumerate(fake.size()):
                if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                    found.setdefault(size.node.expr, (source, dim))
        return found

    def graph_module(self, outputs: list[fx.Node]) -> fx.GraphModule:
        for node in reversed(self.open_autocast):
            self.graph.call_function(autocast_mode._exit_autocast, (node,))
        if self.graph_grad != self.start_grad:
            self.graph.call_function(torch._C._set_grad_enabled, (self.start_grad,))
        self.graph.output(tuple(outputs))
        root = torch.nn.Module()
        for name, module in self.subgraphs.get(self.graph, {}).items():
            root.add_module(name, module)
        for name, tensor in self.attrs.items():
            if isinstance(tensor, torch.nn.Parameter):
                root.register_parameter(name, tensor)
            else:
                root.register_buffer(name, tensor)
        gm = fx.GraphModule(root, self.graph, class_name="KilnCaptured")
        # No dead-code elimination here: in-place calls and grad-mode switches have no users.
        gm.recompile()
        return gm


# Constants an fx graph's generated code spells back exactly (besides Nodes and containers of them).
_PRINTABLE = (type(None), bool, int, float, complex, str, torch.dtype, torch.device, torch.layout, torch.memory_format,
              torch.Size, slice, range, type(Ellipsis), torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool, enum.Enum,
              torch._ops.OpOverload, torch._ops.OpOverloadPacket, fx.Node)


# The dtypes torch's argument parser reads Python's number types as.
_PYTHON_TYPE_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}


def _python_scalars(value: Any) -> Any:
    """`value` with NumPy scalars as the Python numbers they stand for: a torch op takes an
    np.int64 or np.float32 as it takes an int or a float (the same result dtype), and the graph
    can hold the number as a constant; Python's number types as the dtypes torch reads them as."""
    if type(value).__module__ == "numpy" and getattr(value, "shape", None) == () and value.dtype.kind in "biufc":
        return value.item()  # (a NumPy scalar: bool, int, float or complex; numpy need not be imported)
    if type(value) is type and value in _PYTHON_TYPE_DTYPES:
        return _PYTHON_TYPE_DTYPES[value]  # `x.to(float)`: the dtype torch reads a Python type as
    if isinstance(value, (tuple, list)):
        return type(value)(_python_scalars(v) for v in value)
    if isinstance(value, dict):
        return {k: _python_scalars(v) for k, v in value.items()}
    return value


def _unprintable(value: Any) -> Any:
    """The first leaf of `value` an fx graph cannot hold as a constant, or None."""
    if isinstance(value, (tuple, list)):
        return next((odd for v in value if (odd := _unprintable(v)) is not None), None)
    if isinstance(value, dict):
        return next((odd for v in value.values() if (odd := _unprintable(v)) is not None), None)
    return None if isinstance(value, _PRINTABLE) else value


def _leaves(value: Any) -> list:
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def _has_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (tuple, list)):
        return any(_has_tensor(v) for v in value)
    if isinstance(value, dict):
        return any(_has_tensor(v) for v in value.values())
    return False


# Tensor methods that read a tensor's layout, never its values.
_LAYOUT_METHODS = frozenset({"size", "stride", "storage_offset", "dim", "numel"})


def _reads_layout_only(node: fx.Node) -> bool:
    """Whether graph node `node` reads only the layout of the tensor it is handed (`x.size(1)`)."""
    return node.op == "call_method" and node.target in _LAYOUT_METHODS
