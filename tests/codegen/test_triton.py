"""Triton kernels from the loop IR (`backend.codegen = "triton"`), run on CPU tensors by Triton's
interpreter against eager, and every kernel also compiled for an H100 (sm_90) by Triton's
compiler, which rejects code the interpreter accepts."""

import pytest
import torch

import kiln
from kiln.backend.driver import choose_codegen
from kiln.runtime import fallback
from kiln.runtime.triton_kernels import build_for_gpu
from tests.codegen.test_cpp import CASES, TOLERANCES
from tests.kiln_backend import compiled, private_cache  # noqa: F401  (fixture)

import triton  # noqa: F401  (a test requirement: missing, these tests fail)


def triton_compiled(fn, *inputs):
    """(outputs, graph) through Triton kernels, none of which failed in its first call (that
    would make the graph run through ATen and compare ATen's result)."""
    fallback.reset()
    with kiln.config.patch({"backend.codegen": "triton"}):
        result = compiled(fn, *inputs)
    assert not fallback.FALLBACKS, [str(f) for f in fallback.FALLBACKS]
    return result


def assert_builds_for_h100(graph) -> None:
    kernels = graph.stages.kernels
    functions = [f for group in kernels.jit.values() for f in group]
    built = build_for_gpu(kernels.source, functions)
    assert set(built) == {f.name for f in functions}
    assert all(len(cubin) > 0 for cubin in built.values())


@pytest.mark.parametrize("name", CASES)
def test_matches_eager_and_builds_for_an_h100(name):
    fn, inputs = CASES[name]
    out, graph = triton_compiled(fn, *inputs)
    torch.testing.assert_close(out, fn(*inputs), equal_nan=True, **TOLERANCES.get(name, {}))
    assert graph.artifact.codegen == "triton"
    assert_builds_for_h100(graph)


torch.manual_seed(0)
# A few long rows: reduced in parts in parallel, then folded (a GPU runs one program per row on one
# multiprocessor otherwise).
SPLIT = {
    "sum of everything": (lambda x: x.sum(), [torch.randn(300000)]),
    "mean of three rows": (lambda x: x.mean(1), [torch.randn(3, 100000)]),
    "row max, then pointwise": (lambda x: (x.amax(1) * 2).exp(), [torch.randn(2, 70000)]),
    "any": (lambda x: (x > 4.0).any(), [torch.randn(200000)]),
    "all": (lambda x: (x > -9.0).all(), [torch.randn(200000)]),
    "int64 min": (lambda x: x.min(), [torch.randint(-1000, 1000, (100000,))]),
    "bfloat16 sum": (lambda x: x.sum(), [torch.randn(100000).bfloat16()]),
}


@pytest.mark.parametrize("name", SPLIT)
def test_a_few_long_rows_are_reduced_in_parts(name):
    fn, inputs = SPLIT[name]
    out, graph = triton_compiled(fn, *inputs)
    torch.testing.assert_close(out, fn(*inputs), rtol=1e-5, atol=1e-3 if name != "bfloat16 sum" else 2.0)
    assert "_partial" in graph.source and "partials = torch.empty" in graph.source
    assert_builds_for_h100(graph)


VARIANCE = {  # name -> (function, inputs, loops over the row)
    "var of long rows": (lambda x: torch.var(x, 1), [torch.randn(3, 10000) * 3 + 100], 1),
    "var_mean of long rows": (lambda x: torch.var_mean(x, 1, correction=0), [torch.randn(5, 9000) + 1000], 1),
    "layer norm of long rows": (lambda x, w, b: torch.layer_norm(x, (6000,), w, b),
                                [torch.randn(4, 6000) * 5 + 3, torch.randn(6000), torch.randn(6000)], 2),
    "bfloat16 var": (lambda x: torch.var(x, 1), [torch.randn(2, 8000).bfloat16()], 1),
    "group norm": (lambda x: torch.group_norm(x, 2), [torch.randn(2, 4, 50, 50)], 1),
    "std of short rows": (lambda x: torch.std(x, -1), [torch.randn(7, 100)], 0),  # in registers: two passes there
    "var of empty rows": (lambda x: torch.var(x, 1), [torch.randn(3, 0)], 0),
}


