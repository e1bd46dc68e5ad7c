"""Freezing: parameters become constants of the compiled graph, folded and prepacked once, and
recomputed when the user changes them. Autotuning is off here, so oneDNN runs every frozen
convolution (its fixed rule) and matrix products stay ATen's unless a test picks one."""

import math

import pytest
import torch
from torch import nn

import kiln
from kiln.runtime.frozen import FrozenProgram
from kiln.externs.prepacked import MM_IMPLS
from tests.kiln_backend import compiled, private_cache  # noqa: F401  (fixture)

VIEWS = {"aten.as_strided.default", "aten.alias.default"}


def _externs(program):
    return [str(s.op) for s in program.runtime.schedule.externs if str(s.op) not in VIEWS]


def _randomize_norms(model):
    torch.manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            if m.affine:
                m.weight.data.uniform_(0.5, 2)
                m.bias.data.uniform_(-1, 1)
    return model.eval()


def _frozen(model, x):
    out, program = compiled(model, x, freezing=True)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    assert isinstance(program, FrozenProgram)
    return program


class ConvBnRelu(nn.Module):
    def __init__(self, bias=False, affine=True):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1, bias=bias)
        self.norm = nn.BatchNorm2d(8, affine=affine)

    def forward(self, x):
        return torch.relu(self.norm(self.conv(x)))


@pytest.mark.parametrize("bias,affine", [(False, True), (True, True), (True, False)])
def test_batch_norm_folds_into_the_convolution_and_relu_fuses(bias, affine):
    torch.manual_seed(0)
    program = _frozen(_randomize_norms(ConvBnRelu(bias, affine)), torch.randn(2, 4, 10, 10))
    assert _externs(program) == ["kiln.conv.default"]
    assert not program.runtime.schedule.kernels  # no norm, no relu: all inside the convolution
    conv = next(s for s in program.runtime.schedule.externs if str(s.op) == "kiln.conv.default")
    assert conv.args[7] == "relu" and conv.args[-1] == "onednn"


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = ConvBnRelu(), nn.Conv2d(8, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(8)

    def forward(self, x):
        y = self.a(x)
        return torch.relu(self.norm(self.b(y)) + y)


def test_residual_add_and_relu_fuse_into_the_second_convolution():
    torch.manual_seed(0)
    program = _frozen(_randomize_norms(Residual()), torch.randn(1, 4, 12, 12))
    assert _externs(program) == ["kiln.conv.default", "kiln.conv.default"]
    second = [s for s in program.runtime.schedule.externs if str(s.op) == "kiln.conv.default"][1]
    assert second.args[7] == "relu" and second.args[10] is not None  # the residual is an operand
    assert not program.runtime.schedule.kernels


class Downsample(nn.Module):
    """ResNet's downsampling block: the shortcut is its own convolution, dead after the add."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.shortcut = nn.Conv2d(4, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(4, 8, 1)

    def forward(self, x):
        return torch.relu(self.b(torch.relu(self.a(x))) + self.shortcut(x))


def test_a_convolution_writes_over_a_residual_that_dies_there_and_not_over_one_it_reads():
    torch.manual_seed(0)
    program = _frozen(Downsample().eval(), torch.randn(1, 4, 12, 12))
    steps = program.runtime.schedule.steps
    (k, into), = program.runtime.schedule.memory.extern_inplace.items()
    assert steps[k].args[10].name == into and steps[k].args[7] == "relu"
    assert "onednn_into_other" in program.runtime.artifact.constants.values()
    # Residual's add reads y, which the second convolution also reads: no overwrite.
    program = _frozen(_randomize_norms(Residual()), torch.randn(1, 4, 12, 12))
    assert not program.runtime.schedule.memory.extern_inplace


@pytest.mark.parametrize("act", [nn.ReLU(), nn.Sigmoid(), nn.Tanh(), nn.SiLU(), nn.GELU(),
                                 nn.GELU(approximate="tanh"), nn.LeakyReLU(0.2), nn.ReLU6()],
                         ids=lambda m: repr(m))
def test_each_unary_post_op_fuses_into_the_convolution(act):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), act).eval()
    program = _frozen(model, torch.randn(1, 3, 9, 9))
    assert _externs(program) == ["kiln.conv.default"] and not program.runtime.schedule.kernels


def test_kernels_after_a_channels_last_convolution_write_channels_last_for_the_next():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.MaxPool2d(2), nn.Conv2d(8, 8, 3)).eval()
    program = _frozen(model, torch.randn(1, 3, 16, 16))
    second = [s for s in program.runtime.schedule.externs if str(s.op) == "kiln.conv.default"][1]
    pooled = second.args[0]
    assert pooled.layout.stride[1] == 1  # channels innermost: no conversion before oneDNN


class FoldThenConcat(nn.Module):
    """MobileViT's shape: a convolution's output folded with views (into rows of C*H, which a
    channels-last tensor cannot be viewed as), unfolded back, convolved, and concatenated with the
    first output before a third convolution."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 1), nn.Conv2d(16, 4, 3, padding=1)

    def forward(self, x):
        y = self.a(x)
        folded = torch.tanh(y.view(1, 8 * 12, 12))
        z = self.b(folded.view(1, 8, 12, 12))
        return self.c(torch.cat([y, z], 1))


def test_values_after_a_view_that_channels_last_data_refuses_keep_the_channels_last_stream():
    # The fold's view has no strided form on channels-last data; its value still propagates, so
    # the concatenation of two channels-last outputs is written channels-last for the next one.
    torch.manual_seed(0)
    program = _frozen(FoldThenConcat().eval(), torch.randn(1, 3, 12, 12))
    convs = [s for s in program.runtime.schedule.externs if str(s.op) == "kiln.conv.default"]
    assert convs[2].args[0].layout.stride[1] == 1
    # The folded value the second convolution reads is computed by a kernel: written channels-last
    # too, as that convolution reads it, though eager's layout of it is channels-first.
    assert convs[1].args[0].layout.stride[1] == 1


@pytest.mark.parametrize("impl", list(MM_IMPLS))
def test_every_mm_implementation_matches_eager(impl, monkeypatch):
    if impl == "mkl" and not torch.backends.mkl.is_available():
        pytest.skip("this torch has no MKL")
    import kiln.passes.gemm_prepack as gemm_prepack

    monkeypatch.setattr(gemm_prepack, "choose_mm", lambda *args: impl)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).eval()
    x = torch.randn(1, 5, 16)
    out, program = compiled(model, x, freezing=True, autotune="default")
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
        y = torch.randn(1, 5, 16)  # a second call: the packs made by the first are reused
        torch.testing.assert_close(program(*_flat(model), y)[0], model(y), rtol=1e-4, atol=1e-4)
    externs = _externs(program)
    assert externs.count("kiln.mm.default") == (0 if impl == "aten" else 2)


