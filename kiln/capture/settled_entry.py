"""The guard check of a settled run's steps: only the guards that read what the call changed.

Within a settled run (kiln/settled.py) nothing but kiln's decoding loop and the compiled step runs
between two calls of the step's frame. What the guards read is then changed by three things only:
the call's arguments (the loop hands new tensors: the next tokens, the next positions), the
graph's writes into its input tensors (their contents, which no guard reads: a graph that changes
an input's sizes or strides is not compiled), and the entry's replayed changes to objects — for
an entry that `settles` (kiln/capture/frame.py), stores of constants, which leave after each call
what they left after the one before. So once an entry's guards held in full on two calls of one
run (the second after one replay of its changes), a later call of the run whose arguments are the
same objects as the call before's where they are not new holds the guards that read no new
argument: each was last checked on the same objects, which nothing changed since. `holds` checks
the others only (a decode step's input tensors, the kwargs dict's keys): on a Qwen2-0.5B int4 step
17 of 589 guards; the rest's lines of Python the step's weights had pushed out of the caches.

An argument is one of the frame's bound arguments (`L[i]`), or, where that is the tuple of extra
positional arguments or the dict of keyword arguments (made anew by every call), one of its items.
"""

from __future__ import annotations

from typing import Any, Callable

from kiln.capture.guards import CompiledGuards, Guard
from kiln.capture.sources import ItemSource, LocalSource, Source
from kiln.settled import Run

_ABSENT = object()  # an argument the call does not have
_MOST_CHECKS = 8  # kinds of change compiled per entry; a call that changes more is checked in full


class ArgumentGuards:
    """An entry's guards by the arguments they read, and their checks for each kind of change."""

    def __init__(self, guards: list[Guard], L: tuple) -> None:
        self.guards = guards
        self.arguments: list[tuple] = []  # (i,) for L[i], (i, key) for L[i][key]
        position: dict[tuple, int] = {}
        self.reads: list[frozenset[int]] = []  # per guard, the positions of the arguments it reads
        for guard in guards:
            read = {_argument(source, L) for source in guard.reads()} - {None}
            self.reads.append(frozenset(position.setdefault(a, len(position)) for a in read))
        self.arguments = list(position)
        self.checks: dict[frozenset[int], Callable[[tuple], bool]] = {}

    def values(self, L: tuple) -> tuple:
        return tuple(_value(L, argument) for argument in self.arguments)

    def check(self, changed: frozenset[int], L: tuple) -> bool:
        """Whether the guards that read a changed argument hold (False: not compiled for so many kinds)."""
        check = self.checks.get(changed)
        if check is None:
            if len(self.checks) >= _MOST_CHECKS:
                return False
            guards = [g for g, reads in zip(self.guards, self.reads) if reads & changed]
            check = self.checks[changed] = CompiledGuards(guards).check if guards else _holds
        return check(L)


def _holds(L: tuple) -> bool:
    return True


def _argument(source: Source, L: tuple) -> tuple | None:
    """The argument `source` is read from (None: none, a constant's)."""
    chain = source.chain()
    if not isinstance(chain[0], LocalSource):
        return None
    i = chain[0].index
    if (len(chain) > 1 and isinstance(chain[1], ItemSource) and chain[1].read_with is None
            and type(L[i]) in (tuple, dict)):
        return (i, chain[1].key)
    return (i,)


def _value(L: tuple, argument: tuple) -> Any:
    value = L[argument[0]]
    if len(argument) == 1:
        return value
    try:
        return value[argument[1]]
    except (KeyError, IndexError, TypeError):
        return _ABSENT


class SettledEntry:
    """The entry a frame ran on the last call of a settled run, the arguments of that call, and how
    many calls of the run in a row checked it in full (kept in `Run.kept`, dropped with the run)."""

    def __init__(self, entry: Any, values: tuple) -> None:
        self.entry, self.values, self.full_checks = entry, values, 1

    @staticmethod
    def after_check(run: Run, frame: Any, entry: Any, L: tuple) -> None:
        """Note that `entry`'s guards held in full on this call of `run`."""
        if not entry.settles:
            run.kept.pop(frame, None)
            return
        reads = _argument_guards(entry, L)
        last = run.kept.get(frame)
        if last is not None and last.entry is entry:
            last.values, last.full_checks = reads.values(L), last.full_checks + 1
        else:
            run.kept[frame] = SettledEntry(entry, reads.values(L))

    def holds(self, L: tuple) -> bool:
        """Whether the entry's guards hold on this call, checking those that read a changed argument."""
        if self.full_checks < 2:
            return False
        reads = self.entry.argument_guards
        values = reads.values(L)
        changed = frozenset(k for k, (now, before) in enumerate(zip(values, self.values)) if now is not before)
        if not reads.check(changed, L):
            return False
        self.values = values
        return True


def _argument_guards(entry: Any, L: tuple) -> ArgumentGuards:
    if entry.argument_guards is None:
        entry.argument_guards = ArgumentGuards(entry.guards.guards, L)
    return entry.argument_guards
