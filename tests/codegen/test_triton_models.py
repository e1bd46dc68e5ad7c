"""Triton kernels (`backend.codegen = "triton"`, run by Triton's interpreter on CPU) on the fusion
tests' patterns, with the same kernel counts as the C++ path (fusion is decided before code
generation), and on a tiny BERT and a tiny ResNet end to end: inference, and one training step
whose loss and gradients match eager's."""

import copy

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.backend import watch
from kiln.runtime import fallback
from kiln.runtime.compiled_graph import CompiledGraph
from kiln.runtime.frozen import FrozenProgram
from tests.fusion.test_fusion import layer_norm, softmax
from tests.kiln_backend import compiled, private_cache  # noqa: F401  (fixture)


def _stats_then_transpose(x):
    return (x - x.amax(-1, keepdim=True)).t().contiguous() * 2


def _bn_relu(x, mean, var, w, b):
    return torch.relu((x - mean[:, None, None]) * torch.rsqrt(var[:, None, None] + 1e-5) * w[:, None, None]
                      + b[:, None, None])


def _rotate_half(x):
    return torch.cat([-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]], dim=-1) * 2


torch.manual_seed(0)
# name -> (function, inputs, kernels the fusion tests expect)
PATTERNS = {
    "softmax": (softmax, [torch.randn(33, 129)], 1),
    "layer norm": (layer_norm, [torch.randn(8, 100), torch.randn(100), torch.randn(100)], 1),
    "residual then layer norm": (lambda x, r, w, b: (x + r, layer_norm(x + r, w, b)),
                                 [torch.randn(16, 64), torch.randn(16, 64), torch.randn(64), torch.randn(64)], 1),
    "gelu after a matmul": (lambda x, w, b: F.gelu(x @ w + b), [torch.randn(8, 16), torch.randn(16, 32), torch.randn(32)], 1),
    "reduction with epilogue": (lambda x: x / (x.abs().sum(-1, keepdim=True) + 1.0), [torch.randn(10, 37)], 1),
    "siblings": (lambda x: (x.sin(), x.cos() * 2), [torch.randn(4, 64)], 1),
    "zero-dim shared value": (lambda a, b: (a * (a * a + b * b).reciprocal().exp(), -b * (a * a + b * b).reciprocal().exp()),
                              [torch.tensor(0.3), torch.tensor(-1.2)], 1),
    "transposed read": (_stats_then_transpose, [torch.randn(6, 10)], 2),
    "reduction over rows": (lambda x: (x.sum(0), x.amax(0) * 2), [torch.randn(50, 40)], 1),
    "batch norm": (_bn_relu, [torch.randn(2, 32, 8, 64), torch.randn(32), torch.rand(32) + 0.5, torch.randn(32),
                              torch.randn(32)], 1),
    "indirect siblings": (lambda w1, w2, i: (w1[i] * 2, w2[i] + 1), [torch.randn(10, 32), torch.randn(10, 32),
                                                                     torch.tensor([3, 0, 9, 3, -1])], 1),
    "reductions over several dims": (lambda x: (x.sum((1, 2)), x.amax((1, 2)), x.var((1, 2))), [torch.randn(3, 5, 70)], None),
    "cat along the last dim": (_rotate_half, [torch.randn(3, 4, 64)], 1),
}


@pytest.mark.parametrize("name", PATTERNS)
def test_fusion_patterns_have_the_cpp_paths_kernel_counts(name):
    fn, inputs, expected = PATTERNS[name]
    _, cpp = compiled(fn, *inputs)
    with kiln.config.patch({"backend.codegen": "triton"}):
        out, tri = compiled(fn, *inputs)
    torch.testing.assert_close(out, fn(*inputs), atol=1e-5, rtol=1e-5)
    assert tri.artifact.codegen == "triton"
    assert len(tri.schedule.kernels) == len(cpp.schedule.kernels)
    assert expected is None or len(tri.schedule.kernels) == expected


