"""An ATen graph lowered to a `Program`: loop-IR nodes and extern calls over named buffers.

Pointwise values stay unrealized loaders until something needs memory (see values.py), so a chain
of pointwise ops is one `ComputeStep`. Ops without a lowering, or whose lowering declines
(NotImplementedError), become `ExternStep`s calling the ATen op, so every graph lowers.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from typing import Any

import sympy
import torch
from torch import fx
from torch.utils import _pytree as pytree

from kiln.ir.graph_meta import WRITTEN_BACK_FROM
from kiln.ir.nodes import Buffer, Layout, Node, Pointwise
from kiln.ir.program import ComputeStep, ExternStep, Program
from kiln.ir.sizes import is_size_symbol, size_expr, unbound_symbols
from kiln.lowering import table as _table, views as _views  # noqa: F401  (fills the lowering table)
from kiln.lowering.context import lowering_graph
from kiln.lowering.extern_layouts import argument_layout, argument_metas, layout_of, output_layouts, returns_view
from kiln.lowering.realize import should_realize
from kiln.lowering.registry import LOWERINGS
from kiln.lowering.values import ReductionResult, TensorValue


def _has_complex(node: fx.Node, args: tuple, kwargs: dict) -> bool:
    """Kernels have no complex types: such ops stay ATen calls."""
    values = [*pytree.tree_leaves(node.meta.get("val")), *pytree.tree_leaves((args, kwargs))]
    return any(getattr(v, "dtype", None) is not None and v.dtype.is_complex for v in values)


def _has_data_dependent_sizes(node: fx.Node, args: tuple, kwargs: dict) -> bool:
    """Sizes an earlier op computed from tensor values (nonzero, unique, masks) are symbols no
    kernel can be generated for: ops over such tensors stay ATen calls, so the rest of the graph
    is still kiln's. The inputs' symbolic sizes (size symbols, kiln/ir/sizes.py) are kernel
    arguments like any other size."""
    unbound = lambda x: bool(unbound_symbols(size_expr(x)))  # noqa: E731
    for v in pytree.tree_leaves(node.meta.get("val")):
        if isinstance(v, torch.SymInt) and unbound(v):
            return True
        if isinstance(v, torch.Tensor) and any(map(unbound, (*v.shape, *v.stride()))):
            return True
    return any(isinstance(v, TensorValue) and any(map(unbound, v.size)) for v in pytree.tree_leaves((args, kwargs)))


def _makes_new_tensor(node: Any) -> bool:
    """Whether an fx node is a call whose result eager allocates anew (not an input, not a view)."""
    return isinstance(node, fx.Node) and node.op == "call_function" and returns_view(node.target) is False


def _writes_arguments(target: Any) -> bool:
    """Whether an op may write into an argument (its schema marks one written, or it has none)."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return True
    return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def _input_size(node: fx.Node) -> sympy.Expr | None:
    """The expression of a node that computes a size from the inputs' symbolic sizes, else None."""
    val = node.meta.get("val")
    if not isinstance(val, torch.SymInt):
        return None
    expr = size_expr(val)
    return None if unbound_symbols(expr) else expr


def _with_traced_sizes(value: Any, val: Any) -> Any:
    """`value` with the sizes of the trace's fake value where they are symbolic: the ShapeEnv
    simplified those with what the guards promise (a slice `[:, :s]` of 512 positions is `s`
    long, not `Min(512, s)`, under the guard `s <= 512`), which the lowering alone cannot know."""
    if not isinstance(value, TensorValue) or value.buffer is not None or not isinstance(val, torch.Tensor):
        return value
    if len(val.shape) != value.rank or all(isinstance(s, int) for s in val.shape):
        return value
    traced = tuple(size_expr(s) for s in val.shape)
    if traced == tuple(value.size) or any(unbound_symbols(s) for s in traced):
        return value
    strided = value.strided
    if strided is not None:
        strided = (strided[0], dataclasses.replace(strided[1], size=traced))
    return dataclasses.replace(value, size=traced, strided=strided)


