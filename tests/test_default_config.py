"""The configuration users get is the tested one: tiny HuggingFace models through both doors with
kiln's backend settings at their defaults and a private, empty cache, compared with eager.

Every other backend test compiles with freezing and autotuning off (tests/kiln_backend.py), so
that it sees one feature at a time. Here everything is on, as `kiln bench` and users run it: an
encoder with an attention mask (BERT), a decoder with a causal mask (Llama; also asked for its
key/value cache), a conv net with BatchNorm (ResNet), each through `kiln.compile(model)` and
`torch.compile(model, backend="kiln")`, and two of them under bfloat16 autocast. Each test checks,
besides the results of two calls with different inputs (the second after the first), that the
defaults really took effect:

- one graph, no graph break, no fallback to eager;
- the graph is frozen (a FrozenProgram) and its constants are computed once for both calls;
- the autotuner was asked about the GEMMs (the convolutions in ResNet), its answers are stored in
  the private cache, nothing is measured or compiled again on the second call, and the lowered
  Program runs what it chose: `kiln::mm` / `kiln::conv` for each prepacked form it chose (their
  packs held by the frozen constants, made on the first call and reused), ATen's op where ATen won;
- every activation after a GEMM or convolution is fused: inside the library call as a oneDNN
  post-op, or in the kernel that reads the GEMM's output (with the bias add: `bias_epilogue`);
- BatchNorm is folded into the convolutions (no normalization left in the runtime graph).

Which implementation the autotuner picks is measured, so it varies between machines and runs
(in float32 ATen usually wins these tiny GEMMs and oneDNN or ATen on channels-last data the
convolutions; in bfloat16 oneDNN's packed GEMM usually wins); the tests check that the choice
made is the one that runs, whichever it is. The models are tiny (2 layers, hidden 32) so that the
file stays cheap with an empty cache: about 30 s on one core, of which autotuning takes 0.4 s
(the default budget stops at 50 ms per candidate; these shapes run in microseconds) and building
the C++ kernels about 8 s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import transformers

import kiln
from kiln.autotune.choose import clear_memory
from kiln.autotune.gemm import FUSED_POST_OPS
from kiln.backend import watch
from benchmarks.accuracy import compare
from kiln.config import BackendSettings
from kiln.ir.analysis import OpCounter, run
from kiln.runtime import fallback
from kiln.runtime.compiled_graph import CompiledGraph
from kiln.runtime.frozen import FrozenProgram

# float32: the compiled graph sums in other orders (fused layer norms, softmax inside attention,
# GEMMs by another library, BatchNorm folded into the weights), each a few float32 ulps (1.2e-7)
# on values of order 1; after two layers that stays below 1e-5 (measured: up to 8e-6 on ResNet's
# folded convolutions). 1e-4 is ten times that, and far below what a wrong mask, bias or
# post-op gives (order 1e-1).
F32 = dict(rtol=1e-4, atol=1e-4)

GEMMS = {"aten.mm.default", "aten.addmm.default", "kiln.mm.default"}
CONVS = {"aten.convolution.default", "kiln.conv.default"}
# kiln's GEMM with the row norm or softmax after it (kiln/passes/gemm_layer_norm.py): where the autotuner
# chose kiln's GEMM for such a product (a timed choice), its kiln::mm became one of these.
NORM_FUSED = {"kiln.mm_layer_norm.default", "kiln.mm_add_layer_norm.default", "kiln.mm_softmax.default"}
# Activation -> how it appears in a kiln kernel (an IR op) and as a oneDNN post-op.
RELU, GELU, SILU, TANH = ("relu", "relu"), ("erf", "gelu"), ("sigmoid", "swish"), ("tanh", "tanh")


@dataclass(frozen=True)
class Case:
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[int], dict[str, torch.Tensor]]  # seed -> keyword arguments of one call
    outputs: Callable[[Any], list[torch.Tensor]]  # what to compare with eager
    activations: dict[tuple[str, str], int]  # activation -> how many the model applies after a GEMM or conv


def _ids(seed: int, vocab: int = 128, shape: tuple[int, int] = (2, 12)) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=128)


def _bert() -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.BertModel(transformers.BertConfig(**SMALL, max_position_embeddings=64)).eval()


def _bert_inputs(seed: int) -> dict[str, torch.Tensor]:
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 7 + seed:] = 0  # the second sequence padded, at a place that depends on the input
    return {"input_ids": _ids(seed), "attention_mask": mask}


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**SMALL, num_key_value_heads=1, max_position_embeddings=64, use_cache=False)
    return transformers.LlamaForCausalLM(config).eval()


def _resnet() -> torch.nn.Module:
    torch.manual_seed(0)
    model = transformers.ResNetModel(transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1]))
    # A fresh BatchNorm is the identity (mean 0, var 1, weight 1, bias 0): a wrong fold would go
    # unnoticed. Statistics and affine parameters away from it make the fold matter.
    g = torch.Generator().manual_seed(2)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-1, 1, generator=g)
                m.running_var.uniform_(0.5, 2, generator=g)
                m.weight.uniform_(0.5, 2, generator=g)
                m.bias.uniform_(-1, 1, generator=g)
    return model.eval()


def _pixels(seed: int) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed))}


CASES = {
    # GELU after each intermediate dense layer, tanh after the pooler's.
    "bert": Case(_bert, _bert_inputs, lambda o: [o.last_hidden_state, o.pooler_output], {GELU: 2, TANH: 1}),
    # SiLU after each gate projection (its product with the up projection joins the same kernel).
    "llama": Case(_llama, lambda seed: {"input_ids": _ids(seed)}, lambda o: [o.logits], {SILU: 2}),
    # The stem, and in each bottleneck layer two convolutions and the residual add.
    "resnet": Case(_resnet, _pixels, lambda o: [o.last_hidden_state, o.pooler_output], {RELU: 7}),
}

DOORS = {
    "kiln.compile": lambda model: kiln.compile(model),
    "torch.compile": lambda model: torch.compile(model, backend="kiln"),
}


@pytest.fixture
def cache(tmp_path: Path):
    """An empty private cache, kiln's backend settings at their declared defaults (whatever the
    environment says: this file tests the defaults), and nothing remembered from earlier tests."""
    defaults = BackendSettings()
    settings = {f"backend.{f.name}": getattr(defaults, f.name) for f in dataclasses.fields(defaults)}
    clear_memory()  # autotune answers this process already has would never reach the private cache
    fallback.reset()
    kiln.reset()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    with kiln.config.patch({**settings, "cache.dir": str(tmp_path / "cache")}):
        yield tmp_path / "cache"
    clear_memory()


# --- what the defaults leave in a compiled graph ---------------------------------------------


def _answers(cache: Path) -> list[dict[str, Any]]:
    """The autotuner's answers stored in the private cache."""
    return [json.loads(path.read_text()) for path in sorted((cache / "autotune").glob("*/*.json"))]