def _tiny_bert():
    import transformers

    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0)
    ids = torch.randint(0, 100, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 10:] = 0
    return transformers.BertModel(config), (ids, mask), lambda out: out.last_hidden_state


class TinyResNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.conv2, self.bn2 = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)) + y)
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


MODELS = {"bert": _tiny_bert, "resnet": lambda: (TinyResNet(), (torch.randn(2, 3, 8, 8),), lambda out: out)}


def assert_same_gradients(model, twin, atol: float, rtol: float) -> None:
    """Every parameter of `twin` (compiled) has `model`'s (eager) gradient."""
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        # (BERT's pooler is outside the loss: eager leaves its gradients None, a compiled backward,
        # kiln's on either code generator, returns zeros.)
        want = p.grad if p.grad is not None else torch.zeros_like(p)
        torch.testing.assert_close(q.grad, want, atol=atol, rtol=rtol, msg=f"gradient of {name}")


def _triton_graphs(built: list) -> list[CompiledGraph]:
    graphs = [b.runtime if isinstance(b, FrozenProgram) else b for b in built]
    return [g for g in graphs if isinstance(g, CompiledGraph) and g.artifact.codegen == "triton"]


@pytest.mark.parametrize("name", MODELS)
def test_tiny_model_inference(name):
    torch.manual_seed(0)
    model, inputs, result = MODELS[name]()
    model.eval()
    fallback.reset()
    with torch.no_grad(), kiln.config.patch({"backend.codegen": "triton"}), watch() as built:
        out = result(kiln.compile(model)(*inputs))
    torch.testing.assert_close(out, result(model(*inputs)), atol=1e-5, rtol=1e-5)
    assert fallback.FALLBACKS == []
    graphs = _triton_graphs(built)
    assert graphs and sum(len(g.kernels) for g in graphs) > 0


@pytest.mark.parametrize("name", MODELS)
def test_tiny_model_training_step(name):
    torch.manual_seed(0)
    model, inputs, result = MODELS[name]()
    model.train()
    twin = copy.deepcopy(model)
    fallback.reset()
    expected = result(model(*inputs)).square().mean()
    expected.backward()
    with kiln.config.patch({"backend.codegen": "triton"}), watch() as built:
        loss = result(kiln.compile(twin)(*inputs)).square().mean()
        loss.backward()
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-5)
    assert_same_gradients(model, twin, atol=1e-5, rtol=1e-4)
    assert fallback.FALLBACKS == []
    assert len(_triton_graphs(built)) >= 2  # forward and backward


def _amp_training_step(codegen: str):
    torch.manual_seed(0)
    model, inputs, result = MODELS["bert"]()
    model.train()
    with kiln.config.patch({"backend.codegen": codegen}), watch() as built:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = result(kiln.compile(model)(*inputs)).float().square().mean()
        loss.backward()
    graphs = [b.runtime if isinstance(b, FrozenProgram) else b for b in built]
    return loss, model, [g for g in graphs if isinstance(g, CompiledGraph)]


def test_tiny_bert_amp_training_step():
    # bfloat16 autocast (AMP) training through Triton kernels: forward and backward graphs traced
    # under autocast, their casts fused as on the C++ path (the same kernels), results as eager's.
    torch.manual_seed(0)
    model, inputs, result = MODELS["bert"]()
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = result(model(*inputs)).float().square().mean()
    expected.backward()
    fallback.reset()
    _, _, cpp = _amp_training_step("cpp")
    loss, twin, tri = _amp_training_step("triton")
    torch.testing.assert_close(loss, expected, atol=2e-2, rtol=2e-2)
    assert_same_gradients(model, twin, atol=5e-2, rtol=5e-2)
    assert fallback.FALLBACKS == []
    assert len(tri) == len(cpp) >= 2 and all(g.artifact.codegen == "triton" for g in tri)
    assert [len(g.schedule.kernels) for g in tri] == [len(g.schedule.kernels) for g in cpp]
