from tests.aot.saved_bytes import eager_saved_bytes, kiln_saved_bytes
from benchmarks.models import MODELS


def test_partition_saves_no_more_activations_than_eager_on_bert():
    spec = MODELS["bert-tiny"]
    eager = eager_saved_bytes(spec.build(True), spec.make_inputs())
    kiln_bytes, graphs = kiln_saved_bytes(spec.build(True), spec.make_inputs())
    assert graphs >= 1 and eager > 0
    assert 0 < kiln_bytes <= eager, (kiln_bytes, eager)
