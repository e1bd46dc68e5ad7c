"""addmm's bias joins the consumer's kernel when the consumer is lowered; it stays in addmm when
an extern (another matmul) reads the result."""

import torch


from tests.kiln_backend import compiled as compiled_program, private_cache  # noqa: F401  (fixture)


def compiled(module, x):
    out, program = compiled_program(module, x)
    with torch.no_grad():
        torch.testing.assert_close(out, module(x))
    views = "aten.as_strided.default"  # transposed weights reach the matmul as views
    return [str(s.op) for s in program.schedule.externs if str(s.op) != views], program


def test_linear_then_gelu_is_mm_and_one_kernel_with_the_bias():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU()).eval()
    externs, program = compiled(model, torch.randn(8, 16))
    assert externs == ["aten.mm.default"] and len(program.schedule.kernels) == 1


def test_linear_feeding_a_linear_keeps_addmm():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)).eval()
    externs, program = compiled(model, torch.randn(8, 16))
    assert externs == ["aten.addmm.default", "aten.addmm.default"] and not program.schedule.kernels


def _qkv_attention(x, w, b):
    # GPT-2's attention input: one product for q, k and v, split, read only by SDPA.
    q, k, v = torch.addmm(b, x, w).view(2, 8, 96).split(32, dim=2)
    heads = lambda t: t.view(2, 8, 2, 16).transpose(1, 2)  # noqa: E731
    return torch.nn.functional.scaled_dot_product_attention(heads(q), heads(k), heads(v)) + 1


def test_on_a_gpu_a_bias_read_only_by_attention_through_a_split_stays_in_addmm():
    from torch import fx

    from kiln import aot
    from kiln.backend.codegens import CODEGENS
    from kiln.ir.target import Target
    from kiln.lowering.registry import LOWERINGS
    from kiln.passes.bias_epilogue import bias_epilogue

    inputs = [torch.randn(16, 32), torch.randn(32, 96), torch.randn(96)]
    found = {}
    for device, codegen in (("cuda", "triton"), ("cpu", "cpp")):
        target = Target(device, CODEGENS[codegen].traits, frozenset(LOWERINGS))

        def compile_graph(gm, example_inputs, target=target, device=device):
            bias_epilogue(gm, target)
            gm.recompile()
            found[device] = [n.target for n in gm.graph.nodes if n.op == "call_function"]
            return gm

        with torch.no_grad():
            out = aot.compile(fx.symbolic_trace(_qkv_attention), inputs, compile_graph)(*inputs)
        torch.testing.assert_close(out, _qkv_attention(*inputs), rtol=1e-5, atol=1e-5)
    aten = torch.ops.aten
    assert aten.addmm.default in found["cuda"] and aten.mm.default not in found["cuda"]
    assert aten.mm.default in found["cpu"] and aten.addmm.default not in found["cpu"]  # (the CPU's split add)