def _externs(graph: CompiledGraph, ops: set[str]) -> list[Any]:
    return [step for step in graph.program.externs if str(step.op) in ops]


def _check_choices_run(graph: CompiledGraph, answers: list[dict[str, Any]], op: str, externs: set[str]) -> None:
    """The Program runs what the autotuner chose for each question about `op`: the implementation
    of each `kiln::` extern is a choice it made, each choice other than ATen's is run by one, and
    ATen's own op remains exactly when ATen won a question."""
    choices = {answer["choice"] for answer in answers if answer["op"] == op}
    assert choices, f"the autotuner was asked nothing about {op}"
    ours = [step for step in _externs(graph, externs) if str(step.op).startswith("kiln.")]
    fused = {impl: name for name, impl in FUSED_POST_OPS.items()}  # a GEMM with its post-op inside
    run_impls = {fused[step.argument("impl")] if op == "mm" and step.argument("unary") != "none" else step.argument("impl")
                 for step in ours}
    if op == "mm":  # a product of kiln's GEMM that gemm_layer_norm fused with the norm (or softmax) after it
        run_impls |= {_impl(step) or "kiln" for step in _externs(graph, NORM_FUSED)}
    assert run_impls == choices - {"aten"}, (run_impls, choices)
    aten_left = [step for step in _externs(graph, externs) if not str(step.op).startswith("kiln.")]
    assert bool(aten_left) == ("aten" in choices), (aten_left, choices)