class LinearThen(nn.Module):
    """A linear layer, then one post-op; `residual` adds or subtracts a tensor first."""

    def __init__(self, act, residual=None):
        super().__init__()
        self.linear, self.act, self.residual = nn.Linear(16, 32), act, residual

    def forward(self, x, r):
        y = self.linear(x)
        if self.residual == "add":
            y = y + r
        elif self.residual == "sub":
            y = y - r
        return self.act(y)


@pytest.mark.parametrize("act,post_op", [
    (nn.GELU(), "gelu"), (nn.GELU(approximate="tanh"), "gelu"), (nn.ReLU(), "relu"), (nn.SiLU(), "swish"),
    (nn.Sigmoid(), "sigmoid"), (nn.Tanh(), "tanh"), (nn.LeakyReLU(0.1), "leaky_relu"), (nn.Hardtanh(-1, 2), "hardtanh")],
    ids=lambda v: repr(v))
def test_each_linear_unary_post_op_runs_inside_the_onednn_gemm(act, post_op, monkeypatch):
    # bias + activation become oneDNN post-ops of the packed GEMM: no kernel of kiln's reads the output.
    import kiln.passes.gemm_prepack as gemm_prepack
    from kiln.autotune.gemm import FUSED_POST_OP

    monkeypatch.setattr(gemm_prepack, "choose_mm", lambda *args: FUSED_POST_OP if len(args) > 4 else "onednn")
    torch.manual_seed(0)
    model = LinearThen(act).eval()
    x, r = torch.randn(2, 4, 16), torch.randn(2, 4, 32)  # 3-d: reshapes between the GEMM and the post-op
    out, program = compiled(model, x, r, freezing=True, autotune="default")
    with torch.no_grad():
        torch.testing.assert_close(out, model(x, r), rtol=1e-4, atol=1e-4)
    (gemm,) = [s for s in program.runtime.schedule.externs if str(s.op) == "kiln.mm.default"]
    assert gemm.args[3] == post_op and gemm.args[2] is not None  # the bias too
    assert _externs(program) == ["kiln.mm.default"] and not program.runtime.schedule.kernels


