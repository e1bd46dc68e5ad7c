"""`torch.cond(pred, true_fn, false_fn, operands)` kept in the graph, as a higher-order op.

A predicate known while capturing (a Python bool, a constant) runs its branch inline, as Python
would. A tensor predicate (or a symbolic bool) keeps both branches: each is traced into a graph of
its own by the same interpreter (kiln's rules for any inlined call), and the captured graph calls
`torch.ops.higher_order.cond(pred, true_graph, false_graph, operands)` on them, as Dynamo's graphs
do, so whichever branch the data chooses runs when the graph runs.

Tensors a branch reads besides its operands (a closure's, a module's parameters, an input the
frame read elsewhere) become extra operands of both branches. A branch that would change anything
outside itself (a list, an object's attribute, a global, a closure cell) cannot be kept: a change
made by the branch that does not run must not happen; nor one that kiln cannot capture (a graph
break inside it). Either makes the `torch.cond` call a graph break, where it runs eagerly.

Example::

    def f(x):
        return torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))

    kiln.compile(f, fullgraph=True)(torch.randn(4))   # one graph, one cond node
"""

from __future__ import annotations

import inspect
import operator
from typing import Any, Sequence

import torch
from torch import fx

from kiln.capture.break_records import unsupported
from kiln.capture.variables.base import Variable
from kiln.capture.variables.containers import ListVariable, TupleVariable
from kiln.capture.variables.symbolic import SymNodeVariable
from kiln.capture.variables.tensor import TensorVariable

_COND_SIGNATURE = inspect.signature(lambda pred, true_fn, false_fn, operands=(): None)


class CondVariable(Variable):
    """`torch.cond` (also reached as `functorch.experimental.control_flow.cond`), or the op
    `torch.ops.higher_order.cond` called directly."""

    def python_type(self) -> type:
        return type(torch.cond)

    def describe(self) -> str:
        return "torch.cond"

    def call(self, tx: Any, args: Sequence[Variable], kwargs: dict[str, Variable]) -> Variable:
        try:
            bound = _COND_SIGNATURE.bind(*args, **kwargs)
        except TypeError as error:
            raise unsupported("unsupported_call", f"torch.cond called with {error}", "the graph breaks at this call") from None
        pred, true_fn, false_fn = (bound.arguments[name] for name in ("pred", "true_fn", "false_fn"))
        operands = bound.arguments.get("operands")
        items = operands.iterate(tx) if operands is not None else []
        if pred.is_constant():  # (decided now: the branch Python would take, inline)
            return (true_fn if pred.as_constant() else false_fn).call(tx, items, {})
        if not (isinstance(pred, TensorVariable) or isinstance(pred, SymNodeVariable) and pred.python_type() is bool):
            raise unsupported("unsupported_call", f"torch.cond with a predicate that is {pred.describe()}",
                              "the graph breaks at this call")
        for item in items:
            if not isinstance(item, (TensorVariable, SymNodeVariable)):
                raise unsupported("unsupported_call", f"torch.cond with an operand that is {item.describe()} (kiln keeps "
                                  "tensors and symbolic ints as operands)", "the graph breaks at this call")
        branches = [_Branch.trace(tx, fn, items) for fn in (true_fn, false_fn)]
        if branches[0].structure != branches[1].structure:
            raise unsupported("unsupported_call", "torch.cond whose branches return different structures "
                              f"({branches[0].structure} and {branches[1].structure})", "the graph breaks at this call")
        return _call_cond(tx, pred, items, branches)


class _Branch:
    """One branch traced into its own graph: `graph` takes the operands, then `lifted` (nodes of
    the enclosing graph it reads), and returns the leaves of its result, a tuple."""

    def __init__(self, graph: fx.Graph, lifted: list[fx.Node], structure: Any) -> None:
        self.graph, self.lifted, self.structure = graph, lifted, structure

    @staticmethod
    def trace(tx: Any, fn: Variable, operands: list[Variable]) -> "_Branch":
        output = tx.output
        graph = fx.Graph()
        arguments = []
        for i, operand in enumerate(operands):
            node = graph.placeholder(f"operand{i}")
            node.meta["example_value"] = operand.as_example()
            arguments.append(TensorVariable(node, operand.as_example()) if isinstance(operand, TensorVariable)
                             else SymNodeVariable(node, operand.as_example()))
        with output.tracing_into(graph, "inside a branch of torch.cond"):
            result = fn.call(tx, arguments, {})
        leaves, structure = _leaves(result)
        if any(leaf.node.op == "placeholder" or leaf.node.graph is not graph for leaf in leaves):
            # (as torch.cond refuses: an output that is an input would alias it in one branch only)
            raise unsupported("unsupported_call", "a torch.cond branch returning one of its inputs as it is",
                              "the graph breaks at this call; return a clone")
        graph.output(tuple(leaf.node for leaf in leaves))
        return _Branch(graph, _lift_outer_nodes(graph), structure)