def _fused_activations(graph: CompiledGraph) -> dict[tuple[str, str], int]:
    """Activations applied in a GEMM or convolution (a oneDNN post-op) or in a kernel that reads
    one's output directly (with the bias add, when there is one, in the same kernel). A kernel
    member counts an activation once however often its loop body applies it: a max pool over a
    ReLU'd convolution output (ResNet's stem, when ATen's convolution wins the autotuner's
    question) applies the ReLU to each of the window's nine loads."""
    products = {out.name for step in _externs(graph, GEMMS | CONVS) for out in step.outputs if out is not None}
    found: dict[tuple[str, str], int] = {}
    for step in _externs(graph, {"kiln.mm.default", "kiln.conv.default"}):
        for activation in (RELU, GELU, SILU, TANH):
            if step.argument("unary") == activation[1]:
                found[activation] = found.get(activation, 0) + 1
    for kernel in graph.schedule.kernels:
        if not {name for member in kernel.members for name, _ in member.reads} & products:
            continue
        for member in kernel.members:
            counts = run(OpCounter(), member.node).counts
            for activation in (RELU, GELU, SILU, TANH):
                if counts.get(activation[0]):
                    found[activation] = found.get(activation, 0) + 1
    return found


def _ops_in_kernels(graph: CompiledGraph) -> set[str]:
    return {op for kernel in graph.schedule.kernels for member in kernel.members
            for op in run(OpCounter(), member.node).counts}


# --- running a case, checking what the defaults did -------------------------------------------


@dataclass
class Run:
    expected: list[list[torch.Tensor]]  # eager's outputs for the two inputs
    actual: list[list[torch.Tensor]]  # the compiled model's
    built: list[Any]  # what kiln's backend built meanwhile (kiln.backend.watch)
    answers: list[dict[str, Any]]  # the autotuner's stored answers after the first call
    packed: int | None  # bytes of packed weights after the first call


def _run(case: Case, door: str, cache: Path, context: Callable[[], Any] = contextlib.nullcontext) -> Run:
    """Eager and compiled calls on two different inputs, the second after the first, under
    `torch.no_grad()` and `context()`."""
    model = case.build()
    inputs = [case.inputs(1), case.inputs(2)]
    with torch.no_grad(), context():
        expected = [case.outputs(model(**x)) for x in inputs]
        compiled = DOORS[door](model)
        with watch() as built:
            actual = [case.outputs(compiled(**inputs[0]))]
            answers = _answers(cache)
            packed = built[0].memory()["packed"] if built and isinstance(built[0], FrozenProgram) else None
            actual.append(case.outputs(compiled(**inputs[1])))
    _check_one_graph(door, model, inputs[0], context)
    return Run(expected, actual, built, answers, packed)


def _check_one_graph(door: str, model: torch.nn.Module, inputs: dict[str, torch.Tensor], context: Callable[[], Any]) -> None:
    """One graph, compiled whole: no graph break, no fallback to eager."""
    assert not fallback.FALLBACKS, [str(f) for f in fallback.FALLBACKS]
    if door == "kiln.compile":
        with torch.no_grad(), context():
            report = kiln.explain(model, **inputs)
        assert report.graph_count == 1 and not report.breaks, report
    else:
        assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])


def _packs(step: Any) -> bool:
    """Whether the extern keeps a packed copy of its weight: not ATen's GEMM over the weight as it
    lies, nor `aten_kn` (a [K, N] row-major copy) over a weight that is one already (q/k/v or
    gate/up weights concatenated by sibling_products are), nor `aten_nk` (a [N, K] row-major copy,
    read transposed) over one that is that already (a Linear's own weight is). kiln's attention
    has no weight (the autotuner picks it over ATen's where it is faster: grouped-query attention
    since e4aa403)."""
    if str(step.op) == "kiln.attention.default":
        return False
    impl = _impl(step)
    if impl == "aten":
        return False
    if impl in ("aten_kn", "aten_nk"):
        weight = step.args[1].layout  # the [K, N] operand
        row_major = (weight.size[1], 1) if impl == "aten_kn" else (1, weight.size[0])
        return tuple(weight.stride) != row_major
    return True


def _impl(step: Any) -> str | None:
    """The implementation a kiln:: extern runs, for the ops the autotuner chooses one for."""
    try:
        return step.argument("impl")
    except KeyError:  # kiln's GEMM with a layer norm, kiln's attention: one implementation
        return None


