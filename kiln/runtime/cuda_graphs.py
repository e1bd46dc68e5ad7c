"""A compiled CUDA inference graph replayed as one CUDA graph: `mode="reduce-overhead"`.

A compiled graph on a GPU launches one Triton kernel or ATen extern after another from Python;
for a small model the host's launches, not the GPU, set the time of a call. `CudaGraphed` records
the graph's launches once per set of input sizes into a `torch.cuda.CUDAGraph` and replays them
with one call:

- **Static inputs.** A CUDA graph reads and writes fixed addresses. Inputs that are module state
  (parameters and buffers: `static_positions`) are read where they are; every other tensor input
  is copied into a buffer the recording owns, before each replay (skipped when the caller passes
  that very buffer).
- **Warm-up, then capture.** The graph runs once on a side stream before it is recorded (Triton
  compiles its kernels and cuBLAS makes its handles outside the capture), then once under capture,
  into the recording's own memory pool. (A pool shared between recordings is freed by PyTorch
  when the last graph using it goes, after which capturing into its handle fails: a recording
  dropped after a weight change would break the next one.)
- **Replay.** The recorded module state must still be the same tensors, at the same version and
  address: a weight changed in place, rebound or refrozen is recorded again (and the compiled
  graph re-freezes it on that call). Outputs are the recording's own memory, handed out without
  a copy; a result the caller still holds when the next replay would overwrite it is moved to
  memory of its own first (kiln/runtime/replay_outputs.py), so earlier results never change.
- **Index errors.** Kernels with indirect indices write a flag the wrapper reads after the last
  kernel; under capture it cannot be read, so it is read after each replay instead (without
  waiting for the GPU: kiln/runtime/error_flag.py).
- **Limits, recorded, never silent.** Inputs on the CPU (a graph with host work), a capture that
  fails (an op that synchronizes with the host, as `.item()`), and more sets of input sizes than
  `backend.cuda_graph_sizes` make the calls run without a CUDA graph; each reason is recorded once
  in `kiln.runtime.fallback.FALLBACKS` (what `kiln.explain` shows) and logged under `breaks`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from kiln import config, logs
from kiln.runtime.error_flag import flags_read_later
from kiln.runtime.fallback import record_fallback
from kiln.runtime.replay_outputs import ReplayOutputs, handed_out


class NoCudaGraph(RuntimeError):
    """Why a compiled graph's calls run without a CUDA graph."""