def _leaves(result: Variable) -> tuple[list[TensorVariable], Any]:
    """The tensors a branch returns and how they are arranged: a tensor, or a tuple or list of them."""
    if isinstance(result, TensorVariable):
        return [result], "tensor"
    if isinstance(result, (TupleVariable, ListVariable)) and all(isinstance(i, TensorVariable) for i in result.items):
        return list(result.items), (type(result).__name__, len(result.items))
    raise unsupported("unsupported_call", f"a torch.cond branch returning {result.describe()} (kiln keeps branches "
                      "returning a tensor or a tuple or list of tensors)", "the graph breaks at this call")


def _lift_outer_nodes(graph: fx.Graph) -> list[fx.Node]:
    """Every node of another graph that `graph` reads becomes a placeholder of its own; returns
    those nodes, in order (the enclosing graph passes them)."""
    lifted: dict[fx.Node, fx.Node] = {}
    last = ([n for n in graph.nodes if n.op == "placeholder"] or [None])[-1]
    for node in list(graph.nodes):
        for read in list(node.all_input_nodes):
            if read.graph is graph:
                continue
            if read not in lifted:
                last = lifted[read] = _new_placeholder(graph, last, f"lifted{len(lifted)}", read)
            node.replace_input_with(read, lifted[read])
    return list(lifted)


def _new_placeholder(graph: fx.Graph, after: fx.Node | None, name: str, stands_for: fx.Node) -> fx.Node:
    """A placeholder of `graph` after `after` (first where None), with the example value of the
    node of the enclosing graph it stands for."""
    where = graph.inserting_after(after) if after is not None else graph.inserting_before(next(iter(graph.nodes)))
    with where:
        placeholder = graph.placeholder(name)
    placeholder.meta["example_value"] = stands_for.meta.get("example_value")
    return placeholder


def _call_cond(tx: Any, pred: Variable, operands: list[Variable], branches: list[_Branch]) -> Variable:
    output = tx.output
    lifted = list(dict.fromkeys(branches[0].lifted + branches[1].lifted))
    modules = []
    for branch, stem in zip(branches, ("cond_true", "cond_false")):
        _take_lifted_in_order(branch, lifted)
        modules.append(output.add_subgraph(branch.graph, stem))
    inputs = tuple([o.as_fx_arg() for o in operands] + lifted)
    examples = tuple([o.as_example() for o in operands] + [n.meta.get("example_value") for n in lifted])
    node = output.graph.call_function(torch.ops.higher_order.cond, (pred.as_fx_arg(), modules[0], modules[1], inputs))
    with output.fake_mode:
        result = torch.ops.higher_order.cond(pred.as_example(), *(output.subgraph_module(m) for m in modules), examples)
    output.op_count += 1
    node.meta["example_value"] = result
    leaves = [output.wrap_result(output.graph.call_function(operator.getitem, (node, i)), value) for i, value in enumerate(result)]
    structure = branches[0].structure
    if structure == "tensor":
        return leaves[0]
    return (TupleVariable if structure[0] == "TupleVariable" else ListVariable)(leaves)


def _take_lifted_in_order(branch: _Branch, lifted: list[fx.Node]) -> None:
    """Make the branch's extra placeholders one per node of `lifted`, in that order, after its
    operands (each branch takes every extra operand either branch reads)."""
    placeholders = [n for n in branch.graph.nodes if n.op == "placeholder"]
    operands = len(placeholders) - len(branch.lifted)
    own = dict(zip(branch.lifted, placeholders[operands:]))
    last = placeholders[operands - 1] if operands else None
    for i, node in enumerate(lifted):
        last = _new_placeholder(branch.graph, last, f"extra{i}", node)
        if node in own:  # (the branch's own placeholder for it, replaced by the one in place)
            own[node].replace_all_uses_with(last)
            branch.graph.erase_node(own[node])
    branch.lifted = lifted