def _check_defaults_took_effect(name: str, case: Case, result: Run, cache: Path) -> None:
    # One graph, and nothing compiled again for the second input.
    assert len(result.built) == 1, result.built
    program = result.built[0]
    # Frozen: the parameters are constants, computed once for both calls.
    assert isinstance(program, FrozenProgram), type(program)
    assert program.freezes == 1
    graph = program.runtime
    assert isinstance(graph, CompiledGraph) and graph.program is not None

    # Autotuned, with the answers kept in the private cache and reused by the second call.
    assert result.answers, "the autotuner stored no answer"
    assert _answers(cache) == result.answers
    op, externs = ("conv", CONVS) if name == "resnet" else ("mm", GEMMS)
    _check_choices_run(graph, result.answers, op, externs)
    # Prepacked where chosen: every kiln:: extern whose implementation wants the weight in another
    # layout keeps it packed, made on the first call and reused (not made again) by the second.
    # ATen's GEMM over the [N, K] weight reads a Linear's weight as it lies (the autotuner picks it
    # for small GEMMs, more often on a busy machine): nothing to pack.
    ours = [s for s in graph.program.externs if str(s.op).startswith("kiln.")]
    packing = [s for s in ours if _packs(s)]
    assert (result.packed > 0) == bool(packing), (result.packed, ours)
    assert program.memory()["packed"] == result.packed

    # Post-ops fused: no activation runs as a kernel of its own after a GEMM or convolution.
    assert _fused_activations(graph) == case.activations
    if name == "resnet":
        # BatchNorm folded into the convolutions' weights and biases, in the constants graph.
        assert not {"rsqrt", "sqrt"} & _ops_in_kernels(graph)
        assert not [s for s in graph.program.externs if "batch_norm" in str(s.op)]


# --- the tests -------------------------------------------------------------------------------


def _assert_close(actual: list[torch.Tensor], expected: list[torch.Tensor], **tolerance: float) -> None:
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, **tolerance)


@pytest.mark.parametrize("door", list(DOORS))
@pytest.mark.parametrize("name", list(CASES))
def test_default_configuration_matches_eager_and_takes_effect(name, door, cache):
    result = _run(CASES[name], door, cache)
    for actual, expected in zip(result.actual, result.expected):
        _assert_close(actual, expected, **F32)
    _check_defaults_took_effect(name, CASES[name], result, cache)


def _key_values(out: Any) -> list[torch.Tensor]:
    """Every layer's keys and values in a decoder's returned cache (its name and layout changed
    between transformers 4 and 5)."""
    cache = out["cache"] if "cache" in out else out["past_key_values"]
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [t for layer in layers for t in (layer.keys, layer.values)]
    return [t for pair in zip(cache.key_cache, cache.value_cache) for t in pair]


@pytest.mark.parametrize("door", list(DOORS))
def test_decoder_returns_its_key_value_cache(door, cache):
    # The config says use_cache=False (as above); a call may still ask for the cache, as
    # generation's first step does: the keys and values become outputs of the same graph.
    case = dataclasses.replace(CASES["llama"], inputs=lambda seed: {"input_ids": _ids(seed), "use_cache": True},
                               outputs=lambda o: [o.logits, *_key_values(o)])
    result = _run(case, door, cache)
    for actual, expected in zip(result.actual, result.expected):
        assert len(actual) == 1 + 2 * SMALL["num_hidden_layers"]
        _assert_close(actual, expected, **F32)
    _check_defaults_took_effect("llama", case, result, cache)


# bfloat16 autocast is on the default path too (docs/freezing.md#bfloat16): casts of frozen
# weights made once in the constants graph, BatchNorm folded into a bfloat16 convolution, GEMMs
# autotuned in bfloat16. Two models, one door each: the doors differ only in capture.
@pytest.mark.parametrize("name,door", [("bert", "torch.compile"), ("resnet", "kiln.compile")])
def test_bfloat16_autocast_matches_eager_and_takes_effect(name, door, cache):
    case = CASES[name]
    result = _run(case, door, cache, lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    # kiln rounds in other places than eager (a fused chain rounds once; a folded BatchNorm is
    # rounded into the weight), so bfloat16 results differ from eager's by a few bfloat16 ulps
    # (2**-8 relative). kiln bench's tolerance rule judges them: close to eager, or no further
    # from the exact result than eager's own bfloat16 run (here a float32 run is exact enough:
    # 2**16 times finer).
    model = case.build()
    with torch.no_grad():
        exact = [case.outputs(model(**case.inputs(seed))) for seed in (1, 2)]
    for actual, expected, truth in zip(result.actual, result.expected, exact):
        verdict = compare(actual, expected, lambda truth=truth: truth)
        assert verdict.passed, verdict
    assert any(t.dtype == torch.bfloat16 for t in result.actual[0])
    _check_defaults_took_effect(name, case, result, cache)
