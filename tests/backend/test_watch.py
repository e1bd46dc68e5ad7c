"""`kiln.backend.watch()`: what the backends the doors build for themselves return, seen from a
test without building a Backend of its own."""

import torch

import kiln
from kiln.backend import driver, watch
from kiln.runtime.compiled_graph import CompiledGraph
from tests.kiln_backend import private_cache  # noqa: F401  (fixture)


def test_watch_sees_each_graph_built_in_its_block_and_nothing_after():
    def f(x):
        return torch.relu(x) + 1

    x = torch.randn(4, 8)
    with watch() as outer:
        with watch() as inner:
            torch.testing.assert_close(kiln.compile(f)(x), f(x))
        assert len(inner) == 1 and isinstance(inner[0], CompiledGraph)
    assert outer == inner
    assert not driver.WATCHERS
    with watch() as later:
        kiln.compile(lambda x: torch.sigmoid(x) * 2)(x)
    assert len(later) == 1 and len(outer) == 1  # built after the block: not seen by it
