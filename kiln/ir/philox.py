"""Counter-based random numbers: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as
1, 2, 3", 2011), the generator behind `ops.rand`.

`rand(seed, offset)` is a pure function of its two integers: the counter is the offset (low and
high 32 bits, then two zero words), the key the seed; ten rounds of the Philox S-box, and the first
output word's top 24 bits over 2^24 give a float32 in [0, 1). A kernel computes each element's
number from its flat position, so a dropout mask needs no random stream shared between threads,
and the same (seed, offset) gives the same number in C++ (include/kiln_scalar.h `kiln_rand`), in
Triton (the module's `kiln_rand`) and here, bit for bit: this is the reference evaluator's and
the eager fallback's implementation.
"""

from __future__ import annotations

import torch

ROUNDS = 10
MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
KEY_STEPS = (0x9E3779B9, 0xBB67AE85)
_WORD = 0xFFFFFFFF


def _multiply(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of a * m, for 32-bit a (int64 tensor) and m: in 16-bit halves, so
    no partial product leaves int64."""
    a_high, a_low = a >> 16, a & 0xFFFF
    m_high, m_low = m >> 16, m & 0xFFFF
    middle = a_high * m_low + a_low * m_high
    low_part = (middle << 16) + a_low * m_low
    return a_high * m_high + (low_part >> 32), low_part & _WORD


def philox_uniform(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """float32 uniforms in [0, 1), one per (seed, offset) pair (broadcast), both non-negative int64."""
    seed, offset = torch.broadcast_tensors(torch.as_tensor(seed, dtype=torch.int64),
                                           torch.as_tensor(offset, dtype=torch.int64, device=torch.as_tensor(seed).device))
    c0, c1 = offset & _WORD, (offset >> 32) & _WORD
    c2 = c3 = torch.zeros_like(offset)
    k0, k1 = seed & _WORD, (seed >> 32) & _WORD
    for _ in range(ROUNDS):
        high0, low0 = _multiply(c0, MULTIPLIERS[0])
        high1, low1 = _multiply(c2, MULTIPLIERS[1])
        c0, c1, c2, c3 = high1 ^ c1 ^ k0, low1, high0 ^ c3 ^ k1, low0
        k0, k1 = (k0 + KEY_STEPS[0]) & _WORD, (k1 + KEY_STEPS[1]) & _WORD
    return (c0 >> 8).to(torch.float32) * (1.0 / (1 << 24))
