"""C++ kernels from the loop IR, compiled and run, against eager (and kernel counts, code text)."""

import pytest
import torch

import kiln
from kiln.passes import pipeline


from tests.kiln_backend import compiled, private_cache  # noqa: F401  (fixture)


def softmax(x):
    e = (x - x.amax(-1, keepdim=True)).exp()
    return e / e.sum(-1, keepdim=True)


torch.manual_seed(0)  # the cases' inputs, the same in every run
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
    "bfloat16": (lambda x, y: (softmax(x.float()).to(torch.bfloat16), (x * y).sum(-1), x.amax(0), (x + 1).to(torch.float32)),
                 [torch.randn(20, 37).to(torch.bfloat16), torch.randn(37).to(torch.bfloat16)]),
    "float16": (lambda x: ((x * 2).exp(), x.sum(-1), x.to(torch.float32) + 1), [torch.randn(9, 40).to(torch.float16)]),
    "bool and int": (lambda x, m: (torch.where(m, x, -x), (x > 0).sum(-1), m.any(-1), (x.int() * 3 + m.int()) // 2),
                     [torch.randn(12, 33) * 4, torch.randn(12, 33) > 0]),
}


# kiln keeps a bfloat16 product in float32 until it is stored (lowering/values.py LOW_PRECISION);
# eager rounds each of the 37 products before summing them: the sums differ by those roundings.
TOLERANCES = {"bfloat16": {"rtol": 1.6e-2, "atol": 2e-2}}


@pytest.mark.parametrize("name", CASES)
def test_matches_eager(name):
    fn, inputs = CASES[name]
    out, _ = compiled(fn, *inputs)
    torch.testing.assert_close(out, fn(*inputs), equal_nan=True, **TOLERANCES.get(name, {}))


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


def test_symbolic_sizes_are_specialized_per_call_sizes():
    import torch._dynamo
    from kiln.runtime import fallback

    torch._dynamo.reset()
    fallback.reset()
    fn = torch.compile(lambda x, y: (x * 2 + y).softmax(-1), backend="kiln", dynamic=True)
    for n in (3, 5, 3, 9):
        x, y = torch.randn(n, 7), torch.randn(7)
        torch.testing.assert_close(fn(x, y), (x * 2 + y).softmax(-1))
    assert not fallback.FALLBACKS


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


def test_debug_dir_gets_every_backend_stage(tmp_path):
    with kiln.config.patch({"debug.dump_dir": str(tmp_path / "dump")}):
        compiled(lambda x: (x - x.amax(-1, keepdim=True)).exp(), torch.randn(4, 8))
    (folder,) = (tmp_path / "dump").glob("run_*/*_kiln_backend")
    files = sorted(p.name for p in folder.iterdir())
    rewrites = [name for name, _ in pipeline.REWRITES]
    stages = ["aten_graph.py", *(f"pass_{name}.py" for name in rewrites),
              "ir_before_fusion.txt", "ir_after_fusion.txt", "kernels.cpp", "wrapper.py", "wrapper.cpp"]
    assert files == [f"{k:02d}_{stage}" for k, stage in enumerate(stages)]
    for k, name in enumerate(rewrites, start=1):  # each pass's dump names the pass
        assert (folder / files[k]).read_text().startswith(f"# after pass {name}")
    after = (folder / files[-4]).read_text()
    assert "in registers ['buf0']" in after and "reduction" in after
    assert 'extern "C" void kernel_' in (folder / files[-3]).read_text()
    assert 'extern "C" int kiln_graph_call' in (folder / files[-1]).read_text()  # the wrapper that runs


def test_many_kernels_compile_as_parallel_units_into_one_library():
    def many(x):
        return tuple((x * k).sum(d) for k in range(1, 5) for d in (0, 1)) + (x.exp(),)

    x = torch.randn(6, 7)
    with kiln.config.patch({"backend.compile_workers": 2}):
        out, program = compiled(many, x)
    assert len(program.units) == 2, len(set(program.functions.values()))
    torch.testing.assert_close(out, many(x))


def test_complex_tensors_run_as_aten_calls_without_falling_back():
    import torch._dynamo
    from kiln.runtime import fallback

    torch._dynamo.reset()
    fallback.reset()
    fn = torch.compile(lambda x, y: ((x * 2).abs() + y).softmax(-1), backend="kiln")
    x, y = torch.randn(4, 3, dtype=torch.complex64), torch.randn(4, 3)
    torch.testing.assert_close(fn(x, y), ((x * 2).abs() + y).softmax(-1))
    assert not fallback.FALLBACKS


def test_reshaping_an_empty_tensor():
    x = torch.randn(1, 0, 1, 1)
    out, _ = compiled(lambda x: torch.nn.functional.pixel_shuffle(x, 1) + 1, x)
    assert out.shape == (1, 0, 1, 1)


def test_bool_orders_and_max_min_in_vector_lanes():
    # Found by the graph fuzzer: a comparison or max/min of two bool tensors did not compile (a
    # mask's lanes are -1 for true, so their integer order is the reverse of false < true).
    a, b = torch.randn(3, 37) > 0, torch.randn(3, 37) > 0
    fn = lambda a, b: (a > b, a <= b, a < b, a >= b, torch.maximum(a, b), torch.minimum(a, b),  # noqa: E731
                       torch.clamp(a, max=b), a.amax(-1), a.amin(0))
    out, _ = compiled(fn, a, b)
    for got, want in zip(out, fn(a, b)):
        assert torch.equal(got, want)


def test_scalar_sign_keeps_its_type():
    # Found by the graph fuzzer: the scalar loop's sign was an int, so max(sign(x), -4.0f) did
    # not compile (a tensor of 2 floats runs only the scalar loop; 37 also runs the vector one).
    fn = lambda x: (torch.sign(x).clamp(-4, 4).expm1(), torch.sign(x.long()) * 3)  # noqa: E731
    for n in (2, 37):
        x = torch.randn(n)
        out, _ = compiled(fn, x)
        for got, want in zip(out, fn(x)):
            torch.testing.assert_close(got, want)
        assert not kiln.runtime.fallback.FALLBACKS


def test_gather_through_a_flipped_reshape_indexes_with_floor_semantics():
    # Found by the graph fuzzer: flip(reshape(x)) reads x at 4*((7 - k) // 4) + Mod(7 - k, 4), which
    # sympy turns into Mod(3 - k, 4); C++'s % of a negative number is not that (wrong elements).
    x, i = torch.randn(2, 4), torch.tensor([0, 1, 2, 3, 7, 6, 5, 4])
    fn = lambda x, i: (x.reshape(8).flip(0).index_select(0, i), x.reshape(8).flip(0)[i[:3]])  # noqa: E731
    out, _ = compiled(fn, x, i)
    for got, want in zip(out, fn(x, i)):
        assert torch.equal(got, want)


def test_the_same_layer_twice_is_one_function():
    # As for Triton (tests/codegen/test_triton.py): locals named by their member's place, so the
    # two layers' kernels print one text, one C++ function compiled once.
    from tests.codegen.test_triton import SAME_LAYER_INPUTS, same_layer_twice

    inputs = [torch.randn(shape) for shape in SAME_LAYER_INPUTS]
    out, graph = compiled(same_layer_twice, *inputs)
    torch.testing.assert_close(out, same_layer_twice(*inputs), atol=1e-5, rtol=1e-5)
    norms = [k for k in graph.schedule.kernels if k.locals]
    assert len(norms) == 2
    kernels = graph.stages.kernels
    assert kernels.functions[norms[0].name] == kernels.functions[norms[1].name] and len(kernels.sources) == 1
