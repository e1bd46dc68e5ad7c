"""Handlers that read a loop body without computing it: op counts, buffer reads, a printout.

Each runs the body once on symbolic values; what the ops return is only a name that later ops
take as an argument.
"""

from __future__ import annotations

import collections
import functools
from typing import Any

import sympy

from kiln.ir.nodes import Node
from kiln.ir.ops import ALL_OPS, use_handler


class _Value(str):
    """What an op returns under an analysis handler: the name of its result."""


class _Recorder:
    """Answers every op of the protocol by calling `self.record(name, args)`."""

    def __init__(self) -> None:
        self._count = 0

    def __getattr__(self, name: str) -> Any:
        if name in ALL_OPS:
            return functools.partial(self._dispatch, name)
        raise AttributeError(name)

    def _dispatch(self, name: str, *args: Any) -> Any:
        value = _Value(f"tmp{self._count}")
        self._count += 1
        self.record(name, args, value)
        if name == "indirect_indexing":  # an index symbol, so later index arithmetic works on it
            return sympy.Symbol(f"ind{self._count - 1}", integer=True)
        return value

    def record(self, name: str, args: tuple, value: _Value) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class OpCounter(_Recorder):
    """How many times each op runs per element: `counts["exp"]`."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def record(self, name: str, args: tuple, value: _Value) -> None:
        self.counts[name] += 1


class ReadsWrites(_Recorder):
    """The (buffer, index expression) pairs a body loads and stores: the node's dependencies."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[str, sympy.Expr]] = []
        self.writes: list[tuple[str, sympy.Expr]] = []
        self.index_exprs: list[sympy.Expr] = []

    def record(self, name: str, args: tuple, value: _Value) -> None:
        if name == "load":
            self.reads.append((args[0], sympy.sympify(args[1])))
        elif name == "store":
            self.writes.append((args[0], sympy.sympify(args[1])))
        elif name == "index_expr":
            self.index_exprs.append(sympy.sympify(args[0]))

    @property
    def buffers_read(self) -> list[str]:
        return list(dict.fromkeys(buffer for buffer, _ in self.reads))


def _arg(a: Any) -> str:
    return str(a).replace("torch.", "") if not isinstance(a, str) or isinstance(a, _Value) else repr(a)


class IRPrinter(_Recorder):
    """One line per op, `tmp3 = exp(tmp2)`: how a loop body reads in dumps and tests."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def record(self, name: str, args: tuple, value: _Value) -> None:
        self.lines.append(f"{value} = {name}({', '.join(_arg(a) for a in args)})")


def run(handler: _Recorder, node: Node) -> Any:
    """Run `node`'s body once under `handler` and return the handler."""
    with use_handler(handler):
        handler.result = node.body()
    return handler


def format_node(node: Node) -> str:
    """A readable listing of a node: its kind, ranges and body."""
    printer = run(IRPrinter(), node)
    kind = type(node).__name__
    ranges = f"ranges={list(node.ranges)}"
    if kind == "Reduction":
        ranges += f", reduction_ranges={list(node.reduction_ranges)}, {node.reduction_type}"
    if kind == "Scatter":
        ranges += f", source_ranges={list(node.source_ranges)}, mode={node.mode}"
    header = f"{node.name or kind}: {kind}({str(node.dtype).replace('torch.', '')}, {ranges})"
    return "\n".join([header, *(f"  {line}" for line in printer.lines), f"  return {printer.result}"])
