"""The AOT layer's training path: joint graph, partition, autograd.Function runtime."""

import torch
import torch._dynamo
from torch import fx, nn

import kiln
from kiln import aot
from kiln.backend import run_as_is


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="kiln_aot_eager")


def _grads_match(model_a, model_b, loss_a, loss_b):
    loss_a.backward()
    loss_b.backward()
    for (name, pa), pb in zip(model_a.named_parameters(), model_b.parameters()):
        torch.testing.assert_close(pa.grad, pb.grad, msg=name)


def test_mlp_gradients_match_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
    twin = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
    twin.load_state_dict(model.state_dict())
    x = torch.randn(16, 8)
    out = _compiled(model)(x)
    assert out.grad_fn is not None
    _grads_match(model, twin, out.pow(2).mean(), twin(x).pow(2).mean())


def test_batch_norm_training_updates_statistics_and_gradients():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).train()
    twin = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).train()
    twin.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 8, 8)
    _grads_match(model, twin, _compiled(model)(x).sum(), twin(x).sum())
    torch.testing.assert_close(model[1].running_mean, twin[1].running_mean)
    torch.testing.assert_close(model[1].running_var, twin[1].running_var)


def test_dropout_mask_is_the_same_in_forward_and_backward():
    x = torch.randn(1000, requires_grad=True)

    def f(x):
        return torch.nn.functional.dropout(x.sin(), p=0.5, training=True).cos()

    y = _compiled(f)(x)
    (grad,) = torch.autograd.grad(y.sum(), x)
    kept = (y != 1.0)  # cos(0) == 1 where the mask dropped the value
    expected = torch.where(kept, -torch.sin(x.sin() * 2) * 2 * x.cos(), torch.zeros_like(x))
    torch.testing.assert_close(grad, expected.detach())
    assert 0.4 < kept.float().mean() < 0.6  # eager's distribution: half dropped


def test_outputs_without_grad_detach_no_grad_and_reuse():
    w = torch.randn(5, 5, requires_grad=True)

    def f(x, w):
        h = x @ w
        with torch.no_grad():
            stat = h.abs().max()
        return h * h + h, stat, h.detach() * 2, (x > 0).sum()

    x = torch.randn(3, 5)
    out, stat, detached, count = _compiled(f)(x, w)
    e_out, e_stat, e_detached, e_count = f(x, w)
    assert not stat.requires_grad and not detached.requires_grad and count.dtype == torch.int64
    torch.testing.assert_close((stat, detached, count), (e_stat, e_detached, e_count))
    (g,) = torch.autograd.grad(out.sum(), w)
    (e_g,) = torch.autograd.grad(e_out.sum(), w)
    torch.testing.assert_close(g, e_g)


def test_scaled_dot_product_attention_backward():
    q, k, v = (torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3))

    def f(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    out = _compiled(f)(q, k, v)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    expected = torch.autograd.grad(f(q, k, v).sum(), (q, k, v))
    torch.testing.assert_close(grads, expected)


def test_partition_is_dumped(tmp_path):
    w = torch.randn(4, 4, requires_grad=True)
    gm = fx.symbolic_trace(lambda x, w: (x @ w).sin().cos())
    with kiln.config.patch({"debug.dump_dir": str(tmp_path)}):
        compiled = aot.compile(gm, [torch.randn(2, 4), w], run_as_is, options=aot.AotOptions(label="chain"))
    compiled(torch.randn(2, 4), w).sum().backward()
    (folder,) = tmp_path.glob("run_*/000_chain")
    names = [p.name for p in sorted(folder.iterdir())]
    assert names == ["00_aot_signature.txt", "01_aten_joint.py", "02_aten_forward.py", "03_aten_backward.py",
                     "04_partition.txt"]
    assert "saved" in (folder / "04_partition.txt").read_text()
    assert w.grad is not None


def test_training_with_symbolic_sizes():
    # dynamic=True also turns the LayerNorm's eps into a tensor input read with .item().
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="kiln_aot_eager", dynamic=True)
    for n in (3, 5, 7):
        x = torch.randn(n, 8)
        model.zero_grad()
        compiled(x).sum().backward()
        ours = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        model(x).sum().backward()
        torch.testing.assert_close(ours, [p.grad for p in model.parameters()])


