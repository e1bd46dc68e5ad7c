"""kiln on a CUDA GPU: Triton kernels compiled and run for real, cuBLAS and SDPA externs, freezing,
CUDA autocast, training, CUDA graphs (`mode="reduce-overhead"`), and launches straight to the
compiled binaries.

Without a GPU (CI) these are skipped: CI checks the same kernels under Triton's interpreter
(tests/codegen/test_triton*.py, tests/ops/test_opinfo_triton.py) and builds each for sm_90. On a
GPU machine: `python -m pytest tests/gpu` (and `KILN_TEST_DEVICE=cuda python -m pytest
tests/ops/test_opinfo_triton.py` for the OpInfo subset on the GPU).
"""

import copy
import gc

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.backend import watch
from kiln.runtime import fallback
from kiln.runtime.compiled_graph import CompiledGraph
from kiln.runtime.cuda_graphs import CudaGraphed
from kiln.runtime.error_flag import MAX_UNREAD
from kiln.runtime.frozen import FrozenProgram
from kiln.runtime.triton_launch import DirectLaunch
from tests.codegen.test_triton_models import MODELS, PATTERNS, assert_same_gradients
from tests.kiln_backend import compiled, private_cache  # noqa: F401  (fixture)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none)")

CUDA = "cuda"


def _cuda(values):
    return [v.to(CUDA) if isinstance(v, torch.Tensor) else v for v in values]


def _graphs(built: list) -> list[CompiledGraph]:
    graphs = [b.runtime if isinstance(b, FrozenProgram) else b for b in built]
    return [g for g in graphs if isinstance(g, CompiledGraph)]


@pytest.mark.parametrize("name", PATTERNS)
def test_fusion_patterns_on_the_gpu(name):
    fn, inputs, expected = PATTERNS[name]
    _, cpp = compiled(fn, *inputs)
    out, tri = compiled(fn, *_cuda(inputs))
    want = fn(*_cuda(inputs))
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    assert tri.artifact.codegen == "triton" and tri.artifact.device == CUDA  # auto: Triton on CUDA
    assert len(tri.schedule.kernels) == len(cpp.schedule.kernels)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matmul_template_with_epilogue_on_the_gpu(dtype):
    fn = lambda x, w, b, r: F.gelu(x @ w + b) + r  # noqa: E731
    inputs = [torch.randn(100, 72, device=CUDA, dtype=dtype), torch.randn(72, 130, device=CUDA, dtype=dtype),
              torch.randn(130, device=CUDA, dtype=dtype), torch.randn(100, 130, device=CUDA, dtype=dtype)]
    for setting in ("always", "timed", "never"):  # timed: auto's choice on a GPU (template against cuBLAS)
        with kiln.config.patch({"backend.triton_gemm": setting}):
            out, graph = compiled(fn, *inputs)
        tol = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
        torch.testing.assert_close(out, fn(*inputs), atol=tol, rtol=tol)
        torch.testing.assert_close(graph(*inputs)[0], fn(*inputs), atol=tol, rtol=tol)  # the chosen form
        templates = [k for k in graph.schedule.kernels if k.gemm is not None]
        assert len(templates) == (0 if setting == "never" else 1)


