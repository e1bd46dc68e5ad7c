"""Values read several times are realized once their bodies are costly: lowering stays linear in
the graph's size (inlining doubled per level here) and the kernel still fuses them."""

import time

import torch


from tests.kiln_backend import compiled, private_cache  # noqa: F401  (fixture)


def doubling_chain(x):
    for _ in range(24):  # inlined, each level would evaluate the previous one twice: 2**24 loads
        x = (x * x).sin() + x.cos()
    return x


def test_a_value_read_twice_per_level_is_realized_and_lowering_stays_linear():
    x = torch.randn(4, 16) * 0.1
    start = time.perf_counter()
    out, program = compiled(doubling_chain, x)
    assert time.perf_counter() - start < 60  # includes the C++ compile; inlined, it would never end
    torch.testing.assert_close(out, doubling_chain(x), rtol=1e-4, atol=1e-5)
    assert len(program.program.kernels) > 10  # realized along the chain
    assert len(program.schedule.kernels) == 1  # ... and fused back into one loop


def test_a_cheap_value_read_twice_is_recomputed_not_stored():
    fn = lambda x: (x + 1) * (x + 1) - (x + 1)  # noqa: E731
    _, program = compiled(fn, torch.randn(4, 16))
    assert len(program.program.kernels) == 1