def test_layer_norm_weight_gradient_takes_eager_steps():
    # One element per row: x == mean, so (x - mean) * rstd is 0, while eager's CPU kernel computes
    # fma(rstd, x, -rstd * mean), the rounding of rstd * mean (up to 1e-4 here): kiln's
    # decomposition takes eager's steps, so the weight gradient matches at float32 tolerances.
    x, w, b = (torch.tensor(v).requires_grad_() for v in ([[5.123456], [1.7]], [0.7], [0.2]))
    fn = lambda x, w, b: torch.nn.functional.layer_norm(x, [1], w, b)  # noqa: E731
    grad = torch.tensor([[1.3], [-0.4]])
    expected = torch.autograd.grad(fn(x, w, b), (x, w, b), grad)
    assert expected[1].abs().item() > 1e-5  # the case is the one where eager's rounding shows
    actual = torch.autograd.grad(_compiled(fn)(x, w, b), (x, w, b), grad)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1.3e-6)


def test_a_caller_building_ahead_of_time_gets_what_the_backend_made_of_each_variant():
    seen = []

    def backend(gm, example_inputs):
        seen.append(gm)
        return gm

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU())
    gm = fx.symbolic_trace(model)
    compiled = aot.compile(gm, [torch.randn(2, 4)], backend)  # (built for the example's grad mode: training)
    forward, backward = compiled.built(training=True)
    assert seen == [forward, backward]
    (inference,) = compiled.built(training=False)  # built now, on request
    assert seen[-1] is inference and len(seen) == 3
    assert compiled.built(training=False) == [inference] and len(seen) == 3  # and only once


def test_a_training_graphs_forward_and_backward_pass_through_the_wrap_hook():
    calls = []

    def counted(name, fn):
        def run(*args):
            calls.append(name)
            return fn(*args)
        return run

    def wrap(forward, backward, static_positions, label):
        wrap.seen = (list(static_positions), label)
        return counted("forward", forward), counted("backward", backward)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    twin = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    twin.load_state_dict(model.state_dict())
    gm = fx.symbolic_trace(model)
    x = torch.randn(3, 4)
    compiled = aot.compile(gm, [x], run_as_is, options=aot.AotOptions(label="g", wrap_training=wrap))
    (out,) = [compiled(x)]
    _grads_match(model, twin, out.sum(), twin(x).sum())
    assert calls == ["forward", "backward"]
    assert wrap.seen == ([0, 1, 2, 3], "g")  # the four parameters, lifted first, are module state


def test_an_input_given_no_gradient_does_not_reach_the_backward_of_the_graph_that_made_it():
    # Dynamo's GAN repro: the second graph reads `e` only through `e.detach()`. Were `e` handed to
    # its autograd.Function as it is, d_loss.backward() would call the first graph's backward
    # again, after g_loss.backward() freed what it saved.
    def f(a, b):
        e = a @ torch.ones(2, 2)
        (e - 1).abs().mean().backward()
        kiln.graph_break()
        (b @ e.detach()).mean().backward()

    a, b = torch.randn(2, 2, requires_grad=True), torch.randn(2, 2, requires_grad=True)
    f(a, b)
    a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    kiln.compile(f, backend="aot_eager")(a2, b2)
    torch.testing.assert_close((a2.grad, b2.grad), (a.grad, b.grad))


def test_an_output_that_is_a_view_of_another_output_can_be_written_in_place():
    def f(x):
        t = x.mul(2)
        return t.view(-1), t

    compiled = kiln.compile(f, backend="aot_eager")
    for requires_grad in (False, True):
        x = torch.randn(2, 2, requires_grad=requires_grad)
        want, got = f(x), compiled(x)
        want[0].mul_(2)
        got[0].mul_(2)  # (autograd forbids this on one of a Function's several views)
        torch.testing.assert_close(got, want)
        assert got[0].requires_grad == want[0].requires_grad


def test_a_tensor_made_with_requires_grad_inside_is_a_leaf_that_gets_its_grad():
    def f(x):
        leaf = torch.ones(2, requires_grad=True)
        return leaf, leaf * 2 + x.sum()

    for backend in ("aot_eager", "kiln"):
        leaf, out = kiln.compile(f, backend=backend)(torch.randn(2, 2))
        out.sum().backward()
        assert leaf.is_leaf and torch.equal(leaf.grad, torch.full((2,), 2.0))
