"""The memory plan: kernels' buffers reuse dead ones of the same layout, and every intermediate,
an extern's result included, is dropped right after its last reader, as eager drops it."""

import torch

from tests.kiln_backend import compiled, private_cache  # noqa: F401  (fixture)


def mlp(x, w1, w2, w3):
    h = torch.relu(torch.mm(x, w1))  # mm's result dies in the relu kernel
    g = torch.relu(torch.mm(h, w2))
    return torch.mm(g, w3)


def test_extern_results_are_dropped_after_their_last_reader():
    torch.manual_seed(0)
    inputs = [torch.randn(16, 32), torch.randn(32, 32), torch.randn(32, 32), torch.randn(32, 8)]
    out, program = compiled(mlp, *inputs)
    torch.testing.assert_close(out, mlp(*inputs))
    lines = program.python.splitlines()
    mm_results = [line.split("=")[0].strip() for line in lines if "= op" in line]
    assert len(mm_results) == 3
    for name in mm_results[:2]:  # the last one is the graph's output
        made = next(k for k, line in enumerate(lines) if line.strip().startswith(f"{name} = op"))
        freed = [k for k, line in enumerate(lines) if line.strip().startswith("del ") and name in line.split()]
        read = [k for k, line in enumerate(lines) if f"{name}.data_ptr()" in line]
        assert freed and read and made < max(read) < freed[0], program.python


def test_same_layout_buffers_are_reused_not_reallocated():
    torch.manual_seed(0)
    inputs = [torch.randn(16, 32), torch.randn(32, 32), torch.randn(32, 32), torch.randn(32, 8)]
    _, program = compiled(mlp, *inputs)
    assert program.schedule.memory.reuses  # the second relu writes into the first one's buffer
    assert program.python.count("empty_strided(") == 1
