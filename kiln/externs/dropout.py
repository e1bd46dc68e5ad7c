"""`kiln::philox_dropout(x, seed, p) -> (out, mask)`: training-mode dropout as a pure function of
a seed, which kernels compute in place (passes/dropout.py rewrites `aten.native_dropout` into it;
lowering/random.py lowers it into loops).

Element i is kept when `rand(seed, i) >= p` (kiln/ir/philox.py, i its row-major position), and
then scaled by 1 / (1 - p): the same mask on every code generator, and in this eager
implementation, which runs where a graph falls back to ATen. The mask is an output, as
native_dropout's, so the backward graph reads the forward's mask.
"""

from __future__ import annotations

import torch

from kiln.ir.philox import philox_uniform

_lib = torch.library.Library("kiln", "FRAGMENT")
_lib.define("philox_dropout(Tensor x, Tensor seed, float p) -> (Tensor, Tensor)")


def _philox_dropout(x: torch.Tensor, seed: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    positions = torch.arange(x.numel(), device=x.device).view(x.shape)
    keep = philox_uniform(seed.to(x.device), positions) >= p
    scaled = (x.float() * (1.0 / (1.0 - p))).to(x.dtype) if x.dtype in (torch.float16, torch.bfloat16) else x * (1.0 / (1.0 - p))
    return torch.where(keep, scaled, torch.zeros((), dtype=x.dtype, device=x.device)), keep


def _philox_dropout_fake(x: torch.Tensor, seed: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty(x.shape, dtype=torch.bool, device=x.device)


_lib.impl("philox_dropout", _philox_dropout, "CompositeExplicitAutograd")
torch.library.register_fake("kiln::philox_dropout", _philox_dropout_fake, lib=_lib)
