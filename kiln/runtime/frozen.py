"""A compiled graph whose parameters are frozen: constants computed once, kept valid by a check.

On each call the frozen inputs must be the very tensors the constants were computed from, at the
same version counter (an in-place change, an optimizer step, `load_state_dict`, bumps it), on the
same memory (`w.data = new` and `module.to(...)` rebind it), and not written through `.data` since
(kiln/runtime/data_watch.py). If not, the constants graph runs again on the new tensors: a weight
changed after compiling gives the new, correct result, at the cost of one re-freeze. New tensors with other shapes, dtypes or strides
than the compiled ones run the graphs through ATen, op by op, logged. The steps of a settled run
(kiln/settled.py: kiln's decoding loop, nothing but its own code between the steps) check once a run.
"""

from __future__ import annotations

import operator
import pickle
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from kiln import logs, settled
from kiln.native import libkiln, python_door
from kiln.runtime import data_watch, shared_constants
from kiln.runtime.compiled_graph import CompiledGraph
from kiln.externs import native_ops
from kiln.externs.prepacked import packed_bytes
from kiln.ir.constant_split import ConstantSplit


def _signature(t: Any) -> Any:
    if not isinstance(t, torch.Tensor):
        return type(t)
    return (tuple(t.shape), tuple(t.stride()), t.dtype, t.device)


@dataclass
class FrozenArtifact:
    """A FrozenProgram as the AOT graph cache stores it: no tensor values, only graphs and code
    (constants are computed from the frozen inputs of the process that loads it)."""

    split: bytes  # the pickled ConstantSplit (its two graph modules as code)
    runtime: Any  # the compiled runtime graph's own artifact


def _picker(positions: Sequence[int]) -> Callable[[Sequence[Any]], Sequence[Any]]:
    """`pick(args)`: the arguments at `positions`, in order, in one C call: a slice where they
    follow each other (the usual case: the lifted weights come first), else an item getter."""
    positions = list(positions)
    if not positions:
        return lambda args: ()
    if positions == list(range(positions[0], positions[-1] + 1)):
        return operator.itemgetter(slice(positions[0], positions[-1] + 1))
    if len(positions) == 1:
        return lambda args: (args[positions[0]],)
    return operator.itemgetter(*positions)


def _with_constants(runtime: Callable, constants: tuple) -> Callable[..., Any]:
    """`lambda *args: runtime(*args, *constants)`, through `CompiledGraph.bound` where it is one."""
    if isinstance(runtime, CompiledGraph):
        return runtime.bound(constants)
    return lambda *args: runtime(*args, *constants)


