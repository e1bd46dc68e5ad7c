"""C++ kernels from the loop IR, compiled and run, against eager (and kernel counts, code text)."""

import pytest
import torch
from torch import fx

import kiln
from kiln import aot
from kiln.codegen.wrapper import CppProgram, compile_cpp


@pytest.fixture(autouse=True)
def private_cache(tmp_path):
    with kiln.config.patch({"cache.dir": str(tmp_path / "cache")}):
        yield tmp_path / "cache"


def compiled(fn, *inputs):
    programs = []

    def compile_graph(gm, example_inputs):
        programs.append(compile_cpp(gm, example_inputs))
        return programs[-1]

    out = aot.compile(fx.symbolic_trace(fn), list(inputs), compile_graph)(*inputs)
    return out, programs[0]


def softmax(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


CASES = {
    "pointwise chain": (lambda x, y: (x.sin() + y).relu() * 2 - x.exp() / 3, [torch.randn(64, 65), torch.randn(65)]),
    "promotion": (lambda i, f: (i + f, i / 2, i > f, torch.where(f > 0, i, 0.5)), [torch.arange(12).reshape(3, 4), torch.randn(3, 4)]),
    "views": (lambda x: x.permute(2, 0, 1).reshape(4, 6)[1:, ::2] * 3, [torch.randn(2, 3, 4)]),
    "softmax": (softmax, [torch.randn(33, 129)]),
    "reductions": (lambda x: (x.sum(), x.mean(1), x.amin((0, 2), keepdim=True), x.amax(-1)), [torch.randn(5, 6, 7)]),
    "matmul epilogue": (lambda x, w: torch.nn.functional.gelu(x @ w) + 1, [torch.randn(8, 16), torch.randn(16, 32)]),
    "strided input": (lambda x: x * 2 + 1, [torch.randn(6, 8).t()[2:5]]),
    "nan and inf": (lambda x: (x.amax(-1), torch.maximum(x, torch.zeros(()))), [torch.tensor([[1.0, float("nan")], [float("-inf"), 2.0]])]),
    "large (parallel)": (lambda x: (x * x).sum(-1), [torch.randn(512, 256)]),
}


@pytest.mark.parametrize("name", CASES)
def test_matches_eager(name):
    fn, inputs = CASES[name]
    out, _ = compiled(fn, *inputs)
    torch.testing.assert_close(out, fn(*inputs), equal_nan=True)


def test_softmax_code_has_three_kernels_and_no_externs():
    _, program = compiled(softmax, torch.randn(4, 8))
    assert len(program.program.kernels) == 3 and not program.program.externs
    assert program.source.count('extern "C" void kernel_') == 3
    assert "std::exp" in program.source and "kiln_max(acc" in program.source


def test_second_build_loads_from_the_cache_and_a_corrupt_entry_is_rebuilt(private_cache):
    fn, inputs = CASES["pointwise chain"]
    _, first = compiled(fn, *inputs)
    (entry,) = private_cache.glob("cpp/*/*.so")
    stamp = entry.stat().st_mtime_ns
    _, second = compiled(fn, *inputs)
    assert entry.stat().st_mtime_ns == stamp  # loaded, not rebuilt
    entry.unlink()  # a new file: the loaded library keeps its own mapping
    entry.write_bytes(b"not a shared library")
    out, third = compiled(fn, *inputs)
    torch.testing.assert_close(out, fn(*inputs))
    assert entry.read_bytes()[:4] == b"\x7fELF"  # rebuilt in place


def test_symbolic_sizes_are_declined():
    import torch._dynamo

    def backend(gm, example_inputs):
        return aot.compile(gm, example_inputs, compile_cpp)

    torch._dynamo.reset()
    with pytest.raises(Exception, match="symbolic sizes"):
        torch.compile(lambda x: x * 2, backend=backend, dynamic=True)(torch.randn(3))


def test_torch_compile_backend_kiln_runs_a_model():
    import torch._dynamo
    from kiln.runtime import fallback

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)).eval()
    x = torch.randn(4, 16)
    torch._dynamo.reset()
    fallback.reset()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="kiln")(x), model(x))
    assert not fallback.FALLBACKS