@pytest.mark.parametrize("name", VARIANCE)
def test_variance_reads_a_long_row_once(name):
    # A `welford` reduction on Triton: the mean's sum and Welford's update share one loop over the
    # row (a layer norm's output is a second); C++ kernels compute the mean first, as before.
    fn, inputs, loops = VARIANCE[name]
    out, graph = triton_compiled(fn, *inputs)
    torch.testing.assert_close(out, fn(*inputs), rtol=1e-4, atol=1e-4, equal_nan=True)
    source = graph.stages.kernels.source
    assert source.count("for roffset") == loops
    assert ("kiln_welford_combine)" in source) == (loops > 0)
    _, cpp = compiled(fn, *inputs)
    assert "welford" not in str([m.node for k in cpp.schedule.kernels for m in k.members if m.is_reduction])
    assert_builds_for_h100(graph)


def test_many_rows_or_short_rows_are_not_split():
    for fn, x in [(lambda x: x.sum(1), torch.randn(64, 70000)), (lambda x: x.sum(), torch.randn(60000))]:
        out, graph = triton_compiled(fn, x)
        torch.testing.assert_close(out, fn(x), rtol=1e-5, atol=1e-3)
        assert "_partial" not in graph.source


@pytest.mark.parametrize("name", ["pointwise chain", "softmax", "reductions", "bool and int"])
def test_same_kernels_as_the_cpp_path(name):
    # Fusion is decided before code generation: both printers get the same kernels.
    fn, inputs = CASES[name]
    _, cpp = compiled(fn, *inputs)
    _, tri = triton_compiled(fn, *inputs)
    assert len(tri.kernels) == len(cpp.kernels)
    assert tri.artifact.codegen == "triton" and cpp.artifact.codegen == "cpp"


INDEXING = {
    "embedding": (lambda w, i: torch.nn.functional.embedding(i, w) * 2, [torch.randn(10, 6), torch.tensor([[1, 9, 0], [0, 3, 3]])]),
    "gather": (lambda x, i: torch.gather(x, 1, i) + 1, [torch.randn(4, 7), torch.randint(0, 7, (4, 3))]),
    "index_put accumulate": (lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True),
                             [torch.zeros(5, 3), torch.tensor([0, 2, 2, 4]), torch.randn(4, 3)]),
    "scatter_add": (lambda x, i, s: x.scatter_add(0, i, s), [torch.randn(4, 5), torch.randint(0, 4, (6, 5)), torch.randn(6, 5)]),
    "index_put": (lambda x, i, v: torch.index_put(x, (i,), v), [torch.randn(6, 2), torch.tensor([5, 1]), torch.randn(2, 2)]),
    "argmax and argmin": (lambda x: (x.argmax(-1), x.argmin(0)),
                          [torch.tensor([[1.0, 3.0, 3.0, -1.0], [float("nan"), 2.0, float("nan"), 0.0], [2.0, 2.0, 2.0, 2.0]])]),
    "integer division and shifts": (lambda a, b: (a // b, a % b, a << (b % 5), a >> (b % 5), a ** (b % 3)),
                                    [torch.arange(-12, 12).reshape(4, 6), torch.tensor([5, -3, 7, 2, -4, 9])]),
    "prod and all": (lambda x: (x.prod(-1), (x > 0).all(-1), (x > 1).any(0), x.any()), [torch.randn(6, 9)]),
    "reductions over nothing": (lambda x: (torch.var_mean(x, False), x.sum(), x.prod()),
                                [torch.empty(0)]),
    # no rows at all: nothing is launched (a program would read the empty tensor's null pointer)
    "empty outer loops": (lambda x, y: (y[:, None] - x[None, :], (y[:, None] * x).sum(-1)), [torch.randn(5), torch.empty(0)]),
    "bool max and min": (lambda m: (m.amax(-1), m.amin(0)), [torch.randn(5, 7) > 0]),
    # written as Triton helpers (libdevice has neither), with eager's poles, signed zeros, infinities
    "digamma and trigamma": (lambda x: (torch.digamma(x), torch.polygamma(1, x), torch.polygamma(1, x.double())),
                             [torch.tensor([0.0, -0.0, -1.0, -2.5, 0.3, 1e-8, 3.7, 12.5, 1e4, float("inf"),
                                            float("-inf"), float("nan"), -0.5, -7.25])]),
    # exp-scaled Bessel functions: libdevice's I0 and I1 below 700, the asymptotic series beyond
    "i0e and i1e": (lambda x: (torch.special.i0e(x), torch.special.i1e(x), torch.special.i1e(x.double())),
                    [torch.tensor([0.0, -0.0, 1e-8, 0.5, -3.0, 20.0, 699.0, 701.0, -1e4, 3e38, float("inf"),
                                   float("-inf"), float("nan")])]),
    # no atomic for these: one source element at a time
    "scatter_reduce prod": (lambda x, i, s: x.scatter_reduce(0, i, s, "prod"), [torch.randn(3, 4), torch.randint(0, 3, (5, 4)), torch.randn(5, 4)]),
    "bfloat16 index_add": (lambda x, i, s: x.index_add(0, i, s), [torch.randn(4, 3).bfloat16(), torch.tensor([0, 3, 3]), torch.randn(3, 3).bfloat16()]),
    "scalar operands": (lambda x, y: (torch.logical_and(x, y), x.pow(y), torch.maximum(x, y)), [torch.randn(5), torch.tensor(1.5)]),
}