class FrozenProgram:
    """`(*args) -> outputs` of the original graph, from the runtime graph and cached constants."""

    def __init__(self, split: ConstantSplit, runtime: Callable, label: str = "graph") -> None:
        self.split, self.runtime, self.label = split, runtime, label
        self.frozen_positions, self.runtime_positions = split.frozen_positions, split.runtime_positions
        # The call's frozen and runtime arguments picked in C (a BERT graph has ~200 frozen).
        self._frozen_of, self._runtime_of = _picker(self.frozen_positions), _picker(self.runtime_positions)
        self.held: list[Any] = []
        # How the frozen inputs are checked on each call: the same tensors, versions and memory
        # (kiln/native/python_door.py `stamp`), compared with the last stamp inside `stamp_of`.
        self.stamp_of: Callable[..., Any] = python_door.stamp_function()
        self.stamp: Any = None
        self.storages: list[Any] = []  # held so that a rebound tensor's old memory is not reused before the check
        self.epoch = -1  # data_watch's epoch when the constants were last known valid
        self.stamped_run = 0  # the settled run whose step last found the stamp held (0: none)
        self.constants: tuple = ()
        # The runtime graph with the constants as its last inputs (bound once per freeze: a decode
        # step's ~500 are then not passed through Python on every call).
        self._run_with_constants: Callable[..., Any] = runtime
        self.signatures: list[Any] | None = None
        self.freezes = 0

    def _written(self, frozen: Sequence[Any], epoch: int) -> bool:
        """Whether a frozen input was written through `.data` (or marked by kiln.refreeze) since
        the constants were computed; asked only when data_watch's epoch moved."""
        if data_watch.written_since(frozen, self.epoch):
            return True
        self.epoch = epoch
        return False

    def _freeze(self, frozen: list[Any]) -> bool:
        signatures = [_signature(t) for t in frozen]
        if self.signatures is not None and signatures != self.signatures:
            logs.log("freezing", "%s: a frozen input changed shape, dtype or strides; running the graph eagerly", self.label)
            return False
        data_watch.watch(frozen)
        libkiln.apply_settings()  # (the packs are made by the call after this one, under these settings)
        epoch = data_watch.sweep()
        with torch.no_grad():
            # (Shared with the process's other frozen graphs over the same weights: a decode step's
            # and its prompt's graphs hold one copy of the concatenated weights and their packs.)
            self.constants = shared_constants.compute(self.split.constants, frozen)
        self._run_with_constants = _with_constants(self.runtime, self.constants)
        self.held, self.signatures = list(frozen), signatures
        self.stamp = self.stamp_of(frozen)
        self.storages = [t.untyped_storage() for t in frozen]
        self.epoch = epoch
        self.freezes += 1
        if self.freezes > 1:
            logs.log("freezing", "%s: frozen inputs changed; constants computed again (%d times)", self.label, self.freezes)
        return True

    def __call__(self, *args: Any) -> Any:
        # A settled run's step (kiln/settled.py) after the run's first: nothing but kiln's loop and
        # this graph, which writes no frozen input, ran since the stamp held.
        run = settled.current()
        if run is not None and run.number == self.stamped_run:
            return self._run_with_constants(*self._runtime_of(args))
        frozen = self._frozen_of(args)
        # Stale constants: the stamp differs (never frozen: it is None; it is what changes in
        # practice), or a write data_watch saw. Written out here: this runs on every call.
        epoch = data_watch.sweep()
        if (self.stamp is None or not self.stamp_of(frozen, self.stamp)
                or epoch != self.epoch and self._written(frozen, epoch)) \
                and not self._freeze(frozen):
            return self._eager(args, frozen)
        self.stamped_run = run.number if run is not None else 0
        return self._run_with_constants(*self._runtime_of(args))

    def _eager(self, args: Sequence[Any], frozen: list[Any]) -> Any:
        with torch.no_grad():
            constants = self.split.constants(*frozen)
            return self.split.runtime(*[args[i] for i in self.runtime_positions], *constants)

    def artifact(self, save_runtime: Callable[[Any], Any]) -> FrozenArtifact | None:
        runtime = save_runtime(self.runtime)
        if runtime is None:
            return None
        try:
            return FrozenArtifact(pickle.dumps(self.split), runtime)
        except Exception:  # noqa: BLE001 - a graph that does not pickle is simply not cached
            return None

    @classmethod
    def load(cls, artifact: FrozenArtifact, load_runtime: Callable[[Any], Callable]) -> "FrozenProgram":
        if native_ops.names_in(artifact.split):  # kiln's C++ operators, defined before their graph's code runs
            native_ops.load()
        return cls(pickle.loads(artifact.split), load_runtime(artifact.runtime))

    def memory(self) -> dict[str, int]:
        """Bytes kiln holds beyond the user's tensors: computed constants and packed weights (those
        shared with another graph over the same weights, shared_constants.py, counted by each)."""
        computed = sum(c.numel() * c.element_size() for c, own in zip(self.constants, self.split.computed)
                       if own and isinstance(c, torch.Tensor))
        packs = sum(packed_bytes(c) for c in self.constants if isinstance(c, torch.Tensor))
        return {"constants": computed, "packed": packs}

