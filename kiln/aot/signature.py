"""What a function does to its inputs and how its outputs alias, learned from one fake-tensor run.

The traced graph is functional, so these facts are recorded beside it: which inputs the function
mutates (the runtime copies new values back), and which outputs are views of an input or of
another output (the runtime hands them back as views, as eager does).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import sympy
import torch
from torch import fx
from torch._prims_common import make_contiguous_strides_for
from torch.fx.experimental.symbolic_shapes import statically_known_true
from torch.multiprocessing.reductions import StorageWeakRef

from kiln.aot.functional import functional_mode, has_data_mutation, has_metadata_mutation, to_functional
from kiln.ir.graph_meta import WRITTEN_BACK_FROM


class UnsupportedByAot(RuntimeError):
    """A construct the AOT layer does not handle; the caller runs the graph eagerly instead."""


@dataclass(frozen=True)
class Alias:
    """Output `k` is a view of input or output `base`, with this layout inside the base's storage."""

    of: str  # "input" or "output"
    base: int
    same_tensor: bool  # the output is the base object itself (e.g. `return x.add_(1)`)
    size: tuple[Any, ...]
    stride: tuple[Any, ...]
    storage_offset: Any
    retyped: bool = False  # the output views the base's memory as another dtype (`x.view(torch.float32)`)


def _dense(size: tuple[Any, ...], stride: tuple[Any, ...]) -> bool:
    """Every element stored once, none skipped (a permutation of a contiguous layout)."""
    if not all(isinstance(v, int) for v in (*size, *stride)):
        return False  # symbolic: callers fall back to contiguous, which is always dense
    expected = 1
    for st, sz in sorted((st, sz) for sz, st in zip(size, stride) if sz != 1):
        if st != expected:
            return False
        expected *= sz
    return True


@dataclass(frozen=True)
class TensorMeta:
    size: tuple[Any, ...]
    stride: tuple[Any, ...]
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, t: torch.Tensor) -> "TensorMeta":
        return cls(tuple(t.size()), tuple(t.stride()), t.dtype, t.device)

    def empty(self) -> torch.Tensor:
        return torch.empty_strided(self.size, self.stride, dtype=self.dtype, device=self.device)

    def for_gradient(self) -> "TensorMeta":
        """The layout a gradient of this output gets: the output's own, unless that layout has
        overlapping or missing elements (e.g. an `expand`), where a gradient needs every element."""
        if _dense(self.size, self.stride):
            return self
        return TensorMeta(self.size, tuple(make_contiguous_strides_for(self.size)), self.dtype, self.device)


@dataclass
class Signature:
    num_inputs: int
    mutated_inputs: list[int] = field(default_factory=list)
    aliases: dict[int, Alias] = field(default_factory=dict)  # output index -> alias
    output_requires_grad: list[bool] = field(default_factory=list)
    output_is_tensor: list[bool] = field(default_factory=list)
    output_metas: list[TensorMeta | None] = field(default_factory=list)
    # Each input's sizes as traced (SymInts where symbolic), or the input itself when not a tensor:
    # how an alias's symbolic layout is evaluated at each call (kiln/aot/call_wrappers.py).
    input_sizes: list[Any] = field(default_factory=list)
    # Inputs the backward graph gives no gradient (`e` used only as `e.detach()`): detached before
    # the forward, so that a backward never reaches the graph that made them (kiln/aot/call_wrappers.py).
    inputs_without_gradient: list[int] = field(default_factory=list)

    @property
    def num_outputs(self) -> int:
        return len(self.output_is_tensor)

    @property
    def portable(self) -> bool:
        """No SymInt left: what the AOT graph cache stores and loads (see __getstate__)."""
        return not any(isinstance(v, torch.SymInt) for v in _leaves(self.__dict__))

    def __getstate__(self) -> dict[str, Any]:
        # SymInts belong to one process's shape environment and do not pickle; their sympy
        # expressions over the capture's size symbols do, and are all the runtime evaluates
        # (kiln/aot/call_wrappers.py). Tracing needs the SymInts: a loaded signature is re-made
        # before a trace (kiln/aot/compile.py).
        state = dict(self.__dict__)
        state["input_sizes"] = [_portable(v) for v in self.input_sizes]
        state["aliases"] = {k: Alias(a.of, a.base, a.same_tensor, _portable(a.size), _portable(a.stride),
                                     _portable(a.storage_offset), a.retyped) for k, a in self.aliases.items()}
        state["output_metas"] = [m if m is None else TensorMeta(_portable(m.size), _portable(m.stride), m.dtype, m.device)
                                 for m in self.output_metas]
        return state

    def describe(self) -> str:
        lines = [f"inputs: {self.num_inputs}, outputs: {self.num_outputs}"]
        if self.mutated_inputs:
            lines.append(f"mutated inputs (copied back after each call): {self.mutated_inputs}")
        for k, a in self.aliases.items():
            lines.append(f"output {k} is a view of {a.of} {a.base}" + (" (the same tensor)" if a.same_tensor else ""))
        return "\n".join(lines)


def _portable(value: Any) -> Any:
    """`value` with each SymInt replaced by its integer or its sympy expression."""
    if isinstance(value, tuple):
        return tuple(_portable(v) for v in value)
    if isinstance(value, torch.SymInt):
        expr = sympy.sympify(value.node.expr)
        return int(expr) if expr.is_Integer else expr
    return value


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _leaves(v)]
    if isinstance(value, (Alias, TensorMeta)):
        return _leaves(tuple(value.__dict__.values()))
    return [value]


def _fresh(value: Any) -> Any:
    # A copy with the same metadata, so the analysis run may mutate it freely.
    if not isinstance(value, torch.Tensor):
        return value
    copy = torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device=value.device)
    # A scalar tensor Dynamo made from a Python float knows its value as a symbol; keep that.
    if getattr(value, "item_memo", None) is not None:
        copy.item_memo = value.item_memo
    return copy.requires_grad_(value.requires_grad)