class WrittenOutGeluTanh(nn.Module):
    """GELU's tanh form in eager ops, as GPT-2's activation (transformers' NewGELUActivation)
    writes it; `cube` other than 0.044715 is no GELU."""

    def __init__(self, cube=0.044715):
        super().__init__()
        self.cube = cube

    def forward(self, y):
        return 0.5 * y * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (y + self.cube * torch.pow(y, 3.0))))


@pytest.mark.parametrize("impl,cube", [("kiln_post_op", 0.044715), ("onednn_post_op", 0.044715),
                                       ("kiln_post_op", 0.05)])
def test_gelu_written_out_in_its_tanh_form_runs_inside_the_gemm(impl, cube, monkeypatch):
    import kiln.passes.gemm_prepack as gemm_prepack

    monkeypatch.setattr(gemm_prepack, "choose_mm", lambda *args: impl if len(args) > 4 and args[4][0] != "none" else "kiln")
    torch.manual_seed(0)
    model = LinearThen(WrittenOutGeluTanh(cube)).eval()
    x, r = torch.randn(2, 4, 16), torch.randn(2, 4, 32)
    out, program = compiled(model, x, r, freezing=True, autotune="default")
    with torch.no_grad():
        torch.testing.assert_close(out, model(x, r), rtol=1e-5, atol=1e-5)
    (gemm,) = [s for s in program.runtime.schedule.externs if str(s.op) == "kiln.mm.default"]
    if cube == 0.044715:
        assert (gemm.args[3], gemm.args[5]) == ("gelu", "tanh") and not program.runtime.schedule.kernels
    else:  # a different polynomial stays the graph's own kernel after a plain GEMM
        assert gemm.args[3] == "none" and len(program.runtime.schedule.kernels) == 1


@pytest.mark.parametrize("act,residual", [(nn.Identity(), "add"), (nn.Identity(), "sub"), (nn.ReLU(), "add")],
                         ids=lambda v: repr(v))
def test_a_linear_residual_is_one_epilogue_kernel_after_the_packed_gemm(act, residual, monkeypatch):
    # The GEMM runs from oneDNN's packed weight; its bias, the residual and the post-op are one
    # kernel that reads the GEMM's output once.
    import kiln.passes.gemm_prepack as gemm_prepack

    monkeypatch.setattr(gemm_prepack, "choose_mm", lambda *args: "onednn")
    torch.manual_seed(0)
    model = LinearThen(act, residual).eval()
    x, r = torch.randn(8, 16), torch.randn(8, 32)
    out, program = compiled(model, x, r, freezing=True, autotune="default")
    with torch.no_grad():
        torch.testing.assert_close(out, model(x, r), rtol=1e-4, atol=1e-4)
    assert _externs(program) == ["kiln.mm.default"]
    assert len(program.runtime.schedule.kernels) == 1


@pytest.mark.parametrize("impl", ["aten_kn", "onednn"])
def test_a_post_op_stays_a_kernel_when_a_gemm_without_it_wins(impl, monkeypatch):
    import kiln.passes.gemm_prepack as gemm_prepack

    monkeypatch.setattr(gemm_prepack, "choose_mm", lambda *args: impl)
    torch.manual_seed(0)
    model = LinearThen(nn.GELU()).eval()
    x, r = torch.randn(8, 16), torch.randn(8, 32)
    out, program = compiled(model, x, r, freezing=True, autotune="default")
    with torch.no_grad():
        torch.testing.assert_close(out, model(x, r), rtol=1e-4, atol=1e-4)
    (gemm,) = [s for s in program.runtime.schedule.externs if str(s.op) == "kiln.mm.default"]
    assert gemm.args[3] == "none" and len(program.runtime.schedule.kernels) == 1


def _flat(model):
    return [*model.parameters(), *model.buffers()]


