"""A matcher for ATen fx graphs: a pattern is a tree of `Op`s whose leaves capture values.

    x, w = Var("x"), Var("w", frozen)
    conv = Op(aten.convolution.default, x, w, None, ...)
    relu_of_conv = Op(aten.relu.default, conv)
    for node, found in matches(gm, relu_of_conv):
        found["x"], found["w"]            # the fx nodes (or literals) bound to each Var

Arguments are compared in schema order, with keyword arguments and schema defaults filled in, so
`add(a, b)` and `add(a, b, alpha=1)` match the same pattern. An `Op` inside a pattern (not the
root) must have no user outside the match: its value disappears when the match is rewritten.
`Ellipsis` (`...`) in an `Op`'s arguments matches everything from there on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from torch import fx


@dataclass(frozen=True)
class Var:
    """Matches any argument that `where` accepts, and binds it to `name` (the same name twice must
    bind the same value)."""

    name: str
    where: Callable[[Any], bool] | None = None


@dataclass(frozen=True)
class Op:
    """Matches a call_function node of one of `targets` whose arguments match `args`.

    `name` binds the matched node itself; `commutative` tries the first two arguments both ways.
    """

    targets: Any
    args: tuple = ()
    name: str | None = None
    commutative: bool = False

    def __init__(self, targets: Any, *args: Any, name: str | None = None, commutative: bool = False) -> None:
        object.__setattr__(self, "targets", tuple(targets) if isinstance(targets, (tuple, list, set)) else (targets,))
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "commutative", commutative)


@dataclass
class Match:
    """What a pattern bound, and the nodes it covered (the root first)."""

    bindings: dict[str, Any] = field(default_factory=dict)
    nodes: list[fx.Node] = field(default_factory=list)

    def __getitem__(self, name: str) -> Any:
        return self.bindings[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.bindings.get(name, default)


def arguments(node: fx.Node) -> list[Any]:
    """`node`'s arguments in schema order, keywords and defaults filled in."""
    return [value for value, _ in _arguments_and_defaults(node)]


_NO_DEFAULT = object()


def _arguments_and_defaults(node: fx.Node) -> list[tuple[Any, Any]]:
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return [(a, _NO_DEFAULT) for a in node.args]
    pairs = []
    for i, argument in enumerate(schema.arguments):
        default = argument.default_value if argument.has_default_value() else _NO_DEFAULT
        if i < len(node.args):
            pairs.append((node.args[i], default))
        elif argument.name in node.kwargs:
            pairs.append((node.kwargs[argument.name], default))
        else:
            pairs.append((None if default is _NO_DEFAULT else default, default))
    return pairs


def _bind(match: Match, name: str, value: Any) -> bool:
    if name in match.bindings:
        return match.bindings[name] is value or (not isinstance(value, fx.Node) and match.bindings[name] == value)
    match.bindings[name] = value
    return True


def _match_value(pattern: Any, value: Any, match: Match, root: bool) -> bool:
    if isinstance(pattern, Var):
        return (pattern.where is None or pattern.where(value)) and _bind(match, pattern.name, value)
    if isinstance(pattern, Op):
        return isinstance(value, fx.Node) and _match_op(pattern, value, match, root)
    if isinstance(pattern, (list, tuple)) and isinstance(value, (list, tuple)):
        return len(pattern) == len(value) and all(_match_value(p, v, match, False) for p, v in zip(pattern, value))
    return not isinstance(value, fx.Node) and pattern == value


def _match_args(patterns: tuple, pairs: list[tuple[Any, Any]], match: Match) -> bool:
    """Arguments a pattern leaves out (without `...`) must hold their schema defaults."""
    if patterns and patterns[-1] is Ellipsis:
        patterns, pairs = patterns[:-1], pairs[: len(patterns) - 1]
    if len(pairs) < len(patterns):
        return False
    if any(isinstance(v, fx.Node) or v != d for v, d in pairs[len(patterns):]):
        return False
    return all(_match_value(p, v, match, False) for p, (v, _) in zip(patterns, pairs))


def _match_op(pattern: Op, node: fx.Node, match: Match, root: bool) -> bool:
    if node.op != "call_function" or node.target not in pattern.targets:
        return False
    if not root and len(node.users) != 1:
        return False  # its value is used elsewhere: it cannot be folded into the match
    pairs = _arguments_and_defaults(node)
    orders = [pairs]
    if pattern.commutative and len(pairs) >= 2:
        orders.append([(pairs[1][0], pairs[0][1]), (pairs[0][0], pairs[1][1]), *pairs[2:]])
    for order in orders:
        trial = Match(dict(match.bindings), list(match.nodes))
        if _match_args(pattern.args, order, trial) and (pattern.name is None or _bind(trial, pattern.name, node)):
            match.bindings, match.nodes = trial.bindings, [*trial.nodes, node]
            return True
    return False


def match(pattern: Op, node: fx.Node) -> Match | None:
    """The bindings of `pattern` rooted at `node`, or None."""
    found = Match()
    if not _match_op(pattern, node, found, root=True):
        return None
    found.nodes.reverse()  # the root first, then its operands
    return found


def matches(gm: fx.GraphModule, pattern: Op) -> Iterator[tuple[fx.Node, Match]]:
    """Every node of `gm` where `pattern` matches, in graph order; safe to rewrite while iterating
    (erased nodes are skipped)."""
    for node in list(gm.graph.nodes):
        if node.graph is not gm.graph or getattr(node, "_erased", False):
            continue
        found = match(pattern, node)
        if found is not None:
            yield node, found


def _fake_mode(values: list[Any]) -> Any:
    for value in values:
        mode = getattr(value, "fake_mode", None)
        if mode is not None:
            return mode
    raise ValueError("no fake tensor among the operands: cannot compute the new node's meta value")


def insert(gm: fx.GraphModule, before: fx.Node, target: Any, *args: Any, **kwargs: Any) -> fx.Node:
    """A new call of `target` before `before`, its `meta["val"]` computed on the operands' fake
    values (so later passes and the lowering see its shape, dtype and strides). Keyword
    arguments are plain values (`dtype=`) or nodes (a keyword-only tensor: `attn_mask=`)."""
    vals = [a.meta.get("val") if isinstance(a, fx.Node) else a for a in args]
    vals = [[v.meta.get("val") if isinstance(v, fx.Node) else v for v in a] if isinstance(a, (list, tuple)) else a
            for a in vals]
    kwarg_vals = {k: v.meta.get("val") if isinstance(v, fx.Node) else v for k, v in kwargs.items()}
    with gm.graph.inserting_before(before):
        node = gm.graph.call_function(target, tuple(args), kwargs)
    leaves = [v for a in [*vals, *kwarg_vals.values()] for v in (a if isinstance(a, list) else [a])]
    with _fake_mode(leaves):
        node.meta["val"] = target(*vals, **kwarg_vals)
    return node


def replace(gm: fx.GraphModule, node: fx.Node, target: Any, *args: Any) -> fx.Node:
    """A call of `target` in place of `node`, whose users move to it; nodes of the match left
    without users are removed."""
    new = insert(gm, node, target, *args)
    node.replace_all_uses_with(new)
    remove_dead(gm, [node])
    return new


def remove_dead(gm: fx.GraphModule, nodes: list[fx.Node]) -> None:
    """Erase `nodes` and, transitively, operands they leave without users (never placeholders)."""
    pending = list(nodes)
    while pending:
        node = pending.pop()
        if node.op in ("placeholder", "output") or node.users or getattr(node, "_erased", False):
            continue
        operands = [n for n in node.all_input_nodes]
        gm.graph.erase_node(node)
        pending.extend(operands)