@pytest.mark.parametrize("name", INDEXING)
def test_indexing_and_integer_ops_match_eager(name):
    fn, inputs = INDEXING[name]
    out, graph = triton_compiled(fn, *inputs)
    torch.testing.assert_close(out, fn(*inputs), equal_nan=True)
    assert_builds_for_h100(graph)


def test_bfloat16_rounds_to_nearest_even_as_eager():
    # Triton's interpreter truncates float32 to bfloat16; kiln's kernels round themselves.
    x = torch.randn(4096) * 100
    x[:4] = torch.tensor([float("nan"), float("inf"), -0.0, 3.3895e38])
    fn = lambda x: (x.bfloat16(), (x * 3).bfloat16().float() + 1)  # noqa: E731
    out, graph = triton_compiled(fn, x)
    for got, want in zip(out, fn(x)):
        assert torch.equal(got.float().nan_to_num(), want.float().nan_to_num()) and got.dtype == want.dtype
    assert_builds_for_h100(graph)



CAST_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
               torch.bfloat16, torch.float32, torch.float64]


def _cast_source(dtype):
    """Values of `dtype` that round when cast to 16 bits: wide integers past float32's 24-bit
    mantissa, floats with more digits than bfloat16 keeps."""
    torch.manual_seed(1)
    if dtype == torch.bool:
        return torch.rand(4, 16) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(4, 16) * 300).to(dtype)
    info = torch.iinfo(dtype)
    wide = torch.randint(max(info.min, -(2**40)), min(info.max, 2**40), (4, 16), dtype=torch.int64)
    return wide.to(dtype)


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("dtype", CAST_DTYPES, ids=str)
def test_every_cast_into_and_out_of_16_bit_floats_matches_eager(half, dtype):
    # Fused with a layer norm as in the H200 report (an int32 mask cast to bfloat16 came out as
    # its bits read as a float; other widths failed to compile): each cast into `half` from
    # `dtype`, and out of `half` into `dtype`, bit for bit as eager (through float32 both ways).
    def fn(x, m):
        return torch.nn.functional.layer_norm(x, (16,)) * m.to(half), (x.abs() * 3).to(dtype)

    # (|x| * 3 within int8's range: a float out of an integer's range converts to no defined value)
    x, m = (torch.randn(4, 16) * 30).clamp(-40, 40).to(half), _cast_source(dtype)
    out, graph = triton_compiled(fn, x, m)
    for got, want in zip(out, fn(x, m)):
        assert got.dtype == want.dtype and torch.equal(got, want)
    assert len(graph.stages.kernels.jit) == 1  # the casts inside the layer norm's kernel
    assert_builds_for_h100(graph)


GEMM_EPILOGUES = {
    "bias and gelu": (lambda x, w, b: torch.nn.functional.gelu(x @ w + b), [torch.randn(40, 70), torch.randn(70, 33), torch.randn(33)]),
    "residual, transposed weight": (lambda x, w, r: (x @ w.t()) + r, [torch.randn(8, 16), torch.randn(24, 16), torch.randn(8, 24)]),
    "bfloat16 relu and cast": (lambda x, w: torch.relu(x @ w).float(), [torch.randn(20, 32).bfloat16(), torch.randn(32, 48).bfloat16()]),
    "float16": (lambda x, w: (x @ w) * 0.5, [torch.randn(17, 24).half(), torch.randn(24, 9).half()]),
    "linear on a 3-d input": (lambda x, w, b: torch.tanh(torch.nn.functional.linear(x, w, b)),
                              [torch.randn(2, 5, 16), torch.randn(12, 16), torch.randn(12)]),
    # 10 rows of 64-row tiles (a group of 8 and a last group of 2) by 3 columns, K a multiple of
    # the K step: every tile of the grouped order once, the K loop without its mask.
    "tiles in groups, K even": (lambda x, w: torch.relu(x @ w), [torch.randn(600, 64), torch.randn(64, 130)]),
}
GEMM_TOLERANCES = {"bfloat16 relu and cast": {"atol": 2e-2, "rtol": 2e-2}, "float16": {"atol": 2e-3, "rtol": 2e-3}}


