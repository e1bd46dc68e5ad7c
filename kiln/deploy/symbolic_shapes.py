"""An exported graph's symbolic sizes as an artifact states them: each input's shape with symbol
names where it is symbolic, and each symbol's range.

`kiln.export(..., dynamic_shapes=...)` marks the declared dimensions dynamic before the capture;
the capture's ShapeEnv then says what the graph assumed of them. An artifact can only state
assumptions its loaders check without Python — a size, a symbol shared by several dimensions (the
trace found them equal), a symbol's range — so every other guard (a divisibility, a relation of two
symbols) refuses the export, naming it, as does a declared dimension the model specialized to a
number. Sizes 0 and 1 are specialized by the capture (as Dynamo's are): a range starts at 2 at the
lowest.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch
from torch.utils._sympy.numbers import int_oo


def shapes_and_ranges(recorded: dict[str, Any], names: list[str], inputs: list[torch.Tensor],
                      declared: dict[tuple[int, int], Any]) -> tuple[list[list[int | str]], dict[str, dict]]:
    """(each input's shape: an int or a symbol's name per dimension, {symbol name: {"min", "max"}}).
    `declared`: (input index, dim) -> torch.export.Dim or a name."""
    from kiln.deploy.export import ExportError

    fakes = _input_fakes(recorded, inputs)
    shape_env = next((f.fake_mode.shape_env for f in fakes if f is not None and f.fake_mode.shape_env is not None), None)
    names_of: dict[sympy.Symbol, str] = {}  # the graph's symbol -> the artifact's name for it
    wanted: dict[str, tuple[int, int | None]] = {}  # artifact symbol -> the range the caller declared
    shapes: list[list[int | str]] = []
    for k, (name, tensor, fake) in enumerate(zip(names, inputs, fakes)):
        shape: list[int | str] = []
        for d in range(tensor.dim()):
            size = fake.shape[d] if fake is not None else tensor.shape[d]
            dim = declared.get((k, d))
            if isinstance(size, torch.SymInt) and shape_env.simplify(size.node.expr).is_Integer:
                size = int(shape_env.simplify(size.node.expr))  # symbolic, then specialized by the trace
            if not isinstance(size, torch.SymInt):
                if dim is not None:
                    raise ExportError(f"kiln.export: the model specializes dimension {d} of input {name!r} to "
                                      f"{int(size)} (dynamic_shapes declares it {_label(dim)}): an operation needs "
                                      "that exact size; export it static or change the model")
                shape.append(int(size))
                continue
            expr = shape_env.simplify(size.node.expr)
            if not isinstance(expr, sympy.Symbol):
                raise ExportError(f"kiln.export: dimension {d} of input {name!r} came out as {expr}, which an "
                                  "artifact cannot state (only sizes and symbols)")
            label = _label(dim) if dim is not None else f"{name}_dim{d}"
            if expr in names_of and dim is not None and names_of[expr] != label and names_of[expr] in wanted:
                raise ExportError(f"kiln.export: the model needs dimension {d} of input {name!r} ({label}) equal to "
                                  f"{names_of[expr]}: declare both with one Dim")
            names_of.setdefault(expr, label)
            if dim is not None:
                wanted.setdefault(names_of[expr], _declared_range(dim))
            shape.append(names_of[expr])
        shapes.append(shape)
    symbols = {}
    for symbol, label in names_of.items():
        bounds = shape_env.var_to_range[symbol]
        low, high = int(bounds.lower), None if bounds.upper in (int_oo, sympy.oo) else int(bounds.upper)
        if label in wanted:
            want_low, want_high = wanted[label]
            if low > want_low or high is not None and (want_high is None or high < want_high):
                raise ExportError(f"kiln.export: the model serves {label} only in [{low}, {_bound(high)}], narrower "
                                  f"than dynamic_shapes declares ([{want_low}, {_bound(want_high)}])")
            low, high = want_low, want_high
        symbols[label] = {"min": low, "max": high}
    _check_guards(shape_env, names_of)
    return shapes, symbols


def _input_fakes(recorded: dict[str, Any], inputs: list[torch.Tensor]) -> list[Any]:
    """Each user input's fake value in the captured graph (None for an input the graph never read)."""
    placeholders = [n for n in recorded["gm"].graph.nodes if n.op == "placeholder"]
    by_identity = {id(t): placeholders[j].meta.get("example_value") for j, t in enumerate(recorded["example_inputs"])
                   if j < len(placeholders)}
    return [by_identity.get(id(t)) for t in inputs]


def _check_guards(shape_env: Any, names_of: dict[sympy.Symbol, str]) -> None:
    """Every guard of the trace must be a symbol's bound (its range says it) or already true."""
    from kiln.deploy.export import ExportError

    if shape_env is None:
        return
    for guard in shape_env.guards:
        expr = shape_env.simplify(guard.expr)
        if expr == sympy.true:
            continue
        free = expr.free_symbols
        if isinstance(expr, sympy.Rel) and len(free) == 1 and (expr.lhs in free or expr.rhs in free) \
                and (expr.lhs.is_number or expr.rhs.is_number):
            continue  # a bound: the range holds it
        named = expr.xreplace({s: sympy.Symbol(names_of.get(s, str(s))) for s in free})
        raise ExportError(f"kiln.export: the model's graph assumes {named}, which an artifact cannot check "
                          "(only each symbol's range and dimensions sharing a symbol); export with those sizes static")


def _bound(high: int | None) -> str:
    return "inf" if high is None else str(high)


def _label(dim: Any) -> str:
    return dim if isinstance(dim, str) else dim.__name__


def _declared_range(dim: Any) -> tuple[int, int | None]:
    if isinstance(dim, str):
        return 2, None
    high = dim.max
    return max(int(dim.min), 2), None if high in (int_oo, sympy.oo) or high is None else int(high)