def _storage(t: torch.Tensor) -> StorageWeakRef:
    return StorageWeakRef(t.untyped_storage())


def _grad_mode(args: Sequence[Any]) -> Any:
    return torch.enable_grad() if any(getattr(a, "requires_grad", False) for a in args) else torch.no_grad()


def _untraced(fake_mode: Any) -> Any:
    # Analysis runs are not traced: data-dependent symbols they create (`.item()`) must not be
    # left pending for the tracer that runs next.
    env = fake_mode.shape_env
    return env.ignore_fresh_unbacked_symbols() if env is not None else contextlib.nullcontext()


def _mutated_inputs(fn: Callable[..., Sequence[Any]], fake_args: Sequence[Any], fake_mode: Any) -> list[int]:
    # Functionalization sees every write, including those that version counters miss (ops whose
    # C++ schema does not declare the mutation).
    with fake_mode, _untraced(fake_mode):
        args = [_fresh(a) for a in fake_args]
        with _grad_mode(args), functional_mode():
            wrapped = [to_functional(a) for a in args]
            fn(*wrapped)
            for i, w in enumerate(wrapped):
                if has_metadata_mutation(w):
                    raise UnsupportedByAot(f"input {i} has its shape or strides changed in place (e.g. resize_, t_)")
            return [i for i, w in enumerate(wrapped) if has_data_mutation(w)]


def analyze(fn: Callable[..., Sequence[Any]], fake_args: Sequence[Any], fake_mode: Any) -> Signature:
    """Run `fn` on fake copies of `fake_args` and record mutations and output aliasing."""
    sig = Signature(num_inputs=len(fake_args), mutated_inputs=_mutated_inputs(fn, fake_args, fake_mode))
    sig.input_sizes = [tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in fake_args]
    with fake_mode, _untraced(fake_mode):
        args = [_fresh(a) for a in fake_args]
        with _grad_mode(args):
            outputs = list(fn(*args))
    input_storages = {_storage(a): i for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
    # Outputs viewing one intermediate become views of the output that holds that whole storage:
    # a compiled graph returns each output in its own buffer, so a part (y[:1]) cannot be the base
    # of another part (y.expand(...)). Without such an output they stay separate tensors.
    output_storages: dict[StorageWeakRef, int] = {}
    for k, out in enumerate(outputs):
        if isinstance(out, torch.Tensor) and _storage(out) not in input_storages and _holds_storage(out):
            output_storages.setdefault(_storage(out), k)
    for k, out in enumerate(outputs):
        is_tensor = isinstance(out, torch.Tensor)
        sig.output_is_tensor.append(is_tensor)
        sig.output_requires_grad.append(bool(is_tensor and out.requires_grad))
        sig.output_metas.append(TensorMeta.of(out) if is_tensor else None)
        if not is_tensor:
            continue
        storage = _storage(out)
        layout = (tuple(out.size()), tuple(out.stride()), out.storage_offset())
        if storage in input_storages:
            base = input_storages[storage]
            sig.aliases[k] = Alias("input", base, out is args[base], *layout, out.dtype != args[base].dtype)
        elif output_storages.get(storage, k) != k:
            base = output_storages[storage]
            sig.aliases[k] = Alias("output", base, out is outputs[base], *layout, out.dtype != outputs[base].dtype)
    return sig


def _holds_storage(t: torch.Tensor) -> bool:
    """`t` covers its whole storage, each element once (so a graph's output buffer can stand for it)."""
    nbytes = t.untyped_storage().nbytes()
    return (_dense(tuple(t.size()), tuple(t.stride())) and statically_known_true(t.storage_offset() == 0)
            and statically_known_true(nbytes == t.numel() * t.element_size()))


def size_symbol_positions(sig: Signature) -> dict[Any, tuple[int, int | None]]:
    """Each symbol an input's size (or an integer input) is -> (input, dim; None for an integer):
    where the call wrapper reads it at each call."""
    where: dict[Any, tuple[int, int | None]] = {}
    for i, traced in enumerate(sig.input_sizes):
        pairs = enumerate(traced) if isinstance(traced, tuple) else [(None, traced)]
        for d, size in pairs:
            expr = traced_expr(size)
            if isinstance(expr, sympy.Symbol):
                where.setdefault(expr, (i, d))
    return where


def traced_expr(value: Any) -> Any:
    """A traced size as sympy: a SymInt's expression (in the tracing process) or the expression
    itself (a signature loaded from the AOT graph cache); an integer stays one."""
    return sympy.sympify(value.node.expr) if isinstance(value, torch.SymInt) else value


def view_from_base(sig: Signature, k: int) -> bool:
    """Whether output `k` views an input (not the input itself) with a layout made of integers
    and the inputs' size symbols: the call wrapper can make it from the input without the graph."""
    alias = sig.aliases.get(k)
    if alias is None or alias.of != "input" or alias.same_tensor:
        return False
    given = size_symbol_positions(sig).keys()
    return all(sympy.sympify(traced_expr(v)).free_symbols <= given for v in (*alias.size, *alias.stride, alias.storage_offset))


def mark_written_back(gm: fx.GraphModule, sig: Signature) -> None:
    """Mark each mutated input's placeholder of an inference graph `(*args) -> (*outputs, *new
    values of the mutated inputs)` with the position of its new value (graph_meta.WRITTEN_BACK_FROM):
    the backend may compute it in the input's memory, and the copy back is then no copy."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for j, i in enumerate(sig.mutated_inputs):
        placeholders[i].meta[WRITTEN_BACK_FROM] = sig.num_outputs + j