@pytest.mark.parametrize("name", GEMM_EPILOGUES)
def test_a_product_and_its_epilogue_are_one_kernel(name):
    fn, inputs = GEMM_EPILOGUES[name]
    out, graph = triton_compiled(fn, *inputs)
    torch.testing.assert_close(out, fn(*inputs), **GEMM_TOLERANCES.get(name, {"atol": 1e-4, "rtol": 1e-4}))
    (kernel,) = graph.schedule.kernels
    assert kernel.gemm is not None and graph.schedule.externs == []
    assert "tl.dot(" in graph.stages.kernels.source
    assert_builds_for_h100(graph)


def test_a_product_read_elsewhere_stays_a_library_call():
    # Returned as well as consumed: it must be stored, so the GEMM stays an extern (as on CPU).
    def fn(x, w):
        y = x @ w
        return y, torch.relu(y)

    x, w = torch.randn(8, 16), torch.randn(16, 8)
    out, graph = triton_compiled(fn, x, w)
    torch.testing.assert_close(out, fn(x, w))
    assert all(k.gemm is None for k in graph.schedule.kernels) and len(graph.schedule.externs) == 1


@pytest.mark.parametrize("name", ["bias and gelu", "residual, transposed weight", "bfloat16 relu and cast"])
def test_a_timed_product_kernel_keeps_the_faster_of_template_and_library(name):
    # backend.triton_gemm=timed (auto's choice on a GPU): both forms are printed; the first call
    # times them and keeps one. Each must match eager; the answer is kept in the autotune cache.
    from kiln.autotune.choose import COUNTS, clear_memory

    fn, inputs = GEMM_EPILOGUES[name]
    tolerance = GEMM_TOLERANCES.get(name, {"atol": 1e-4, "rtol": 1e-4})
    with kiln.config.patch({"backend.triton_gemm": "timed"}):
        out, graph = triton_compiled(fn, *inputs)
    torch.testing.assert_close(out, fn(*inputs), **tolerance)
    (kernel,) = graph.schedule.kernels
    launcher = graph.kernels[kernel.name]
    module, name_in_module = launcher.__globals__, launcher.__name__
    choice = module[f"{name_in_module}_choice"]
    assert len(choice) == 1  # chosen at the first call
    chosen = choice[0]
    for form in ("template", "library"):
        choice[0] = module[f"{name_in_module}_{form}"]
        torch.testing.assert_close(graph(*inputs)[0], fn(*inputs), **tolerance)
    choice[0] = chosen
    clear_memory()
    counts = dict(COUNTS)
    with kiln.config.patch({"backend.triton_gemm": "timed"}):
        triton_compiled(fn, *inputs)  # the same kernel in a new graph: answered from the cache
    assert COUNTS["cached"] == counts["cached"] + 1 and COUNTS["measured"] == counts["measured"]
    assert_builds_for_h100(graph)


def test_a_timed_product_kernel_writing_over_its_input_is_timed_on_a_copy():
    # The second product (a library call: one template per kernel) dies at the kernel, which writes
    # its result over it: timing runs the kernel many times, so its outputs are put back first.
    def fn(x, w, y, v):
        return torch.relu(x @ w) + y @ v

    inputs = torch.randn(12, 20), torch.randn(20, 16), torch.randn(12, 8), torch.randn(8, 16)
    with kiln.config.patch({"backend.triton_gemm": "timed"}):
        out, graph = triton_compiled(fn, *inputs)
    (kernel,) = graph.schedule.kernels
    assert kernel.gemm is not None and kernel.overwrites
    torch.testing.assert_close(out, fn(*inputs), atol=1e-4, rtol=1e-4)


