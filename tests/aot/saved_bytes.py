"""Activation memory kept for backward: eager autograd vs kiln's partition, on a benchmark model.

`python -m tests.aot.saved_bytes bert` prints both figures; the test runs it on bert-tiny.
Parameters and inputs are alive anyway and are not counted on either side.
"""

from __future__ import annotations

import sys

import torch
import torch._dynamo

from kiln import aot
from benchmarks.models import MODELS
from benchmarks.worker import _loss
from kiln.backend import run_as_is


def _storages(tensors) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors}


def eager_saved_bytes(model, inputs: dict) -> int:
    """Bytes of the distinct storages autograd saves for backward, parameters and inputs excluded."""
    alive = _storages([*model.parameters(), *model.buffers(), *inputs.values()])
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in alive:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _loss(model(**inputs)).backward()
    return sum(saved.values())


def kiln_saved_bytes(model, inputs: dict) -> tuple[int, int]:
    """(activation bytes saved by kiln's partitions, number of graphs), inputs and parameters excluded."""
    compiled = []

    def backend(gm, example_inputs):
        compiled.append(aot.compile(gm, example_inputs, run_as_is))
        return compiled[-1]

    torch._dynamo.reset()
    _loss(torch.compile(model, backend=backend)(**inputs)).backward()
    return sum(c.partition.activation_bytes for c in compiled), len(compiled)


def main(name: str) -> None:
    spec = MODELS[name]
    eager = eager_saved_bytes(spec.build(True), spec.make_inputs())
    kiln_bytes, graphs = kiln_saved_bytes(spec.build(True), spec.make_inputs())
    print(f"{name}: eager autograd saves {eager / 2**20:.2f} MiB of activations; "
          f"kiln saves {kiln_bytes / 2**20:.2f} MiB over {graphs} graph(s) ({kiln_bytes / eager:.2f}x)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bert")
