"""Changes the captured code makes to objects that outlive the call, replayed after the graph runs.

The interpreter does not touch real objects while capturing: a write to an attribute of an input
object, an append to an input list, a write to a global, is recorded here. The compiled frame's
runner replays them in order, with the graph's results in hand.
"""

from __future__ import annotations

import collections
import itertools
from typing import Any

import torch

from kiln.capture import module_watch
from kiln.capture.break_records import unsupported
from kiln.capture.guards import IMMUTABLE_SCALARS
from kiln.capture.sources import InstanceDictSource
from kiln.capture.variables.base import Variable
from kiln.capture.variables.containers import DictVariable, IteratorVariable, ListVariable, SetVariable


def _immutable_constant(value: Variable | None) -> bool:
    """Whether a value written is an immutable constant (None: a deletion, which is not)."""
    return value is not None and value.is_constant() and type(value.as_constant()) in IMMUTABLE_SCALARS


def _is_module(obj: Variable) -> bool:
    """Whether an object written to may be an nn.Module (a type kiln cannot tell: it may)."""
    try:
        return issubclass(obj.python_type(), torch.nn.Module)
    except Exception:  # noqa: BLE001 - a variable without a known type
        return True


def advance(iterator: Any, steps: int) -> None:
    """Take `steps` items of `iterator`, dropping them."""
    collections.deque(itertools.islice(iterator, steps), maxlen=0)