def test_the_product_template_setting():
    from kiln.backend.codegens import CODEGENS
    from kiln.ir.target import Target
    from kiln.schedule.scheduler import gemm_template_mode

    triton = CODEGENS["triton"].traits
    gpu, cpu = Target("cuda", triton, frozenset()), Target("cpu", triton, frozenset())
    assert gemm_template_mode(cpu) == "fused" and gemm_template_mode(gpu) == "timed"
    with kiln.config.patch({"backend.autotune": "off"}):
        assert gemm_template_mode(gpu) == "never"  # nothing timed: the library's product
    for setting, mode in (("always", "fused"), ("timed", "timed"), ("never", "never")):
        with kiln.config.patch({"backend.triton_gemm": setting}):
            assert gemm_template_mode(gpu) == gemm_template_mode(cpu) == mode
    with kiln.config.patch({"backend.triton_gemm": "sometimes"}):
        with pytest.raises(ValueError, match="backend.triton_gemm .* must be one of auto, always, timed, never; got 'sometimes'"):
            gemm_template_mode(gpu)


def test_one_jit_function_serves_every_batch_size():
    # The rows are an argument (`xnumel`), named by the jit function's own text: a new batch size
    # gives new launchers over the same jit functions, so Triton compiles nothing new for a GPU.
    def fn(x, w, b):
        y = torch.nn.functional.gelu(x @ w + b)
        return torch.softmax(y, -1), torch.tanh(x @ w.t()[:, :16].t())

    names = []
    for rows in (32, 48):
        inputs = torch.randn(rows, 16), torch.randn(16, 24), torch.randn(24)
        out, graph = triton_compiled(fn, *inputs)
        torch.testing.assert_close(out, fn(*inputs), atol=1e-5, rtol=1e-5)
        names.append({f.name: f.source for fs in graph.stages.kernels.jit.values() for f in fs})
    assert any(k.gemm is not None for k in graph.schedule.kernels)  # a product template among them
    assert names[0] == names[1] and len(names[0]) == len(graph.schedule.kernels) == 2


def same_layer_twice(x, m, w, b, r0, r1):
    """Two layers of one shape (a product, then a layer norm of it plus a residual), whose
    kernels keep the norm's statistics in locals."""
    h = x
    for residual in (r0, r1):
        h = torch.nn.functional.layer_norm(h @ m + residual, (16,), w, b)
    return h


SAME_LAYER_INPUTS = (16, 16), (16, 16), (16,), (16,), (16, 16), (16, 16)


def test_the_same_layer_twice_is_one_jit_function():
    # Locals are named by their member's place in the kernel, not by their buffer (which differs
    # per layer): the two layers print one text, one launcher over one jit function, compiled
    # once for a GPU (a 12-layer BERT's module had 38 launchers; 4 since).
    inputs = [torch.randn(shape) for shape in SAME_LAYER_INPUTS]
    with kiln.config.patch({"backend.triton_gemm": "never"}):
        out, graph = triton_compiled(same_layer_twice, *inputs)
    torch.testing.assert_close(out, same_layer_twice(*inputs), atol=1e-5, rtol=1e-5)
    norms = [k for k in graph.schedule.kernels if k.locals]
    assert len(norms) == 2
    kernels = graph.stages.kernels
    assert kernels.functions[norms[0].name] == kernels.functions[norms[1].name]
    assert len(kernels.launchers) == 1 and len(kernels.kernels) == 1


def test_an_index_out_of_range_raises_and_the_next_call_runs():
    fn = lambda w, i: torch.nn.functional.embedding(i, w) + 1  # noqa: E731
    w = torch.randn(10, 4)
    _, graph = triton_compiled(fn, w, torch.tensor([1, 2]))
    assert graph.artifact.codegen == "triton"
    with pytest.raises(IndexError, match="index out of range"):
        graph(w, torch.tensor([3, 10]))
    torch.testing.assert_close(graph(w, torch.tensor([3, 9]))[0], fn(w, torch.tensor([3, 9])))


def test_an_op_libdevice_lacks_is_an_aten_call_inside_the_compiled_graph():
    # igamma has no Triton code: it is lowered as an extern call, its neighbours still fuse into
    # Triton kernels, and nothing falls back.
    from kiln.runtime import fallback

    fallback.reset()
    fn = lambda x: (torch.special.gammainc(x.exp(), torch.full_like(x, 2.0)) + 1).sin()  # noqa: E731
    x = torch.rand(8) + 0.5
    out, graph = triton_compiled(fn, x)
    torch.testing.assert_close(out, fn(x))
    assert [e.op for e in graph.schedule.externs] == [torch.ops.aten.igamma.default]
    assert len(graph.schedule.kernels) == 2 and fallback.FALLBACKS == []  # exp; then + 1 and sin
    _, cpp = compiled(fn, x)
    assert cpp.schedule.externs == [] and len(cpp.schedule.kernels) == 1  # (C++ has igamma's code)
    assert_builds_for_h100(graph)


