"""What CUDA graphs do where they cannot be used, checked without a GPU: recorded reasons, never a
silent change of behaviour; and how torch.compile's mode and options reach kiln's settings."""

import pytest
import torch

import kiln
from kiln.backend.backends import settings_for
from kiln.runtime import fallback
from kiln.runtime.cuda_graphs import CudaGraphed
from tests.kiln_backend import compiled, private_cache  # noqa: F401  (fixture)


def test_host_inputs_run_without_a_cuda_graph_and_say_why():
    fallback.reset()
    calls = []
    graphed = CudaGraphed(lambda x: calls.append(x) or (x * 2,), label="g")
    x = torch.randn(3)
    for _ in range(2):
        (out,) = graphed(x)
        torch.testing.assert_close(out, x * 2)
    assert len(calls) == 2
    reasons = [f.reason for f in fallback.FALLBACKS]
    assert len(reasons) == 1 and "not on a CUDA device" in reasons[0]  # recorded once, not per call


def test_modes_and_options_map_to_settings():
    assert settings_for("reduce-overhead", None) == {"backend.cuda_graphs": True}
    assert settings_for("max-autotune-no-cudagraphs", None) == {"backend.autotune": "max-autotune"}
    assert settings_for(None, {"cuda_graphs": True, "freezing": False}) == {"backend.cuda_graphs": True,
                                                                            "backend.freezing": False}
    with pytest.raises(ValueError, match="mode must be one of"):
        settings_for("fast", None)
    with pytest.raises(ValueError, match="unknown option 'cudagraphs'; accepted options: cuda_graphs"):
        settings_for(None, {"cudagraphs": True})


def test_torch_compile_passes_mode_to_kiln_on_cpu():
    model = torch.nn.Linear(4, 4).eval()
    x = torch.randn(2, 4)
    fallback.reset()
    with torch.no_grad():
        out = torch.compile(model, backend="kiln", mode="reduce-overhead")(x)
    torch.testing.assert_close(out, model(x))
    assert fallback.FALLBACKS == []  # a CPU graph is not CUDA-graphed, and nothing is recorded


def test_triton_gemm_setting_is_checked():
    with kiln.config.patch({"backend.codegen": "triton", "backend.triton_gemm": "sometimes"}):
        with pytest.raises(ValueError, match="backend.triton_gemm .KILN_TRITON_GEMM. must be one of auto, always, timed, never"):
            compiled(lambda a, b: (a @ b).relu(), torch.randn(4, 4), torch.randn(4, 4))


def test_a_kernel_triton_rejects_at_first_launch_runs_through_aten():
    class CompilationError(Exception):
        __module__ = "triton.compiler.errors"  # as Triton's own error

    fn = lambda x: (x.sin() + 1,)  # noqa: E731
    x = torch.randn(8)
    with kiln.config.patch({"backend.codegen": "triton"}):
        _, graph = compiled(fn, x)

    def rejected(*args):
        raise CompilationError("at 7:11: unsupported")

    graph.call, graph.eager, graph.first_run = rejected, lambda *a: fn(*a), None  # as before its first call
    fallback.reset()
    torch.testing.assert_close(graph(x)[0], fn(x)[0])
    torch.testing.assert_close(graph(x)[0], fn(x)[0])  # and from then on
    assert [f.reason for f in fallback.FALLBACKS] == ["CompilationError: at 7:11: unsupported"]
    assert graph.first_run is False


def test_a_first_call_that_eager_fails_too_raises_and_is_tried_again():
    fn = lambda x: (x.sin() + 1,)  # noqa: E731
    x = torch.randn(8)
    with kiln.config.patch({"backend.codegen": "triton"}):
        _, graph = compiled(fn, x)
    fallback.reset()

    def bad_input(*args):
        raise IndexError("index 9 is out of bounds")

    graph.call, graph.eager, graph.first_run = bad_input, bad_input, None
    with pytest.raises(IndexError, match="index 9"):  # the inputs' fault, as eager says: not a fallback
        graph(x)
    assert not fallback.FALLBACKS and graph.first_run is None
    graph.call = lambda *a: fn(*a)
    torch.testing.assert_close(graph(x)[0], fn(x)[0])
    assert graph.first_run is True and not fallback.FALLBACKS