class GraphLowering:
    """Walks an ATen fx graph once and builds its Program."""

    def __init__(self, gm: fx.GraphModule, unprintable: frozenset[str] = frozenset()) -> None:
        """`unprintable`: names of `ops` the target's code generator has no code for; lowerings
        that would use them decline, and their ATen ops become extern calls."""
        self.gm, self.unprintable = gm, unprintable
        self.program = Program(inputs=[])
        self._names = itertools.count()
        self.written_back_inputs: set[str] = set()  # inputs the graph gives new values (a KV cache)
        # Values computed for externs that only read them, by (id(value), layout): one buffer for
        # every such extern (an attention mask HF's graph makes once and every layer's attention
        # reads was otherwise computed again for each layer). The value is held so its id stays its own.
        self._extern_inputs: dict[tuple[int, Layout], tuple[TensorValue, Buffer]] = {}

    def _new_name(self) -> str:
        return f"buf{next(self._names)}"

    def realize(self, value: TensorValue, layout: Layout | None = None) -> Buffer:
        if value.buffer is not None and layout is None:
            return value.buffer
        buffer = Buffer(self._new_name(), layout or Layout.contiguous(value.size, value.dtype))
        self.program.steps.append(ComputeStep(buffer, Pointwise(value.dtype, value.size, value.loader, name=buffer.name)))
        return buffer

    def _extern_arg(self, value: TensorValue, meta: Any = None, shared: bool = False) -> Buffer:
        # A strided view of a buffer reaches an extern as a view (as_strided), not as a copy;
        # a value computed for the extern is written in eager's layout of that argument.
        # (Symbolic sizes, strides and offsets are computed at each call from the inputs' sizes:
        # a growing KV cache's first L+1 rows, viewed in its buffer.)
        if value.buffer is None and value.strided is not None:
            base, layout = value.strided
            view = Buffer(self._new_name(), layout)
            size, stride = [_int_or_expr(v) for v in layout.size], [_int_or_expr(v) for v in layout.stride]
            self.program.steps.append(ExternStep(
                [view], torch.ops.aten.as_strided.default, (base, size, stride, _int_or_expr(layout.offset)), {}))
            return view
        if value.buffer is None:
            layout = argument_layout(meta, value.size, value.dtype)
            key = (id(value), layout)
            if shared and key in self._extern_inputs:
                return self._extern_inputs[key][1]
            buffer = self.realize(value, layout)
            if shared:
                self._extern_inputs[key] = (value, buffer)
            return buffer
        return value.buffer

    def _realize_args(self, tree: Any, metas: Any = None, shared: bool = False) -> Any:
        """Buffers for the tensors of an extern's arguments; `metas` are the fx arguments, whose
        fake values give eager's layouts. `shared`: the extern writes none of them, so a value
        another such extern read is read from the same buffer."""
        leaves, spec = pytree.tree_flatten(tree)
        meta_leaves = pytree.tree_leaves(pytree.tree_map_only(fx.Node, lambda n: n.meta.get("val"), metas))
        if len(meta_leaves) != len(leaves):
            meta_leaves = [None] * len(leaves)
        return pytree.tree_unflatten(
            [self._extern_arg(v, m, shared) if isinstance(v, TensorValue) else v for v, m in zip(leaves, meta_leaves)], spec)

    def _extern(self, node: fx.Node, args: tuple, kwargs: dict) -> Any:
        vals = node.meta.get("val")  # (none for an op that returns nothing: aten._assert_scalar)
        multiple = isinstance(vals, (tuple, list))
        vals = list(vals) if multiple else [vals]
        shared = not _writes_arguments(node.target)
        args = self._realize_args(args, argument_metas(node), shared)
        kwargs = self._realize_args(kwargs, node.kwargs, shared)
        real = output_layouts(node.target, args, kwargs)
        layouts = real if real is not None and len(real) == len(vals) else [None] * len(vals)
        outs = [Buffer(self._new_name(), layout or layout_of(v)) if isinstance(v, torch.Tensor) else None
                for v, layout in zip(vals, layouts)]
        self.program.steps.append(ExternStep(outs, node.target, args, kwargs))
        values = [TensorValue.of_buffer(b) if b is not None else None for b in outs]
        return tuple(values) if multiple else values[0]

    def _call(self, node: fx.Node, args: tuple, kwargs: dict) -> Any:
        lowering = LOWERINGS.get(node.target)
        lowerable = not _has_complex(node, args, kwargs) and not _has_data_dependent_sizes(node, args, kwargs)
        if lowering is not None and lowerable:
            mark = len(self.program.steps)
            try:
                result = lowering(*args, **kwargs)
            except NotImplementedError:
                # A lowering may have realized values before it declined; the extern replaces them.
                del self.program.steps[mark:]
                result = None
            if result is not None:
                # A multi-output op returns a tuple; any reduction in it is realized here.
                return pytree.tree_map_only(ReductionResult, self.finish, result)
        return self._extern(node, args, kwargs)

    def finish(self, result: ReductionResult) -> TensorValue:
        """A reduction realized into a buffer, viewed at eager's size, then its `then` step."""
        value = TensorValue.of_buffer(self.realize_reduction(result))
        if [*value.size] != [*result.size]:
            value = _views.view(value, result.size)
        return result.then(value) if result.then else value

    def realize_reduction(self, result: ReductionResult) -> Buffer:
        return self.realize_node(result.node)

    def realize_node(self, node: Node) -> Buffer:
        """A node (a reduction, a scatter) computed into a new contiguous buffer of its own."""
        buffer = Buffer(self._new_name(), Layout.contiguous(node.ranges, node.dtype))
        node.name = buffer.name
        self.program.steps.append(ComputeStep(buffer, node))
        return buffer

    def _constant(self, value: Any) -> Any:
        # A tensor held by the graph module: an extern aliasing it gives it a buffer, uncopied.
        if not isinstance(value, torch.Tensor):
            return value
        buffer = Buffer(self._new_name(), layout_of(value))
        self.program.steps.append(ExternStep([buffer], torch.ops.aten.alias.default, (value,), {}))
        return TensorValue.of_buffer(buffer)

    def _output(self, value: Any, meta: Any, node: Any) -> Any:
        """A graph output as a buffer: a view of a buffer already laid out as eager's output is
        returned as that view (a transposed weight gradient, say), anything else is computed
        into a buffer with eager's layout. An output made by an op that returns a new tensor is
        one, even where it holds an input's elements (`x.clone()` lowers to `x` itself): handed
        back as the input, a write into it would change the caller's tensor. (An input returned
        as it is, a tensor saved for the backward, and views stay as they are.)"""
        if not isinstance(value, TensorValue):
            return value
        base = value.buffer if value.buffer is not None else value.strided[0] if value.strided is not None else None
        if base is not None and base in self.program.inputs and _makes_new_tensor(node):
            value = TensorValue(value.size, value.dtype, value.loader)  # a loader only: realized below
        elif value.buffer is not None:
            return value.buffer
        layout = layout_of(meta) if isinstance(meta, torch.Tensor) else None
        if layout is not None and value.strided is not None and value.strided[1] == layout:
            return self._extern_arg(value)
        return self.realize(value, layout)

    def lower(self) -> Program:
        with lowering_graph(self):
            return self._lower()

    def _lower(self) -> Program:
        env: dict[fx.Node, Any] = {}
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                val = node.meta.get("val")
                if isinstance(val, torch.Tensor):
                    buffer = Buffer(node.name, layout_of(val))
                    self.program.inputs.append(buffer)
                    if node.meta.get(WRITTEN_BACK_FROM) is not None:
                        self.written_back_inputs.add(buffer.name)
                    env[node] = TensorValue.of_buffer(buffer)
                else:
                    env[node] = size_expr(val)
                    if is_size_symbol(env[node]):
                        self.program.size_inputs[len(self.program.inputs)] = env[node]
                    self.program.inputs.append(None)
            elif node.op == "get_attr":
                env[node] = self._constant(operator.attrgetter(node.target)(self.gm))
            elif node.op == "call_function" and (size := _input_size(node)) is not None:
                # A size computed from the inputs' sizes (sym_size, arithmetic on them): its expression.
                env[node] = size
            elif node.op == "call_function":
                args, kwargs = pytree.tree_map_only(fx.Node, env.__getitem__, (node.args, node.kwargs))
                env[node] = args[0][args[1]] if node.target is operator.getitem else self._call(node, args, kwargs)
                env[node] = _with_traced_sizes(env[node], node.meta.get("val"))
                if should_realize(node, env[node]):
                    # In eager's layout when that is dense: a channels-last stream stays channels-last.
                    layout = argument_layout(node.meta.get("val"), env[node].size, env[node].dtype)
                    env[node] = TensorValue.of_buffer(self.realize(env[node], layout))
            elif node.op == "output":
                outs = pytree.tree_map_only(fx.Node, env.__getitem__, node.args[0])
                nodes = pytree.tree_leaves(node.args[0])
                metas = [n.meta.get("val") if isinstance(n, fx.Node) else None for n in nodes]
                leaves = pytree.tree_leaves(outs)
                self.program.outputs = [self._output(v, m, n) for v, m, n in zip(leaves, metas, nodes)]
        self.program.written_back = self._written_back()
        return self.program

    def _written_back(self) -> dict[str, str]:
        """Outputs that are mutated inputs' new values, computed by this graph -> the input."""
        found = {}
        for node in self.gm.graph.nodes:
            position = node.meta.get(WRITTEN_BACK_FROM) if node.op == "placeholder" else None
            if position is None or position >= len(self.program.outputs):
                continue
            out = self.program.outputs[position]
            # (Not an output the caller also receives: it would then be the input itself.)
            returned = sum(isinstance(o, Buffer) and o.name == getattr(out, "name", None) for o in self.program.outputs)
            if isinstance(out, Buffer) and out.name != node.name and returned == 1:
                found[out.name] = node.name
        return found


def _int_or_expr(value: Any) -> Any:
    """A layout entry as an extern's argument: an int where it is one, else its size expression."""
    value = sympy.sympify(value)
    return int(value) if value.is_Integer else value
