"""The wrapper plan: a scheduled graph's wrapper as an ordered list of plain lines (bind a size,
allocate, call a kernel, call an extern, free, return, ...), made once per graph and printed by
each wrapper printer, the Python one (kiln/codegen/wrapper.py) and the C++ one
(kiln/codegen/cpp_wrapper.py).

Every decision about what the wrapper does is made here, once: which sizes are read off which
input, where a buffer's memory comes from (new, a dead buffer's, an input written over), when a
name dies, which extern results need their layout fixed, which steps are views, where the index
flag is read. A printer only says how its language does each line, one method per line kind
(named by the line's `kind`), and declines (`NotImplementedError`) what its language cannot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, get_args

import torch

from kiln.externs.prepacked import IN_PLACE_CONV_IMPL
from kiln.ir.nodes import Buffer, Layout
from kiln.ir.program import ExternStep
from kiln.ir.schedule import FusedKernel, MemoryPlan, Schedule, step_reads
from kiln.ir.sizes import is_size_symbol, unbound_symbols


@dataclass(frozen=True)
class Parameter:
    """One argument of the wrapper, in the graph's input order."""

    name: str
    kind: str  # "tensor" (a graph input buffer), "size" (a size passed as a number), "unused"


@dataclass(frozen=True)
class BindSize:
    """A size symbol bound at entry: `source`'s dim `dim`, or `source` itself (dim None: a size input)."""

    kind: ClassVar[str] = "bind_size"
    symbol: Any
    source: str
    dim: int | None


@dataclass(frozen=True)
class InLayout:
    """`name` copied to `layout`'s strides unless it has them: the kernels were printed for them."""

    kind: ClassVar[str] = "in_layout"
    name: str
    layout: Layout


@dataclass(frozen=True)
class ToDevice:
    """A graph input that arrives on the host moved to the graph's device: a kernel reads device
    memory only (eager lets a host scalar or index mix with device tensors)."""

    kind: ClassVar[str] = "to_device"
    name: str


@dataclass(frozen=True)
class Allocate:
    """New memory for a kernel's output."""

    kind: ClassVar[str] = "allocate"
    buffer: Buffer


@dataclass(frozen=True)
class Reuse:
    """A kernel's output in the memory of `dead`, which no step reads again: `dead`'s name goes with it."""

    kind: ClassVar[str] = "reuse"
    name: str
    dead: str


@dataclass(frozen=True)
class WriteOver:
    """A kernel's output written over its input `input` (which dies at that kernel)."""

    kind: ClassVar[str] = "write_over"
    name: str
    input: str


@dataclass(frozen=True)
class KernelCall:
    """A kernel called with its buffers (inputs, then outputs) and then the size symbols it takes."""

    kind: ClassVar[str] = "kernel_call"
    kernel: str
    buffers: tuple[str, ...]
    sizes: tuple[str, ...]


@dataclass(frozen=True)
class CheckIndex:
    """The index-error flag read after `kernels` ran: raise naming them when one read out of range."""

    kind: ClassVar[str] = "check_index"
    kernels: tuple[str, ...]


@dataclass(frozen=True)
class ExternCall:
    """Schedule step `step_index`, an operator call; `step` with its arguments as they are to be
    passed (a kiln::conv whose result the memory plan writes over its added input asks for the
    in-place implementation)."""

    kind: ClassVar[str] = "extern_call"
    step_index: int
    step: ExternStep


@dataclass(frozen=True)
class View:
    """Schedule step `step_index`, an `as_strided` view of the buffer `base`; `is_output`: the
    graph returns it, so it must stay a real view (autograd's view record, the version counter
    shared with its base), as eager's are."""

    kind: ClassVar[str] = "view"
    step_index: int
    step: ExternStep
    base: Buffer
    is_output: bool


@dataclass(frozen=True)
class Free:
    """Buffers no later step reads, released (none of them a dead buffer a later output takes over)."""

    kind: ClassVar[str] = "free"
    names: tuple[str, ...]


@dataclass(frozen=True)
class Return:
    """The graph's outputs: buffers, sizes (expressions over the bound symbols) or constants."""

    kind: ClassVar[str] = "return_"
    values: tuple[Any, ...]


Line = BindSize | InLayout | ToDevice | Allocate | Reuse | WriteOver | KernelCall | CheckIndex | ExternCall | View | Free | Return
LINE_KINDS: tuple[type, ...] = get_args(Line)


@dataclass(frozen=True)
class WrapperPlan:
    parameters: tuple[Parameter, ...]
    lines: tuple[Line, ...]
    device: str  # where the graph's buffers are allocated


def print_lines(printer: Any, plan: WrapperPlan) -> None:
    """Each line of `plan` given to the printer's method of its kind."""
    for line in plan.lines:
        getattr(printer, line.kind)(line)


