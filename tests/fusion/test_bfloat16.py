"""bfloat16 under `torch.autocast("cpu")`: frozen weights are cast once, in the constants graph,
casts that change nothing are removed, a BatchNorm folds into a bfloat16 convolution, and results
match eager autocast. (Correctness tests: speed is `kiln bench --autocast bf16`'s.)"""

import torch
from torch import fx, nn

import kiln
from kiln.passes.redundant_casts import redundant_casts
from kiln.runtime.frozen import FrozenProgram
from kiln.backend.driver import target_for
from tests.kiln_backend import compiled, private_cache  # noqa: F401  (fixture)

aten = torch.ops.aten


def _casts(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is aten._to_copy.default]


def test_weights_are_cast_once_and_results_match_eager_autocast():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 16)).eval()
    x = torch.randn(8, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, program = compiled(model, x, freezing=True, autotune="default")
        with torch.no_grad():
            expected = model(x)
    assert out.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)
    assert isinstance(program, FrozenProgram)
    # The four weight and bias casts live in the constants graph; only the input is cast per call.
    assert len(_casts(program.split.constants)) == 4 and len(_casts(program.split.runtime)) == 1


def test_convolution_under_autocast_matches_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1)).eval()
    x = torch.randn(1, 3, 10, 10)
    compiled_model = kiln.compile(model)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out, expected = compiled_model(x), model(x)
    assert out.dtype == expected.dtype
    torch.testing.assert_close(out.float(), expected.float(), rtol=3e-2, atol=3e-2)


def test_batch_norm_folds_into_a_bfloat16_convolution_in_float32():
    # Under autocast the convolution is bfloat16 and the norm's statistics float32: the fold is
    # computed from the float32 weight and cast, and ReLU fuses, so one oneDNN call remains.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()).eval()
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
    x = torch.randn(1, 3, 10, 10)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, program = compiled(model, x, freezing=True)
        with torch.no_grad():
            expected = model(x)
            truth = model.double()(x.double())
    assert out.dtype == expected.dtype == torch.bfloat16
    externs = [str(s.op) for s in program.runtime.schedule.externs if str(s.op) not in ("aten.as_strided.default", "aten.alias.default")]
    kernels = program.runtime.schedule.kernels
    assert externs == ["kiln.conv.default"] and len(kernels) == 1  # the one kernel casts the input
    assert kernels[0].outputs[0].layout.dtype == torch.bfloat16 and tuple(kernels[0].outputs[0].layout.size) == (1, 3, 10, 10)
    conv = program.runtime.schedule.externs[-1]
    assert conv.args[7] == "relu"
    # as exact as eager's bfloat16 (rounding at other places)
    ours, eagers = (out.double() - truth).abs().max().item(), (expected.double() - truth).abs().max().item()
    assert ours <= 2 * eagers + 1e-3


def _graph(fn, *inputs):
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(*inputs)


def test_exact_round_trips_and_same_dtype_casts_go_lossy_ones_stay():
    x16 = torch.randn(4, dtype=torch.bfloat16)
    gm = _graph(lambda x: (x.float().to(torch.bfloat16) * 2).to(torch.bfloat16) + 1, x16)
    assert redundant_casts(gm, target_for(gm))
    gm.recompile()
    assert not _casts(gm)
    torch.testing.assert_close(gm(x16), x16 * 2 + 1)
    x32 = torch.randn(4)
    lossy = _graph(lambda x: x.to(torch.bfloat16).float() * 2, x32)
    assert not redundant_casts(lossy, target_for(lossy)) and len(_casts(lossy)) == 2


def test_a_returned_cast_stays_a_fresh_tensor():
    x = torch.randn(4)
    gm = _graph(lambda x: x.to(torch.float32, copy=True), x)
    redundant_casts(gm, target_for(gm))
    gm.recompile()
    out = gm(x)
    assert out.data_ptr() != x.data_ptr()


def _kernel_text(program):
    return program.source[program.source.index('extern "C" void kernel_'):]  # after the inlined headers


def test_a_bfloat16_pointwise_chain_is_rounded_once_where_it_is_stored():
    # Eager rounds the sum to bfloat16, then GELU computes in float32 and rounds once. kiln keeps
    # float32 through the whole fused chain (as Inductor does): no rounding in the kernel but the
    # store's, and no further from the exact result than eager.
    torch.manual_seed(0)
    x, b = torch.randn(64, 48, dtype=torch.bfloat16), torch.randn(48, dtype=torch.bfloat16)
    fn = lambda x, b: torch.nn.functional.gelu(x + b) * 0.5  # noqa: E731
    out, program = compiled(fn, x, b)
    assert len(program.schedule.kernels) == 1
    assert "round_bf16" not in _kernel_text(program) and "store_bf16" in _kernel_text(program)
    truth = fn(x.double(), b.double())
    ours, eagers = (out.double() - truth).abs().max().item(), (fn(x, b).double() - truth).abs().max().item()
    assert ours <= eagers
    torch.testing.assert_close(out, fn(x, b), rtol=2**-7, atol=2**-7)


def test_an_explicit_cast_of_a_bfloat16_result_rounds_it_first():
    # `.float()` of a bfloat16 product converts the rounded product, exactly as eager does.
    x = torch.randn(256, dtype=torch.bfloat16)
    fn = lambda x: (x * 3.3).float() * 1.5  # noqa: E731
    out, program = compiled(fn, x)
    assert "round_bf16" in _kernel_text(program)
    torch.testing.assert_close(out, fn(x), rtol=0, atol=0)
