"""benchmarks/tools/sm90_compile_cost.py: a GPU graph's Triton module printed on CPU tensors as for a
GPU and compiled for sm_90 under the stand-in driver."""

import torch

import kiln.backend.codegens as codegens
import kiln.runtime.compiled_graph as compiled_graph
from benchmarks.tools.sm90_compile_cost import compile_cost, module_sources
from kiln.runtime import fallback
from tests.kiln_backend import private_cache  # noqa: F401  (fixture)


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.LayerNorm(32))
                                          for _ in range(2))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x) + x
        return x


def test_a_models_module_is_taken_and_compiled_for_sm_90(private_cache):  # noqa: F811
    torch.manual_seed(0)
    fallback.reset()
    tuning, load = codegens.triton_tuning, compiled_graph.load_module
    model = TwoLayers().eval().to(torch.bfloat16)
    (source,) = module_sources(model, {"x": torch.randn(8, 32, dtype=torch.bfloat16)})
    assert (codegens.triton_tuning, compiled_graph.load_module) == (tuning, load)  # put back
    assert len(fallback.FALLBACKS) == 1  # (the graph ran eagerly once its module was taken)
    assert "@triton.autotune" in source  # block sizes autotuned, as on a GPU
    cost = compile_cost(source, workers=1)
    # Two kernels, each a layer norm of a product's result plus its residual (the first layer's
    # residual a graph input, the second's its output: two texts); each one jit function.
    assert (cost.launchers, cost.jit_functions) == (2, 2) and cost.seconds > 0