def wrapper_plan(schedule: Schedule, checks: set[str], size_arguments: dict[str, list[str]] | None = None,
                 device: str = "cpu", host_inputs: frozenset[str] = frozenset()) -> WrapperPlan:
    """`schedule`'s wrapper. `checks`: kernels after which the index-error flag is read;
    `size_arguments`: the size symbols each kernel takes after its buffers; `host_inputs`: inputs
    of a GPU graph that arrive on the CPU. On a GPU the flag is read once, after the last kernel:
    reading it waits for the device, which after every kernel would stall the host's launches."""
    size_arguments = size_arguments or {}
    parameters = tuple(_parameter(schedule, k) for k in range(len(schedule.inputs)))
    lines: list[Line] = [*_size_bindings(schedule, parameters)]
    # An input whose sizes alone the graph reads (a growing KV cache's view, read for its length)
    # keeps the layout it comes with: no kernel reads it, and its strides may be symbols no size
    # binds.
    read = {name for step in schedule.steps for name in step_reads(step)}
    read.update(b.name for b in schedule.outputs if isinstance(b, Buffer))
    for b in schedule.inputs:
        if b is not None and b.name in read:
            lines.append(InLayout(b.name, b.layout))
            if b.name in host_inputs:
                lines.append(ToDevice(b.name))
    memory = schedule.memory
    reused = set(memory.reuses.values())
    read_at_end = [] if device != "cpu" else None
    for k, step in enumerate(schedule.steps):
        if isinstance(step, FusedKernel):
            lines += _kernel(step, memory, size_arguments.get(step.name, []))
            if step.name in checks:
                if read_at_end is None:
                    lines.append(CheckIndex((step.name,)))
                else:
                    read_at_end.append(step.name)
        else:
            lines += _extern(k, step, memory.extern_inplace.get(k), schedule.outputs)
        dead = tuple(name for name in memory.frees.get(k, []) if name not in reused)
        if dead:
            lines.append(Free(dead))
    if read_at_end:
        lines.append(CheckIndex(tuple(read_at_end)))
    lines.append(Return(tuple(schedule.outputs)))
    return WrapperPlan(parameters, tuple(lines), device)


def _parameter(schedule: Schedule, k: int) -> Parameter:
    b = schedule.inputs[k]
    if b is not None:
        return Parameter(b.name, "tensor")
    if k in schedule.size_inputs:
        symbol = schedule.size_inputs[k]
        # Dynamo may pass one symbol as several inputs (the same size read twice): each its own name.
        first = next(j for j, other in schedule.size_inputs.items() if other == symbol)
        return Parameter(symbol.name + ("_input" if first == k else f"_input{k}"), "size")
    return Parameter(f"_unused{k}", "unused")


def _size_bindings(schedule: Schedule, parameters: tuple[Parameter, ...]) -> list[BindSize]:
    """Each size symbol from its size input, else from the first input that has it as a dim."""
    lines, bound = [], set()
    for k, symbol in schedule.size_inputs.items():
        if symbol not in bound:
            lines.append(BindSize(symbol, parameters[k].name, None))
            bound.add(symbol)
    for b in schedule.inputs:
        for d, size in enumerate(b.layout.size if b is not None else ()):
            if is_size_symbol(size) and size not in bound:
                lines.append(BindSize(size, b.name, d))
                bound.add(size)
    return lines


def _kernel(kernel: FusedKernel, memory: MemoryPlan, sizes: list[str]) -> list[Line]:
    lines: list[Line] = []
    for b in kernel.outputs:
        if b.name in memory.reuses:
            lines.append(Reuse(b.name, memory.reuses[b.name]))
        elif b.name in memory.inplace:  # the input's name dies after the call, as it would anyway
            lines.append(WriteOver(b.name, memory.inplace[b.name]))
        else:
            lines.append(Allocate(b))
    lines.append(KernelCall(kernel.name, tuple(b.name for b in kernel.inputs + kernel.outputs), tuple(sizes)))
    return lines


def _extern(k: int, step: ExternStep, into: str | None, outputs: list[Any]) -> list[Line]:
    """`into`: a kiln::conv whose result the memory plan writes over its added input."""
    if into is not None:
        step = step.with_argument("impl", IN_PLACE_CONV_IMPL)
    if step.op is torch.ops.aten.as_strided.default:
        # A view's layout is its own: nothing to fix after it.
        if step.args and isinstance(step.args[0], Buffer) and len(step.outputs) == 1 and step.outputs[0] is not None:
            return [View(k, step, step.args[0], any(step.outputs[0] is o for o in outputs))]
        return [ExternCall(k, step)]
    # An extern's result has the layout ATen gave it; the kernels after it were printed for the
    # layout the lowering recorded, where that is known before the call.
    return [ExternCall(k, step), *(InLayout(b.name, b.layout) for b in step.outputs
                                   if b is not None and computable_layout(b.layout))]


def computable_layout(layout: Layout) -> bool:
    """Known before the call or computed from the inputs' sizes (not from tensor data)."""
    return layout.is_static or not any(unbound_symbols(v) for v in (*layout.size, *layout.stride, layout.offset))
