"""The graph being lowered, as a lowering sees it: `realize` puts a value into a buffer.

Most lowerings only build loaders. A few need memory in the middle of their own work: layer norm's
variance reduction reads the mean, which must be a buffer first (a reduction's result exists only
once its loop has run). They call `realize`, which asks the `GraphLowering` that is running them.

    mean = realize(reduce("sum", x, dims, keepdim=True))   # a Reduction, realized, then divided
    centered = pointwise("sub", [x, mean])
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

from kiln.lowering.values import ReductionResult, TensorValue

_graph: contextvars.ContextVar[Any] = contextvars.ContextVar("kiln_graph_lowering", default=None)


@contextlib.contextmanager
def lowering_graph(graph: Any) -> Iterator[Any]:
    """Make `graph` (a GraphLowering) the one `realize` writes to inside the block."""
    token = _graph.set(graph)
    try:
        yield graph
    finally:
        _graph.reset(token)


def realize(value: TensorValue | ReductionResult) -> TensorValue:
    """`value` backed by a buffer of the current graph.

    A TensorValue is computed into a new contiguous buffer (unless it already is one). A
    ReductionResult's node is realized and its `then` step applied, which may leave a pointwise
    value over that buffer: the reduction is in memory, its cheap epilogue stays inlinable.
    """
    graph = _current_graph("realize")
    return graph.finish(value) if isinstance(value, ReductionResult) else TensorValue.of_buffer(graph.realize(value))


def declines(op: str) -> bool:
    """Whether the graph being lowered is for a code generator with no code for `ops.<op>`
    (Triton has none for a few special functions): the lowering then declines, and the ATen op
    is an extern call in the compiled graph, rather than the whole graph running through ATen."""
    graph = _graph.get()
    return graph is not None and op in graph.unprintable


def is_written_back_input(value: TensorValue) -> bool:
    """Whether `value` is a graph input that the graph gives new values (a KV cache written in
    place by the caller's code): a write into part of it is best done in its own memory, where
    the memory plan puts it (kiln/schedule/memory.py), writing only that part."""
    graph = _graph.get()
    return graph is not None and value.buffer is not None and value.buffer.name in graph.written_back_inputs


def realize_node(node: Any) -> TensorValue:
    """A loop-IR node (a `Scatter`, say) computed into a new buffer of the current graph."""
    return TensorValue.of_buffer(_current_graph("realize_node").realize_node(node))


def _current_graph(caller: str) -> Any:
    graph = _graph.get()
    if graph is None:
        raise RuntimeError(f"{caller}() called outside a graph lowering")
    return graph