def test_a_product_of_ragged_width_runs_in_cublas_aligned_kernels():
    """kiln/passes/wide_rows.py on the GPU: a language-model head over GPT-2's vocabulary (50257
    columns) writes rows 50264 apart, returned as they are, and cuBLAS runs none of its
    one-element (`align1`) kernels for it (on the H200 such a kernel took 845 µs of GPT-2's call)."""
    inputs = [torch.randn(256, 768, device=CUDA, dtype=torch.bfloat16),
              torch.randn(50257, 768, device=CUDA, dtype=torch.bfloat16)]
    out, graph = compiled(lambda x, w: x @ w.t(), *inputs)
    assert out.stride() == (50264, 1)
    torch.testing.assert_close(out, F.linear(*inputs), atol=2e-2, rtol=2e-2)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        graph(*inputs)
        torch.cuda.synchronize()
    kernels = [e.key for e in profile.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert kernels and not any("align1" in k for k in kernels), kernels


@pytest.mark.parametrize("name", MODELS)
def test_tiny_model_inference_on_the_gpu(name):
    torch.manual_seed(0)
    model, inputs, result = MODELS[name]()
    model, inputs = model.eval().to(CUDA), _cuda(inputs)
    fallback.reset()
    with torch.no_grad(), watch() as built:
        out = result(kiln.compile(model)(*inputs))
        want = result(model(*inputs))
    torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
    assert fallback.FALLBACKS == []
    graphs = _graphs(built)
    assert graphs and all(g.artifact.codegen == "triton" for g in graphs)


def test_launches_go_straight_to_their_binaries_after_the_first_call():
    """kiln/runtime/triton_launch.py for real: the first call through Triton (compiling and
    autotuning), later calls straight to the binaries, an input at an odd offset through Triton
    again (its pointer off the 16-byte alignment the binaries were compiled for); eager's results
    every time."""
    fn = lambda x, w, b: torch.softmax(torch.layer_norm(x, (64,), w, b) * 2, -1) + x.sum(0)  # noqa: E731
    inputs = [torch.randn(128, 64, device=CUDA), torch.randn(64, device=CUDA), torch.randn(64, device=CUDA)]
    fallback.reset()
    out, graph = compiled(fn, *inputs, autotune="default")
    torch.testing.assert_close(out, fn(*inputs), atol=1e-5, rtol=1e-5)
    assert fallback.FALLBACKS == []
    launches = [v for launcher in graph.kernels.values() for v in launcher.__globals__.values()
                if isinstance(v, DirectLaunch)]
    assert launches and all(launch.resolved is not None for launch in launches)
    for _ in range(3):
        torch.testing.assert_close(graph(*inputs)[0], fn(*inputs), atol=1e-5, rtol=1e-5)
    shifted = torch.randn(128 * 64 + 1, device=CUDA)[1:].view(128, 64)
    assert shifted.data_ptr() % 16 != 0
    torch.testing.assert_close(graph(shifted, *inputs[1:])[0], fn(shifted, *inputs[1:]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(graph(*inputs)[0], fn(*inputs), atol=1e-5, rtol=1e-5)


def test_tiny_bert_under_cuda_autocast():
    torch.manual_seed(0)
    model, inputs, result = MODELS["bert"]()
    model, inputs = model.eval().to(CUDA), _cuda(inputs)
    fallback.reset()
    compiled_model = kiln.compile(model)
    with torch.no_grad(), torch.autocast(CUDA, dtype=torch.bfloat16):
        out = result(compiled_model(*inputs))
        want = result(model(*inputs))
    assert out.dtype == want.dtype
    torch.testing.assert_close(out.float(), want.float(), atol=3e-2, rtol=3e-2)
    with torch.no_grad():  # autocast off again: the guard on CUDA autocast picks the float32 graph
        torch.testing.assert_close(result(compiled_model(*inputs)), result(model(*inputs)), atol=1e-4, rtol=1e-4)
    assert fallback.FALLBACKS == []


@pytest.mark.parametrize("name", MODELS)
def test_tiny_model_training_step_on_the_gpu(name):
    torch.manual_seed(0)
    model, inputs, result = MODELS[name]()
    model, inputs = model.train().to(CUDA), _cuda(inputs)
    twin = copy.deepcopy(model)
    fallback.reset()
    expected = result(model(*inputs)).square().mean()
    expected.backward()
    loss = result(kiln.compile(twin)(*inputs)).square().mean()
    loss.backward()
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-4)
    assert_same_gradients(model, twin, atol=1e-4, rtol=1e-3)
    assert fallback.FALLBACKS == []


def test_out_of_range_index_raises_on_the_gpu():
    fn = kiln.compile(lambda w, i: w[i] * 2)
    w = torch.randn(10, 4, device=CUDA)
    torch.testing.assert_close(fn(w, torch.tensor([1, -1], device=CUDA)), w[torch.tensor([1, -1])] * 2)
    with pytest.raises(IndexError, match="index out of range"):  # by this call or, read without waiting, a later one
        for _ in range(MAX_UNREAD + 1):
            fn(w, torch.tensor([1, 10], device=CUDA))
    for _ in range(MAX_UNREAD + 2):  # the flag was cleared, and copies queued before it forgotten
        torch.testing.assert_close(fn(w, torch.tensor([2, 3], device=CUDA)), w[[2, 3]] * 2)


def _cuda_graphed(built: list) -> list:
    return [b for b in built if isinstance(b, CudaGraphed)]


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x, ids):
        h = self.norm(x + self.fc2(F.gelu(self.fc1(x))))
        return h, h[:, ids].sum(-1)


def test_reduce_overhead_replays_cuda_graphs(monkeypatch):
    recorded = []
    real = CudaGraphed._record
    monkeypatch.setattr(CudaGraphed, "_record", lambda self, *a: recorded.append(a[0]) or real(self, *a))
    model = Block().eval().to(CUDA)
    fast = kiln.compile(model, mode="reduce-overhead")
    ids = torch.tensor([0, 3, 5], device=CUDA)
    fallback.reset()
    with torch.no_grad():
        xs = [torch.randn(4, 8, 32, device=CUDA) for _ in range(3)]
        outs = [fast(x, ids) for x in xs]  # one recording, two replays, each on new input values
        assert len(recorded) == 1
        for x, out in zip(xs, outs):  # earlier results are not overwritten by later replays
            for got, want in zip(out, model(x, ids)):
                torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        y = torch.randn(2, 8, 32, device=CUDA)  # new sizes: a second recording
        torch.testing.assert_close(fast(y, ids)[0], model(y, ids)[0], atol=1e-5, rtol=1e-5)
        assert len(recorded) == 2
        model.fc1.weight.mul_(-1)  # a frozen weight changed in place: re-frozen and recorded again
        torch.testing.assert_close(fast(xs[0], ids)[0], model(xs[0], ids)[0], atol=1e-5, rtol=1e-5)
        assert len(recorded) == 3
        with pytest.raises(IndexError, match="index out of range"):
            for _ in range(MAX_UNREAD + 1):
                fast(xs[0], torch.tensor([0, 9], device=CUDA))
    assert fallback.FALLBACKS == []


def test_reduce_overhead_through_torch_compile():
    from kiln.integrations.dynamo import register

    register()  # (where kiln is not pip-installed, its entry point is not there)
    model = Block().eval().to(CUDA)
    x, ids = torch.randn(4, 8, 32, device=CUDA), torch.tensor([1, 2], device=CUDA)
    with torch.no_grad():
        fast = torch.compile(model, backend="kiln", mode="reduce-overhead")
        for _ in range(3):
            torch.testing.assert_close(fast(x, ids)[0], model(x, ids)[0], atol=1e-5, rtol=1e-5)
        opts = torch.compile(model, backend="kiln", options={"cuda_graphs": True})
        torch.testing.assert_close(opts(x, ids)[1], model(x, ids)[1], atol=1e-5, rtol=1e-5)


def test_cuda_graph_limits_are_recorded():
    fallback.reset()
    graphed = CudaGraphed(lambda x: (x * 2,), label="g", limit=1)
    for size in (3, 4, 4):  # the second size is beyond the limit: it runs, without a CUDA graph
        x = torch.randn(size, device=CUDA)
        torch.testing.assert_close(graphed(x)[0], x * 2)
    assert len(graphed.recordings) == 1
    reasons = [f.reason for f in fallback.FALLBACKS]
    assert len(reasons) == 1 and "more than 1 sets of input sizes" in reasons[0], reasons


def _doubled_and_its_tail(x):
    y = x * 2
    return y, y[1:]


def test_cuda_graph_outputs_are_handed_out_without_copies():
    graphed = CudaGraphed(_doubled_and_its_tail, label="g")  # (two outputs, one storage)
    x = torch.randn(64, device=CUDA)
    first = graphed(x)
    (recording,) = graphed.recordings.values()
    address = first[0].data_ptr()
    second = graphed(x + 1)  # `first` is still held: it moves to memory of its own, once
    torch.testing.assert_close(first[0], x * 2)
    torch.testing.assert_close(first[1], (x * 2)[1:])
    torch.testing.assert_close(second[0], (x + 1) * 2)
    assert second[0].data_ptr() == address and recording.handout.copies == 1  # one storage moved
    assert first[1].untyped_storage().data_ptr() == first[0].untyped_storage().data_ptr()  # still views of it
    del first, second
    for i in range(3):  # results read and dropped: no copy at all
        torch.testing.assert_close(graphed(x + i)[0], (x + i) * 2)
    assert recording.handout.copies == 1
    kept = graphed(x)
    del graphed, recording  # the recording's memory is freed: what the caller holds moved first
    gc.collect()
    torch.cuda.empty_cache()
    _ = torch.full((1 << 20,), 7.0, device=CUDA)
    torch.testing.assert_close(kept[0], x * 2)


def test_launches_and_waits_per_call_are_counted_on_the_gpu():
    from benchmarks.launch_count import count_per_call

    model = Block().eval().to(CUDA)
    x, ids = torch.randn(4, 8, 32, device=CUDA), torch.tensor([0, 3], device=CUDA)
    with torch.no_grad():
        eager_launches, _ = count_per_call(lambda: model(x, ids))
        graphed = kiln.compile(model, mode="reduce-overhead")
        graphed_launches, graphed_waits = count_per_call(lambda: graphed(x, ids))
    assert eager_launches >= 5  # two products, gelu, the norm, the gather, ...
    assert graphed_launches < eager_launches and graphed_waits == 0  # replays, the index flag read without waiting


class Trainable(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)
        self.norm, self.drop = torch.nn.LayerNorm(32), torch.nn.Dropout(0.0)

    def forward(self, x):
        return self.norm(x + self.fc2(self.drop(F.gelu(self.fc1(x))))).square().mean()


def test_reduce_overhead_replays_training_steps(monkeypatch):
    recorded = []
    real = CudaGraphed._record
    monkeypatch.setattr(CudaGraphed, "_record", lambda self, *a: recorded.append(self.label) or real(self, *a))
    torch.manual_seed(0)
    model = Trainable().to(CUDA)
    twin = copy.deepcopy(model)
    fast = kiln.compile(twin, mode="reduce-overhead")
    opt, twin_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(twin.parameters(), lr=0.1)
    fallback.reset()
    for step in range(4):  # the optimizer changes the parameters in place: replayed, not recorded again
        x = torch.randn(8, 32, device=CUDA)
        expected, loss = model(x), fast(x)
        expected.backward()
        loss.backward()
        torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-4)
        assert_same_gradients(model, twin, atol=1e-4, rtol=1e-3)
        if step == 1:  # gradients kept across a step (accumulated) stay right: moved out of the recording first
            continue
        for o in (opt, twin_opt):
            o.step()
            o.zero_grad()
    assert sorted(label.split()[-1] for label in recorded) == ["backward", "forward"], recorded
    assert fallback.FALLBACKS == []