def test_gpu_builds_go_to_kilns_cache_not_home(private_cache, monkeypatch):
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    fn, inputs = CASES["softmax"]
    _, graph = triton_compiled(fn, *inputs)
    assert_builds_for_h100(graph)
    assert any((private_cache / "triton_binaries").rglob("*.cubin"))
    assert "TRITON_CACHE_DIR" not in __import__("os").environ


def test_the_triton_setting_without_triton_says_how_to_install_it(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    with kiln.config.patch({"backend.codegen": "triton"}):
        with pytest.raises(NotImplementedError, match="triton package is not installed: pip install 'triton>=3.6'"):
            choose_codegen("cpu")
    assert choose_codegen("cpu") == "cpp"  # the default needs no Triton


def test_codegen_setting_is_checked():
    with kiln.config.patch({"backend.codegen": "cuda"}):
        with pytest.raises(ValueError, match="backend.codegen .KILN_CODEGEN. must be one of auto, cpp, triton"):
            choose_codegen("cpu")
    assert choose_codegen("cpu") == "cpp"
    with kiln.config.patch({"backend.codegen": "triton"}):
        assert choose_codegen("cuda") == "triton" and choose_codegen("cpu") == "triton"
    with kiln.config.patch({"backend.codegen": "cpp"}):
        with pytest.raises(NotImplementedError, match="runs on CPU only"):
            choose_codegen("cuda")


TUNED = {  # name -> (function, inputs, the setting)
    "softmax (persistent rows)": (lambda x: torch.softmax(x, -1) * 2, [torch.randn(8, 100)], "default"),
    "pointwise": (lambda x: x.sin() + 1, [torch.randn(600)], "max-autotune"),
    "looped rows": (lambda x: x.sum(1), [torch.randn(2, 5000)], "default"),
    "written in place": (lambda x: (torch.softmax(x, -1) + 1).relu(), [torch.randn(4, 50)], "default"),
    "product tiles": (lambda x, w, b: torch.relu(x @ w + b), [torch.randn(40, 70), torch.randn(70, 33), torch.randn(33)],
                      "max-autotune"),
}


@pytest.mark.parametrize("name", TUNED)
def test_block_sizes_chosen_by_tritons_autotuner(name, monkeypatch, tmp_path):
    from kiln.backend import codegens

    fn, inputs, setting = TUNED[name]
    monkeypatch.setattr(codegens, "triton_tuning", lambda target: setting)  # (a GPU's choice, here)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    out, graph = triton_compiled(fn, *inputs)
    torch.testing.assert_close(out, fn(*inputs), atol=1e-5, rtol=1e-5)  # (outputs restored after each try)
    assert "@triton.autotune(configs=[triton.Config(" in graph.source and "restore_value=['out0'" in graph.source
    torch.testing.assert_close(graph(*inputs)[0], fn(*inputs), atol=1e-5, rtol=1e-5)  # the chosen config, again
    assert_builds_for_h100(graph)


def test_tuning_is_for_gpu_graphs_and_follows_the_autotune_setting():
    from kiln.backend.codegens import CODEGENS, triton_tuning
    from kiln.ir.target import Target

    triton = CODEGENS["triton"].traits
    gpu, cpu = Target("cuda", triton, frozenset()), Target("cpu", triton, frozenset())
    assert triton_tuning(cpu) is None and triton_tuning(gpu) == "default"
    for mode in ("off", "max-autotune"):
        with kiln.config.patch({"backend.autotune": mode}):
            assert triton_tuning(gpu) == (None if mode == "off" else mode)


def test_the_product_template_compiles_one_config_unless_tuned_to_the_maximum():
    from kiln.codegen.triton.kernel import _gemm_configs

    (only,) = _gemm_configs(1024, 768, 768, "default")  # timed against cuBLAS, not tuned: one compile
    assert (only[0]["XBLOCK"], only[0]["RBLOCK"], only[0]["KBLOCK"], only[0]["EVEN_K"]) == (128, 128, 64, 1)
    (small,) = _gemm_configs(40, 70, 33, "default")
    assert (small[0]["XBLOCK"], small[0]["RBLOCK"], small[0]["KBLOCK"], small[0]["EVEN_K"]) == (64, 64, 64, 0)
    assert _gemm_configs(40, 70, 33, None) == [small]  # the interpreter's one tile
    tuned = _gemm_configs(1024, 768, 768, "max-autotune")
    assert len(tuned) > 5 and only in tuned