def _key(args: Sequence[Any]) -> tuple:
    return tuple((tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else (type(a), a)
                 for a in args)


@dataclass
class _Recording:
    graph: torch.cuda.CUDAGraph
    inputs: list[Any]  # what the recording read: owned copies, module state as it was, plain values
    outputs: list[Any]  # the recording's output buffers (and plain values)
    copied: list[int]  # positions copied into `inputs` before each replay
    state: list[tuple[int, Any, int, int]] = field(default_factory=list)  # (position, tensor, version, address)
    flags: list[Any] = field(default_factory=list)  # index-error flags read after each replay
    handout: ReplayOutputs | None = None  # `outputs` handed to the caller per replay
    in_place: list[tuple[int, int]] = field(default_factory=list)  # (position, address) read where it is
    check_versions: bool = True  # module state changed in place is recorded again (frozen weights)

    def __post_init__(self) -> None:
        if self.handout is None:
            self.handout = ReplayOutputs(self.outputs, inputs=self.inputs)

    def __del__(self) -> None:
        # the recording's memory goes with it: results the caller still holds move out first
        if self.handout is not None:
            self.handout.release()

    def current(self, args: Sequence[Any]) -> bool:
        """The module state the recording read is still what `args` pass, unchanged."""
        for position, tensor, version, address in self.state:
            arg = args[position]
            if arg is not tensor or (self.check_versions and arg._version != version) or arg.data_ptr() != address:
                return False
        return True

    def in_place_moved(self, args: Sequence[Any]) -> bool:
        """An input the recording reads in place is no longer at that address."""
        return any(args[position].data_ptr() != address for position, address in self.in_place)


class CudaGraphed:
    """`(*args) -> outputs` of `compiled`, replayed from CUDA graphs where it can be.

    Example::

        run = CudaGraphed(compiled_graph, static_positions=[0, 1], label="graph_0")
        out = run(weight, bias, x)   # recorded now; later calls with x's sizes replay
    """

    def __init__(self, compiled: Callable, static_positions: Sequence[int] = (), label: str = "graph",
                 limit: int | None = None, check_versions: bool = True) -> None:
        self.compiled, self.label, self.check_versions = compiled, label, check_versions
        self.static_positions = set(static_positions)
        self.limit = config.backend.cuda_graph_sizes if limit is None else limit
        self.recordings: dict[tuple, _Recording] = {}
        self.declined: set[str] = set()  # reasons already recorded
        self.records = 0  # recordings made, re-recordings after a weight change included

    def __call__(self, *args: Any) -> Any:
        key = _key(args)
        recording = self.recordings.get(key)
        if recording is not None and not recording.current(args):
            del self.recordings[key]
            recording.handout.release()
            recording = None
        if recording is None:
            try:
                recording = self._record(key, args)
            except NoCudaGraph as reason:
                self._decline(reason)
                return self.compiled(*args)
        elif recording.in_place_moved(args):
            self._decline(NoCudaGraph("an input the CUDA graph reads in place (another recording's output) has "
                                      "moved, e.g. two forward calls before their backwards: such calls run without it"))
            return self.compiled(*args)
        return self._replay(recording, args)

    def _decline(self, reason: NoCudaGraph) -> None:
        text = str(reason)
        if text not in self.declined:
            self.declined.add(text)
            record_fallback("kiln cuda graphs", self.label, reason, tell=False)  # (compiled still: not eager's speed)

    def _record(self, key: tuple, args: Sequence[Any]) -> _Recording:
        if len(self.recordings) >= self.limit:
            raise NoCudaGraph(f"more than {self.limit} sets of input sizes (backend.cuda_graph_sizes); "
                              "calls with new sizes run without a CUDA graph")
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if any(t.device.type != "cuda" for t in tensors if t.dim() > 0):
            raise NoCudaGraph("an input is not on a CUDA device: the graph has host work, which a CUDA graph cannot replay")
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            # (a training graph's forward and backward run inside an autograd.Function, where
            # grad mode is off: this is a graph called outside one)
            raise NoCudaGraph("an input requires grad outside the AOT layer's training function")
        moving = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and i not in self.static_positions]
        # Another recording's output, as handed out, stays at its address from replay to replay
        # (a training forward's saved tensors, read by the backward): read where it is, not copied.
        in_place = [(i, args[i].data_ptr()) for i in moving if handed_out(args[i])]
        read_in_place = {i for i, _ in in_place}
        copied = [i for i in moving if i not in read_in_place]
        inputs = list(args)
        for i in copied:
            inputs[i] = torch.empty_strided(args[i].shape, args[i].stride(), dtype=args[i].dtype,
                                            device=args[i].device).copy_(args[i])
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.compiled(*inputs)  # warm-up: Triton compiles, cuBLAS makes its handles
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with flags_read_later() as flags, torch.cuda.graph(graph):
                outputs = list(self.compiled(*inputs))
        except Exception as error:  # noqa: BLE001 - the calls still run, recorded as such
            raise NoCudaGraph(f"the graph could not be captured ({type(error).__name__}: "
                              f"{(str(error).strip().splitlines() or [''])[0]})") from error
        state = [(i, args[i], args[i]._version, args[i].data_ptr()) for i in sorted(self.static_positions)
                 if isinstance(args[i], torch.Tensor)]
        recording = _Recording(graph, inputs, outputs, copied, state, list(flags), in_place=in_place,
                               check_versions=self.check_versions)
        for i, _ in in_place:  # (held, they would be copied out of their recording at its every replay)
            recording.inputs[i] = None
        self.recordings[key] = recording
        self.records += 1
        logs.log("cuda_graphs", "%s: CUDA graph recorded for input sizes %s (%d kept)", self.label,
                 [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)], len(self.recordings))
        return recording

    def _replay(self, recording: _Recording, args: Sequence[Any]) -> list[Any]:
        recording.handout.before_replay()
        for i in recording.copied:
            if args[i] is not recording.inputs[i]:
                recording.inputs[i].copy_(args[i])
        recording.graph.replay()
        for flag in recording.flags:
            flag.check("a CUDA graph's kernels")
        return recording.handout.hand_out()


def cuda_graphed(compiled: Callable, static_positions: Sequence[int], label: str) -> Callable:
    """`compiled` replayed from CUDA graphs (the AOT layer's hook for inference graphs, set by
    kiln's backend when `backend.cuda_graphs` is on)."""
    return CudaGraphed(compiled, static_positions, label)


def cuda_graphed_training(forward: Callable, backward: Callable, static_positions: Sequence[int],
                          label: str) -> tuple[Callable, Callable]:
    """A training graph's forward and backward, each replayed from CUDA graphs (the AOT layer's
    hook for training graphs). Parameters are read where they are and may change in place between
    calls (the optimizer's step): only a rebound or moved parameter is recorded again. The
    backward reads the forward's saved tensors in place, in the forward recording's memory."""
    return (CudaGraphed(forward, static_positions, f"{label} forward", check_versions=False),
            CudaGraphed(backward, (), f"{label} backward", check_versions=False))
