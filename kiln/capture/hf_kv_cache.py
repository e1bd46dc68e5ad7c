"""HuggingFace's dynamic KV cache appended in place under `kiln.compile(model).generate(...)`.

HF's `DynamicLayer` grows each layer's keys and values by `torch.cat([cache, new], -2)`: a new
tensor per layer and token, so a compiled decode step copies the whole cache every token, as eager
does (llama-160m int4 on 2 cores of an AMD EPYC: 4.8-5.8 ms a token against 3.8-4.2 with the static
cache, which writes one row). `GrowingLayer` is a `DynamicLayer` that keeps its keys and values in
buffers with room to grow (a "room": `[batch, heads, capacity, head_dim]`) and writes each new
token's rows into the room in place; `keys` and `values` are views of the room's first rows, the
same values at the same sizes as the `DynamicLayer`'s. kiln compiles the step so that only the new
rows are written (a slice_scatter into an input the graph writes back is a Scatter in the input's
memory, kiln/lowering/shape.py), the attention reads the views where they lie (an extern's
argument may be a view of symbolic size, kiln/lowering/graph.py), and the views handed back are
made from the room, not copied (kiln/aot/trace.py).

The route (kiln/capture/hf_generation.py) turns into `GrowingLayer`s only the layers of a
`DynamicCache` that HF's `generate` makes itself for the call (no cache passed, no
`cache_implementation` but "dynamic"), and only where every layer is a plain `DynamicLayer`
(no sliding windows, no offloading). The room starts with one row more than generate's maximum
length and doubles when full (one copy). Every method that sets `keys` otherwise (crop,
beam search's reordering, batch expansion, reset, offloading) lets the room go: the next update
starts a new one from the keys it finds. A caller who assigns `layer.keys` itself on a cache
`generate` returned must do the same (`layer.key_room = layer.value_room = None`).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values are views of buffers with room to grow."""

    key_room: torch.Tensor | None = None
    value_room: torch.Tensor | None = None
    capacity_hint = 0  # rows to make room for at the first update (generate's maximum length)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.keys.shape[-2] if self.keys.dim() == key_states.dim() else 0  # (lazy init: a 1-D empty tensor)
        end = length + key_states.shape[-2]
        if self.key_room is None or end > self.key_room.shape[-2]:
            # Room for generate's longest, else twice this; and one row more: a view of the whole
            # room (the last token's, were the room full) would be a graph of its own.
            rows = self.capacity_hint if self.capacity_hint >= end else 2 * end
            self._new_room(key_states, value_states, length, rows + 1)
        self.key_room.narrow(-2, length, end - length).copy_(key_states)
        self.value_room.narrow(-2, length, end - length).copy_(value_states)
        self.keys = self.key_room.narrow(-2, 0, end)
        self.values = self.value_room.narrow(-2, 0, end)
        return self.keys, self.values

    def _new_room(self, key_states: torch.Tensor, value_states: torch.Tensor, length: int, capacity: int) -> None:
        key_room = key_states.new_empty((*key_states.shape[:-2], capacity, key_states.shape[-1]))
        value_room = value_states.new_empty((*value_states.shape[:-2], capacity, value_states.shape[-1]))
        if length:
            key_room.narrow(-2, 0, length).copy_(self.keys)
            value_room.narrow(-2, 0, length).copy_(self.values)
        self.key_room, self.value_room = key_room, value_room

    def _drop_room(self) -> None:
        self.key_room = self.value_room = None

    # Each of DynamicLayer's (and CacheLayerMixin's) methods that sets `keys` another way.
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._drop_room()

    def reset(self) -> None:
        super().reset()
        self._drop_room()

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        self._drop_room()

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self._drop_room()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self._drop_room()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        self._drop_room()

    def offload(self) -> None:
        super().offload()
        self._drop_room()

    def prefetch(self) -> None:
        super().prefetch()
        self._drop_room()


def grow_in_place(cache: Any, capacity_hint: int) -> bool:
    """Make the layers of `cache`, a `DynamicCache` just made and not yet written, `GrowingLayer`s
    with room for `capacity_hint` rows; whether it did (not for other caches or layer kinds)."""
    if type(cache) is not DynamicCache or getattr(cache, "offloading", False):
        return False
    layers = getattr(cache, "layers", None)
    if not layers or any(type(layer) is not DynamicLayer or layer.is_initialized for layer in layers):
        return False
    for layer in layers:
        layer.__class__ = GrowingLayer
        layer.capacity_hint = int(capacity_hint)
    return True
