"""A CUDA graph's outputs handed to the caller without a copy per replay.

A recorded graph writes its outputs to the same addresses on every replay. Cloning them after
each replay keeps earlier results safe but costs a copy of every output per call (GPT-2's logits
are 103 MB in bfloat16). `ReplayOutputs` hands out the recording's own memory instead and pays a
copy only for what the caller still holds when the memory is about to be written again:

- **Hand out.** After a replay, each output comes back as a tensor on a storage of its own that
  points at the recording's memory without owning it (outputs that are views of one buffer stay
  views of one storage). A storage of the caller's is never the recording's: moving it later moves
  nothing of ours.
- **Before the next replay**, every storage handed out earlier that is still alive (the caller
  kept the tensor or a view of it) gets its own memory: a copy is made and the two storages swap
  their memory, so the caller's tensors and views keep their values at a new address and the
  copy's storage, now pointing at the recording, is dropped. Storages the caller let go cost
  nothing: the usual `out = model(x)` loop keeps one result alive across a call and pays one copy
  of it, `model(x).argmax(-1)` or a loss read once pays none.
- **Outputs that are not the recording's memory** (a parameter or an input returned as is, or a
  view of one) are cloned as before: that memory is not the recording's to hand out.
- **When a recording is dropped** (a weight changed, or the model deleted) the same move runs
  first, so nothing the caller holds points at memory that is about to be freed.

This is what lets a CUDA graph's replay skip the copies Inductor's CUDA graph trees also skip;
unlike them, a result held across calls is never invalidated (reading it never raises).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from kiln.native import python_door


# The storages every recording has handed out since its last replay (their StorageImpl addresses):
# an input on one of them sits in a recording's memory at an address that stays the same from
# replay to replay, which another recording may read in place (`handed_out`).
_HANDED: set[int] = set()


def handed_out(tensor: torch.Tensor) -> bool:
    """`tensor` is a view of a recording's output as handed out (its storage is one of ours)."""
    return tensor.untyped_storage()._cdata in _HANDED


class ReplayOutputs:
    """The outputs of one recording, handed out per replay without copies.

    Example::

        handout = ReplayOutputs(recording_outputs, inputs=recording_inputs)
        handout.before_replay()      # earlier outputs still held move to their own memory
        graph.replay()
        outputs = handout.hand_out()
    """

    def __init__(self, buffers: Sequence[Any], inputs: Sequence[Any] = ()) -> None:
        self.buffers = list(buffers)
        theirs = {_storage_address(t) for t in inputs if isinstance(t, torch.Tensor)}
        # outputs on memory the recording allocated, by position; the rest are cloned per call
        self.owned = [isinstance(b, torch.Tensor) and _storage_address(b) not in theirs and b.untyped_storage().nbytes() > 0
                      for b in self.buffers]
        self.handed: list[StorageWeakRef] = []  # storages handed out since the last replay
        self.copies = 0  # storages moved to their own memory because the caller still held them

    def before_replay(self) -> None:
        """Give every output storage the caller still holds its own memory."""
        handed, self.handed = self.handed, []
        for ref in handed:
            _HANDED.discard(ref.cdata)
            if ref.expired():
                continue
            storage = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
            if storage is None:  # expired between the check and the lookup
                continue
            copy = torch.empty(storage.nbytes(), dtype=torch.uint8, device=storage.device).untyped_storage()
            copy.copy_(storage)
            swap_memory(storage, copy)  # the caller's tensors now read the copy; `copy` points at ours
            self.copies += 1

    def hand_out(self) -> list[Any]:
        """This replay's outputs: the recording's memory, on storages the caller may keep."""
        aliases: dict[int, torch.UntypedStorage] = {}
        outputs = []
        for buffer, owned in zip(self.buffers, self.owned):
            if not isinstance(buffer, torch.Tensor):
                outputs.append(buffer)
                continue
            if not owned:
                outputs.append(buffer.clone())
                continue
            storage = buffer.untyped_storage()
            address = storage.data_ptr()
            alias = aliases.get(address)
            if alias is None:
                alias = torch._C._construct_storage_from_data_pointer(address, storage.device, storage.nbytes())
                aliases[address] = alias
                self.handed.append(StorageWeakRef(alias))
                _HANDED.add(alias._cdata)
            out = torch.empty((), dtype=buffer.dtype, device=buffer.device)
            out.set_(alias, buffer.storage_offset(), buffer.shape, buffer.stride())
            outputs.append(out)
        return outputs

    def release(self) -> None:
        """The recording is being dropped: move whatever the caller still holds."""
        try:
            self.before_replay()
        except Exception:  # noqa: BLE001 - at interpreter exit CUDA may already be gone
            pass


def swap_memory(a: torch.UntypedStorage, b: torch.UntypedStorage) -> None:
    """`a` and `b` exchange their memory: torch's `_swap_data_ptr_` where it has one, else kiln's
    extension (torch 2.11 has no such method: there every handed-out output the caller kept failed
    its next replay)."""
    swap = getattr(a, "_swap_data_ptr_", None)
    if swap is not None:
        swap(b)
    else:
        python_door.module().swap_storage_memory(a, b)


def _storage_address(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()
