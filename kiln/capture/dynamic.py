"""Dynamic shapes: which input dimensions a capture makes symbolic, and the guards that keep it valid.

`kiln.compile(fn, dynamic=None)` (the default) starts with every size static; when a call misses
only because an input's size changed, the next capture makes those dimensions symbolic, so later
sizes reuse it. `dynamic=True` makes every dimension of every input symbolic from the first
capture; `dynamic=False` never does. `kiln.mark_dynamic(tensor, dim)` marks a dimension ahead of
time. Symbolic dimensions are symbols of the capture's ShapeEnv (torch.fx.experimental.
symbolic_shapes): the relations the trace relied on (`s0 == s1`, `2 <= s0`, a size equal to a
weight's) come back from it as guards over the inputs' sizes and strides.

Ints likewise (the setting `capture.dynamic_ints`): an int the frame reads from its arguments or
modules (`n`, `cfg.steps`, `sizes[1]`, `self.step`) is a constant guarded by value until a call brings another
value; the next capture makes it a symbolic int, a graph input, so a step counter does not compile
once per step. `dynamic=True` makes int arguments and their items symbolic from the first capture
(attributes stay constants until they change). Where Python needs the number itself (`range(n)`,
an index into a list) it is specialized and guarded, as a symbolic size is. Ints of globals and
defaults stay constants. The setting `capture.dynamic_sources` names inputs symbolic from the
first capture, whatever `dynamic` says (as torch.compiler.config.dynamic_sources).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch._guards import GuardSource, Source as TorchSource
from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

from kiln import config
from kiln.capture.sources import ConstSource, ItemSource, LocalSource

_MARK = "_kiln_dynamic_dims"


def mark_dynamic(tensor: torch.Tensor, dim: int | list[int] | tuple[int, ...]) -> None:
    """Make dimension `dim` (or each of several) of `tensor` symbolic in the captures it enters,
    so a compiled function does not specialize on its size.

    Example::

        x = torch.randn(8, 128)
        kiln.mark_dynamic(x, 0)
        compiled(x)   # one capture for every batch size
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"kiln.mark_dynamic: tensor must be a torch.Tensor, got {type(tensor).__name__}")
    dims = [dim] if isinstance(dim, int) else list(dim)
    for d in dims:
        if not isinstance(d, int) or isinstance(d, bool) or not -tensor.dim() <= d < max(tensor.dim(), 1):
            raise ValueError(f"kiln.mark_dynamic: dim must be a dimension of a {tensor.dim()}-d tensor, got {d!r}")
    marked = set(getattr(tensor, _MARK, ()))
    marked.update(d % tensor.dim() for d in dims)
    setattr(tensor, _MARK, frozenset(marked))


@contextlib.contextmanager
def marks_restored(tensors: list[torch.Tensor]) -> Iterator[None]:
    """The block may mark `tensors` dynamic (`mark_dynamic`); afterwards each has its own marks
    again, as before the block (`kiln.export` marks the dimensions its `dynamic_shapes` declares
    on the caller's tensors for one capture only)."""
    before = [t.__dict__.get(_MARK) for t in tensors]
    try:
        yield
    finally:
        for t, marks in zip(tensors, before):
            t.__dict__.pop(_MARK, None)
            if marks is not None:
                t.__dict__[_MARK] = marks


