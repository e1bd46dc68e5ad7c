"""The `cse` pass: a pure call on the same operands as an earlier one is that call (a mask every
attention layer converts, computed once), while returned values, random draws, values written in
place and calls on either side of a write are left as they are."""

import torch
from torch import fx

import kiln
from kiln import aot
from kiln.backend import watch
from kiln.backend.codegens import CODEGENS
from kiln.ir.target import Target
from kiln.lowering.registry import LOWERINGS
from kiln.passes.cse import cse
from kiln.runtime.compiled_graph import CompiledGraph
from kiln.runtime.frozen import FrozenProgram
from tests.kiln_backend import private_cache  # noqa: F401  (fixture)

aten = torch.ops.aten
CPU = Target("cpu", CODEGENS["cpp"].traits, frozenset(LOWERINGS))


def after_cse(fn, *inputs):
    """fn's ATen graph after `cse`, and what it returns run on `inputs`."""
    graphs = []

    def compile_graph(gm, example_inputs):
        cse(gm, CPU)
        gm.recompile()
        graphs.append(gm)
        return gm

    with torch.no_grad():
        out = aot.compile(fx.symbolic_trace(fn), list(inputs), compile_graph)(*inputs)
    return graphs[0], out


def calls(gm, op):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is op]


def _two_layers(q, k, v, mask):
    # As HuggingFace's SDPA attention: each layer turns the boolean mask into a float one.
    first = torch.nn.functional.scaled_dot_product_attention(q, k, v, torch.where(mask, 0.0, float("-inf")))
    return torch.nn.functional.scaled_dot_product_attention(first, k, v, torch.where(mask, 0.0, float("-inf")))


def test_the_mask_each_layer_converts_is_computed_once():
    q, k, v = (torch.randn(2, 4, 8, 16) for _ in range(3))
    mask = torch.rand(2, 1, 8, 8) > 0.3
    mask[..., 0] = True
    gm, out = after_cse(_two_layers, q, k, v, mask)
    assert len(calls(gm, aten.where.self)) == 1
    torch.testing.assert_close(out, _two_layers(q, k, v, mask))


def test_returned_values_stay_two_tensors_and_floats_are_compared_bit_for_bit():
    fn = lambda x: (x + 1, x + 1, (x - 1).view(-1), (x - 1).view(-1),  # noqa: E731
                    (x * 0.0).sum() + (x * -0.0).sum() + (x * 2).sum() + (x * 2).sum())
    gm, (a, b, c, d, s) = after_cse(fn, torch.randn(5))
    assert a.data_ptr() != b.data_ptr() and c.data_ptr() != d.data_ptr()  # returned, or returned through a view
    scales = sorted(str(n.args[1]) for n in calls(gm, aten.mul.Tensor))
    assert scales == ["-0.0", "0.0", "2"]  # the two x * 2 merged, 0.0 and -0.0 kept apart


def test_random_draws_are_never_merged():
    fn = lambda x: torch.rand_like(x) - torch.rand_like(x)  # noqa: E731
    gm, out = after_cse(fn, torch.randn(1000))
    assert len([n for n in gm.graph.nodes if "rand" in str(n.target)]) == 2 and out.abs().max() > 0


def _graph(build):
    graph = fx.Graph()
    x = graph.placeholder("x")
    graph.output(build(graph, x))
    return fx.GraphModule(torch.nn.Module(), graph)


def test_nothing_merges_across_a_write_or_into_a_value_written_in_place():
    def across(graph, x):
        before = graph.call_function(aten.add.Tensor, (x, 1))
        graph.call_function(aten.add_.Tensor, (x, 1))
        after = graph.call_function(aten.add.Tensor, (x, 1))
        return graph.call_function(aten.sub.Tensor, (after, before))

    gm = _graph(across)
    assert not cse(gm, CPU)
    x = torch.zeros(3)
    torch.testing.assert_close(gm(x), torch.ones(3))

    def buffers(graph, x):
        one = graph.call_function(aten.zeros_like.default, (x,))
        two = graph.call_function(aten.zeros_like.default, (x,))
        graph.call_function(aten.fill_.Scalar, (one, 1.0))
        graph.call_function(aten.fill_.Scalar, (two, 2.0))
        return graph.call_function(aten.sub.Tensor, (two, one))

    gm = _graph(buffers)
    assert not cse(gm, CPU)
    torch.testing.assert_close(gm(torch.zeros(3)), torch.ones(3))


def test_a_gpt2_call_with_an_attention_mask_runs_fewer_kernels(private_cache):  # noqa: F811
    import transformers

    config = transformers.GPT2Config(n_layer=3, n_embd=32, n_head=2, vocab_size=100, n_positions=32)
    torch.manual_seed(0)
    model = transformers.GPT2Model(config).eval()
    ids, mask = torch.randint(0, 100, (2, 12)), torch.ones(2, 12, dtype=torch.long)
    mask[1, 8:] = 0
    counts = {}
    for disabled in ([], ["cse"]):
        kiln.reset()
        # (Triton's graphs without freezing, as on a GPU: there each layer's mask was a kernel of its own)
        settings = {"backend.disabled_passes": disabled, "backend.codegen": "triton", "backend.freezing": False}
        with torch.no_grad(), kiln.config.patch(settings), watch() as built:
            out = kiln.compile(model)(input_ids=ids, attention_mask=mask).last_hidden_state
        torch.testing.assert_close(out, model(input_ids=ids, attention_mask=mask).last_hidden_state, rtol=1e-4, atol=1e-4)
        graphs = [b.runtime if isinstance(b, FrozenProgram) else b for b in built]
        counts[bool(disabled)] = sum(len(g.schedule.kernels) for g in graphs if isinstance(g, CompiledGraph))
    assert counts[False] <= counts[True] - 2, counts  # (the mask of each layer after the first, at least)
