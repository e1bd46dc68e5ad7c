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