@dataclass
class DynamicPolicy:
    """Per compiled frame: `mode` is kiln.compile's `dynamic`; `seen` the dimensions found to change."""

    mode: bool | None = None
    seen: dict[str, set[int]] = field(default_factory=dict)  # str(source) -> dims
    seen_ints: set[str] = field(default_factory=set)  # str(source) of the ints found to change

    def dims(self, source: Any, tensor: torch.Tensor) -> frozenset[int]:
        named = named_dynamic(str(source))
        if named is not None:
            return frozenset(d for d in (named or range(tensor.dim())) if d < tensor.dim())
        if self.mode is False or tensor.dim() == 0:
            return frozenset()
        if self.mode is True:
            return frozenset(range(tensor.dim()))
        return frozenset(self.seen.get(str(source), ())) | getattr(tensor, _MARK, frozenset())

    def int_is_dynamic(self, source: Any) -> bool:
        """Whether the int read at `source` enters this capture as a symbolic int."""
        if named_dynamic(str(source)) is not None:
            return True
        if not config.capture.dynamic_ints or self.mode is False or not _argument_or_module_state(source):
            return False
        if self.mode is True:  # the arguments and their items; an attribute once it changes
            return all(isinstance(s, (LocalSource, ItemSource)) for s in source.chain())
        return str(source) in self.seen_ints

    def note_changes(self, guards: list[Any], read: Any) -> list[str]:
        """After a miss: the inputs whose sizes alone changed get those dimensions made dynamic.
        `read(source)` is the input's value now. Returns what changed, for the log."""
        if self.mode is not None:
            return []
        changed = []
        for guard in guards:
            if guard.kind == "EQUALS" and type(guard.expected) is int and config.capture.dynamic_ints and _argument_or_module_state(guard.source):
                try:
                    now = read(guard.source)
                except Exception:  # noqa: BLE001 - not there any more: another guard failed
                    continue
                if type(now) is int and now != guard.expected and str(guard.source) not in self.seen_ints:
                    self.seen_ints.add(str(guard.source))
                    changed.append(f"{guard.source} (an int)")
                continue
            if guard.kind != "TENSOR_MATCH":
                continue
            try:
                now, then = read(guard.source), guard.expected
            except Exception:  # noqa: BLE001 - the input is not there any more: another guard failed
                continue
            if not _same_but_sizes(now, then):
                continue
            dims = {i for i, (a, b) in enumerate(zip(now.shape, then.shape)) if a != b}
            if dims - self.seen.get(str(guard.source), set()):
                self.seen.setdefault(str(guard.source), set()).update(dims)
                changed.append(f"{guard.source} dims {sorted(dims)}")
        return changed


def _argument_or_module_state(source: Any) -> bool:
    """An int read from the frame's arguments or from a module's attributes: one that may become
    symbolic when it changes. A global's or a default's stays a constant, as in Dynamo."""
    root = source.chain()[0]
    return isinstance(root, LocalSource) or isinstance(root, ConstSource) and isinstance(root.value, torch.nn.Module)


def named_dynamic(name: str) -> tuple[int, ...] | None:
    """The dimensions `capture.dynamic_sources` makes symbolic at the input printed `name`: () for
    all (or an int), None where no entry names it. An entry is the name itself or a regular
    expression matching all of it, with an optional ':N' for dimension N only."""
    dims: list[int] = []
    for entry in config.capture.dynamic_sources:
        pattern, _, dim = entry.rpartition(":") if re.search(r":\d+$", entry) else (entry, "", "")
        if pattern == name or _full_match(pattern, name):
            if not dim:
                return ()
            dims.append(int(dim))
    return tuple(dims) or None


def _full_match(pattern: str, name: str) -> bool:
    try:
        return re.fullmatch(pattern, name) is not None
    except re.error:  # (a name with brackets, not meant as an expression)
        return False


def _same_but_sizes(now: Any, then: Any) -> bool:
    """`now` (a tensor) differs from `then` (a TENSOR_MATCH guard's TensorFacts) in sizes alone."""
    return (type(now) is then.cls and now.dtype == then.dtype and now.device == then.device and now.dim() == then.dim()
            and now.requires_grad == then.requires_grad and tuple(now.shape) != tuple(then.shape))


@dataclass(frozen=True)
class ShapeSource(TorchSource):
    """A name the shape environment writes its guards with; kiln swaps in the input's source."""

    placeholder: str

    @property
    def name(self) -> str:
        return self.placeholder

    def guard_source(self) -> GuardSource:
        return GuardSource.LOCAL


def placeholder(index: int) -> str:
    return f"__kiln_input{index}__"


def symbolic_fake(fake_mode: Any, tensor: torch.Tensor, dims: frozenset[int], index: int) -> torch.Tensor:
    """A fake of `tensor` whose dimensions `dims` are fresh symbols of `fake_mode`'s ShapeEnv."""
    sizes = [DimDynamic.DYNAMIC if i in dims else DimDynamic.STATIC for i in range(tensor.dim())]
    context = StatelessSymbolicContext(dynamic_sizes=sizes, dynamic_strides=[DimDynamic.INFER_STRIDE] * tensor.dim())
    if tensor._is_view() and not tensor.requires_grad:
        # A view is faked with its base, and the base's sizes become symbols too, which no input
        # of the graph gives (a growing KV cache's view of its buffer: the buffer, an input of
        # its own, would then be traced with a size the guards cannot name). The view's values
        # as an alias matter only where the graph also writes its base, which capture refuses
        # (output_graph.aliasing_guard); a detached alias is no view.
        tensor = tensor.detach()
    return fake_mode.from_tensor(tensor, source=ShapeSource(placeholder(index)), symbolic_context=context)