class SideEffects:
    def __init__(self) -> None:
        self.mutated: dict[int, Variable] = {}  # containers with a source, changed in place
        self.attr_writes: dict[int, tuple[Variable, dict[str, Variable | None]]] = {}  # None: deleted
        self.global_writes: dict[tuple[int, str], tuple[dict, str, Variable]] = {}
        self.cell_writes: dict[int, tuple[Variable, Variable]] = {}  # a real cell -> its new contents
        self.module_reads: dict[tuple[int, str], Any] = {}  # (id(module), name) -> the value read, as it was on entry
        # Inside a torch.cond branch: why no change may be made there to a variable made before
        # `refused_before` (one made in the branch stays in it), else None.
        self.refused: str | None = None
        self.refused_before = 0

    def check_allowed(self, what: str, var: Variable | None = None) -> None:
        """Refuse a change while tracing where one cannot be kept (a branch of torch.cond)."""
        if self.refused is not None and (var is None or var.made < self.refused_before or var.source is not None):
            raise unsupported("unsupported_side_effect", f"{what} {self.refused}: it would happen whichever branch "
                              "runs", "the graph breaks at the torch.cond call; make the branch a pure function of its operands")

    def record_mutation(self, container: Variable) -> None:
        self.check_allowed(f"changing {container.describe()}", container)
        self.mutated.setdefault(id(container), container)

    def record_setattr(self, obj: Variable, name: str, value: Variable | None, key: Any = None) -> None:
        """`key`: what the write is looked up by (default the variable; a class is its real self)."""
        self.check_allowed(f"setting attribute {name!r}", obj)
        self.attr_writes.setdefault(id(obj if key is None else key), (obj, {}))[1][name] = value

    def pending_attrs(self, obj: Any) -> dict[str, Variable | None]:
        """Every attribute the trace wrote on `obj`, in the order first written (None: deleted)."""
        entry = self.attr_writes.get(id(obj))
        return dict(entry[1]) if entry is not None else {}

    def pending_attr(self, obj: Any, name: str) -> tuple[bool, Variable | None]:
        """(True, value) if the trace wrote `name` on `obj` (value None: deleted)."""
        entry = self.attr_writes.get(id(obj))
        if entry is None or name not in entry[1]:
            return False, None
        return True, entry[1][name]

    def record_module_read(self, module: Any, name: str) -> None:
        """The trace read attribute `name` of a watched module as it was before the call (not a
        value the trace itself had written)."""
        self.module_reads.setdefault((id(module), name), module.__dict__.get(name, module_watch.ABSENT))

    def module_writes_keep_reads(self) -> bool:
        """The trace writes attributes of watched modules, and each one it also read before writing
        it gets back the constant it read: after the replay, every attribute the graph's decisions
        read holds what they read."""
        from kiln.capture.variables.modules import ModuleVariable
        from kiln.capture.variables.tensor import TensorVariable

        writes = [(id(obj.value), name, value) for obj, attrs in self.attr_writes.values()
                  if isinstance(obj, ModuleVariable) and obj.source is not None for name, value in attrs.items()]

        def keeps_read(key: int, name: str, value: Variable | None) -> bool:
            if (key, "__dict__") in self.module_reads:  # every attribute was read
                return False
            if (key, name) not in self.module_reads:
                return True
            if isinstance(self.module_reads[(key, name)], torch.Tensor) and isinstance(value, TensorVariable):
                return True  # (a tensor attribute is a guarded input of the graph, not a constant it read)
            return (value is not None and value.is_constant()
                    and module_watch.same_constant(self.module_reads[(key, name)], value.as_constant()))

        return bool(writes) and all(keeps_read(*write) for write in writes)

    def record_global(self, globals_dict: dict, name: str, value: Variable) -> None:
        self.check_allowed(f"setting global {name!r}")
        self.global_writes[(id(globals_dict), name)] = (globals_dict, name, value)

    def pending_global(self, globals_dict: dict, name: str) -> Variable | None:
        entry = self.global_writes.get((id(globals_dict), name))
        return entry[2] if entry is not None else None

    def record_cell(self, cell: Variable, value: Variable) -> None:
        self.check_allowed("setting a closure variable")
        self.cell_writes[id(cell)] = (cell, value)

    def __bool__(self) -> bool:
        return bool(self.mutated or self.attr_writes or self.global_writes or self.cell_writes)

    def constant_stores_only(self) -> bool:
        """Whether every change replayed is an attribute or a global set to an immutable constant
        (None, a bool, a number, a string): replayed again, it leaves what it left the first time,
        so guards that held after one replay hold after the next (kiln/settled.py)."""
        if self.mutated or self.cell_writes:
            return False
        values = [value for obj, attrs in self.attr_writes.values() if obj.source is not None for value in attrs.values()]
        values += [value for _, _, value in self.global_writes.values()]
        return all(_immutable_constant(value) for value in values)

    def leaves_modules(self) -> bool:
        """Whether no change replayed can rebind a tensor a module holds (where frozen weights are
        read from): no container changed in place, globals and cells set to immutable constants
        only, and attributes set to anything else only on objects that are not modules (a KV
        cache's layers)."""
        if self.mutated or not all(_immutable_constant(value) for _, _, value in self.global_writes.values()):
            return False
        if not all(_immutable_constant(value) for _, value in self.cell_writes.values()):
            return False
        return all(not _is_module(obj) or all(_immutable_constant(value) for value in attrs.values())
                   for obj, attrs in self.attr_writes.values() if obj.source is not None)

    def replay_lines(self, rc: Any) -> list[str]:
        """Python statements that apply the recorded changes (rc: the output reconstructor)."""
        # Every new content is read first: it may come from an input another replay line changes.
        reads, lines = [], []
        for n, var in enumerate(self.mutated.values()):
            target, new = f"_t{n}", f"_n{n}"
            reads.append(f"{target} = {var.source.expr(rc.ns)}")
            if isinstance(var, ListVariable) and var.python_type() is collections.deque:  # (no slice assignment)
                reads.append(f"{new} = [{', '.join(rc.expr(i) for i in var.items)}]")
                lines += [f"{target}.clear()", f"{target}.extend({new})"]
            elif isinstance(var, ListVariable):
                reads.append(f"{new} = [{', '.join(rc.expr(i) for i in var.items)}]")
                lines.append(f"{target}[:] = {new}")
            elif isinstance(var, DictVariable):
                pairs = ", ".join(f"({rc.expr(k)}, {rc.expr(v)})" for k, v in var.entries.values())
                reads.append(f"{new} = [{pairs}]")
                lines += [f"{target}.clear()", f"{target}.update({new})"]
            elif isinstance(var, SetVariable):
                reads.append(f"{new} = [{', '.join(rc.expr(i) for i in var.entries.values())}]")
                lines += [f"{target}.clear()", f"{target}.update({new})"]
            elif isinstance(var, IteratorVariable):  # the caller's itertools.count, advanced as the trace did
                lines.append(f"{rc.ns.bind(advance, 'F')}({target}, {var.taken})")
        lines = reads + lines
        for obj, attrs in self.attr_writes.values():
            if obj.source is None:
                continue  # a new object: its attributes are set when it is built
            target = obj.source.expr(rc.ns)
            raw = getattr(obj, "raw_setattr", False)  # write past the class's own __setattr__/__delattr__
            for name, value in attrs.items():
                if name in getattr(obj, "dict_writes", ()):  # (past a data descriptor: into the dict)
                    instance_dict = InstanceDictSource(obj.source).expr(rc.ns)
                    lines.append(f"{instance_dict}.pop({name!r}, None)" if value is None else f"{instance_dict}[{name!r}] = {rc.expr(value)}")
                elif value is None:
                    lines.append(f"{'object.__delattr__' if raw else 'delattr'}({target}, {name!r})")
                else:
                    lines.append(f"{'object.__setattr__' if raw else 'setattr'}({target}, {name!r}, {rc.expr(value)})")
        for globals_dict, name, value in self.global_writes.values():
            lines.append(f"{rc.ns.bind(globals_dict, 'G')}[{name!r}] = {rc.expr(value)}")
        for cell, value in self.cell_writes.values():
            lines.append(f"{rc.cell(cell)}.cell_contents = {rc.expr(value)}")
        return lines