class Changing(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = ConvBnRelu()
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(self.conv(x).mean((2, 3)))


@pytest.mark.parametrize("how", ["in_place", "new_parameter", "load_state_dict", "buffer"])
def test_a_weight_changed_after_compiling_gives_the_new_result(how):
    torch.manual_seed(0)
    model = _randomize_norms(Changing())
    compiled_model = kiln.compile(model)
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(compiled_model(x), model(x), rtol=1e-4, atol=1e-4)
        if how == "in_place":
            model.conv.conv.weight.mul_(-0.5)
        elif how == "new_parameter":
            model.head.weight = nn.Parameter(torch.randn(3, 8))
        elif how == "load_state_dict":
            other = _randomize_norms(Changing())
            for p in other.parameters():
                p.data.normal_()
            model.load_state_dict(other.state_dict())
        else:
            model.conv.norm.running_var.mul_(4.0)
        torch.testing.assert_close(compiled_model(x), model(x), rtol=1e-4, atol=1e-4)


def test_freezing_off_and_training_leave_parameters_as_inputs():
    torch.manual_seed(0)
    model = _randomize_norms(ConvBnRelu())
    x = torch.randn(1, 4, 6, 6)
    _, program = compiled(model, x, freezing=False)
    assert not isinstance(program, FrozenProgram)
    assert any(str(s.op) == "aten.convolution.default" for s in program.schedule.externs)


def test_memory_of_constants_and_packs_is_reported():
    torch.manual_seed(0)
    model = _randomize_norms(ConvBnRelu())
    program = _frozen(model, torch.randn(1, 4, 6, 6))
    memory = program.memory()
    weight_bytes = model.conv.weight.numel() * 4
    assert memory["constants"] >= weight_bytes  # the folded weight (and bias) are kiln's own
    assert memory["packed"] >= weight_bytes  # oneDNN's blocked copy


def test_a_frozen_input_of_another_shape_runs_the_graph_through_aten():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4)).eval()
    _, program = compiled(model, torch.randn(3, 6), freezing=True)
    weight, bias = model[0].weight, model[0].bias
    x = torch.randn(3, 6)
    wider_w, wider_b = torch.randn(5, 6), torch.randn(5)
    with torch.no_grad():
        (out,) = program(wider_w, wider_b, x)
        torch.testing.assert_close(out, x @ wider_w.t() + wider_b)
        (out,) = program(weight, bias, x)  # the compiled shapes again: fine
        torch.testing.assert_close(out, model(x))


def test_mode_max_autotune_searches_wider(monkeypatch):
    import kiln.passes.gemm_prepack as gemm_prepack
    from kiln.autotune.gemm import mm_impls

    seen = []
    monkeypatch.setattr(gemm_prepack, "choose_mm", lambda a, b, bias, mode, *post_op: seen.append(mode) or "aten")
    model = nn.Linear(8, 8).eval()
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(model, mode="max-autotune")(x), model(x))
    assert seen == ["max-autotune"]
    assert "onednn" in mm_impls(torch.float32)  # every implementation in either mode; the mode sets the budget
    # CUDA graphs are for CUDA graphs only: a CPU model compiles as in the default mode, no fallback.
    from kiln.runtime.fallback import FALLBACKS

    before = len(FALLBACKS)
    with torch.no_grad():
        torch.testing.assert_close(kiln.compile(model, mode="reduce-overhead")(x), model(x))
    assert len(FALLBACKS) == before


def test_packed_bytes_counts_packs_and_not_views_of_the_weight():
    from kiln.autotune.gemm import mm_call
    from kiln.externs.prepacked import drop_packs, packed_bytes

    a, b = torch.randn(4, 16), torch.randn(32, 16).t()  # b: a weight's transpose, as frozen graphs hand it
    mm_call("aten_nk")(a, b, None, "none", [], None)  # b is [N, K] row-major already: a view of itself
    assert packed_bytes(b) == 0
    mm_call("aten_kn")(a, b, None, "none", [], None)  # a row-major [K, N] copy
    assert packed_bytes(b) == b.numel() * 4
    drop_packs(b)
    assert packed_bytes(b) == 0
    if torch.backends.mkl.is_available():
        mm_call("mkl")(a, b, None, "none", [], None)  # MKL's pack (~7.5 MB at least), b.t() kept beside it
        assert packed_bytes(b) > 0
        drop_packs(b)
        assert packed_bytes(b) == 0


def _compiled_where_aten_wins_every_conv_question(monkeypatch, model, x):
    """`model` compiled with the autotuner's conv questions answered "aten" whenever it is a
    candidate (checked against eager); the program and each question's candidates."""
    from kiln.autotune import gemm

    asked = []

    def choose(op, signature, candidates, *args, **kwargs):
        asked.append(sorted(candidates))
        return "aten" if "aten" in candidates else next(iter(candidates))

    monkeypatch.setattr(gemm, "choose", choose)
    torch.manual_seed(0)
    model = _randomize_norms(model)
    out, program = compiled(model, x, freezing=True, autotune="default")
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    return program, asked


def test_a_graph_of_convolutions_goes_channels_last_even_where_aten_wins_one_alone(monkeypatch):
    # Timed alone, eager's layout can win a close call at the first convolution; its output would
    # then reach every later one channels-first (MobileNetV1: 18.6 against 13.1 ms a call).
    program, asked = _compiled_where_aten_wins_every_conv_question(monkeypatch, Residual(), torch.randn(1, 4, 12, 12))
    assert len(asked) == 2 and all("aten" not in names and "onednn" in names for names in asked)
    assert _externs(program) == ["kiln.conv.default", "kiln.conv.default"]


def test_a_lone_convolution_keeps_eagers_layout_where_that_wins(monkeypatch):
    program, asked = _compiled_where_aten_wins_every_conv_question(monkeypatch, ConvBnRelu(), torch.randn(1, 4, 12, 12))
    assert len(asked) == 1 and "aten" in asked[0]
    assert _externs(program) == ["aten.convolution.default"]


@pytest.mark.parametrize("positions", [[], [0], [3], [1, 2, 3], [0, 2], [3, 1]])
def test_a_frozen_program_picks_its_arguments_in_order(positions):
    from kiln.runtime.frozen import _picker

    args = ("a", "b", "c", "d", "e")
    assert tuple(_picker(positions)(args)) == tuple(args[i] for i in positions)


class Siblings(nn.Module):
    """An attention's q, k and v projections of one input, a gated MLP's gate and up of another,
    and a product of the first whose value is returned."""

    def __init__(self, bias):
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(16, n, bias=bias) for n in (16, 8, 8))
        self.gate, self.up = nn.Linear(16, 32, bias=False), nn.Linear(16, 32, bias=False)
        self.out = nn.Linear(16, 4, bias=False)

    def forward(self, x):
        attention = (self.q(x) * 2 + self.v(x).repeat(1, 1, 2)) @ self.k(x).repeat(1, 1, 2).transpose(1, 2)
        y = x.tanh()
        return attention, (torch.nn.functional.silu(self.gate(y)) * self.up(y)).sum(-1), self.out(x)


def _products(program):
    return [e for e in _externs(program) if e.split(".")[1] in ("mm", "addmm")]


@pytest.mark.parametrize("bias", [False, True])
def test_products_of_one_input_merge_into_one_product_over_concatenated_weights(bias):
    # sibling_products: q/k/v one product, gate/up one; `out`, whose value is a graph output, stays
    # apart (a slice of a merged product would reach the caller with other strides than eager's).
    torch.manual_seed(0)
    model = Siblings(bias).eval()
    x = torch.randn(1, 5, 16)
    program = _frozen(model, x)
    with kiln.config.patch({"backend.disabled_passes": ["sibling_products"]}):
        unmerged = _frozen(model, x)
    assert len(_products(unmerged)) == 6 and len(_products(program)) == 3, _products(program)
    assert program(*_flat(model), x)[2].is_contiguous()


@pytest.mark.parametrize("rows,cache_bytes,from_dram", [(1, 2 << 10, True), (1, 64 << 20, False), (32, 2 << 10, False)])
def test_products_of_a_graph_whose_weights_exceed_the_last_level_cache_are_timed_from_dram(rows, cache_bytes, from_dram,
                                                                                          monkeypatch):
    # The two weights (2 KB and 1 KB) exceed a 2 KB cache together: the graph's products stream
    # them from DRAM. A graph of many rows is compute-bound: timed from the cache all the same.
    import kiln.autotune.gemm as gemm
    import kiln.passes.gemm_prepack as gemm_prepack

    asked = []
    monkeypatch.setattr(gemm, "last_level_cache_bytes", lambda: cache_bytes)
    monkeypatch.setattr(gemm_prepack, "choose_mm", lambda a, b, *args: asked.append(
        args[-1] and gemm.memory_bound(a)) or "kiln")
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
    x = torch.randn(rows, 16)
    out, _ = compiled(model, x, freezing=True, autotune="default")
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    assert asked == [from_dram, from_dram]
