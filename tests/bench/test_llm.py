"""`kiln bench --suite llm`: generate() of decoder LMs timed per mode in one process, each mode's
tokens checked against eager's, the bytes a decode step reads against the machine's bandwidth;
modes whose API has not landed shown as not available, with the reason. Tiny models, 4 new tokens."""

import functools
import json
import re

import pytest
import torch
from torch import nn

import benchmarks.llm
import kiln
from benchmarks import llm_modes, roofline
from benchmarks.llm import LlmResult, LlmRun, LlmSettings, StepClock, generate_options, measure_group
from benchmarks.llm_report import HEADER, describe_bandwidth, llm_tables
from benchmarks.machine import cpu_model
from benchmarks.roofline import StepBytes, decode_step_bytes, linear_names
from kiln.cli import main
from kiln.native import build as native_build

TINY = ["--suite", "llm", "--models", "llama-tiny", "--batch", "1", "--prompt-len", "8", "--new-tokens", "4",
        "--iters", "2", "--warmup", "1"]


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch, tmp_path):
    # Reading 1 GiB several times is the machine's business, not these tests'; kiln's compiled
    # graphs go to a cache of the test's own.
    monkeypatch.setattr(benchmarks.llm, "read_bandwidth", lambda threads=None, **how: 10.0)
    monkeypatch.setattr(benchmarks.llm, "probe_ready", lambda: None)
    with kiln.config.patch({"cache.dir": str(tmp_path / "cache")}):
        yield


@pytest.fixture
def apis_missing(monkeypatch):
    """kiln as it was before bf16 GEMMs and quantization landed: no kiln.quantize, and an
    fp32_gemm option kiln.compile does not know."""
    compile = kiln.compile

    def without_fp32_gemm(fn=None, **kwargs):
        if "fp32_gemm" in (kwargs.get("options") or {}):
            raise ValueError("kiln.compile: unknown option 'fp32_gemm'; accepted options: recompile_limit, trace")
        return compile(fn, **kwargs)

    monkeypatch.setattr(kiln, "quantize", None, raising=False)  # (a lazy attribute: kiln.__getattr__)
    monkeypatch.setattr(kiln, "compile", without_fp32_gemm)


def _rows(text: str, header: list[str]) -> list[dict[str, str]]:
    """The text table's rows as {column: cell}, columns found by the header's positions."""
    lines = text.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("model ") and "decode tok/s" in line)
    starts, at = [], 0
    for h in header:  # (in order: "mode" is also in "model")
        starts.append(lines[top].index(h, at))
        at = starts[-1] + len(h)
    rows = []
    for line in lines[top + 2:]:
        if not line.strip():
            break
        rows.append({h: line[a:b].strip() for h, a, b in zip(header, starts, starts[1:] + [None])})
    return rows


def test_eager_and_kiln_end_to_end_table_and_json(capsys, tmp_path):
    out, md = tmp_path / "llm.json", tmp_path / "llm.md"
    assert main(["bench", *TINY, "--modes", "eager,kiln", "--json", str(out), "--markdown", str(md)]) == 0
    text = capsys.readouterr().out
    assert cpu_model() in text.splitlines()[0] and torch.__version__ in text.splitlines()[0]  # the machine line
    assert "read bandwidth" in text and "10.0 GB/s" in text
    rows = {r["mode"]: r for r in _rows(text, HEADER)}
    assert set(rows) == {"eager", "kiln"}
    assert rows["eager"]["accurate"] == "reference" and rows["kiln"]["accurate"] == "yes"
    for r in rows.values():
        assert float(r["decode tok/s"]) > 0 and float(r["prefill tok/s"]) > 0 and re.fullmatch(r"\d+% of \d+", r["roofline"])
        assert r["bytes/step"].endswith("MB") and r["÷ inductor-freeze"] == "-"  # (the peer did not run)

    data = json.loads(out.read_text())
    assert data["meta"]["suite"] == "llm" and data["meta"]["torch"] == torch.__version__ and data["meta"]["isa"] is not None
    run = LlmRun.from_json(data["llm"])
    assert run.bandwidth == {1: 10.0} and set(run.bandwidth_others) == {1} and run.settings.new_tokens == 4
    kiln_row = next(r for r in run.results if r.mode == "kiln")
    assert kiln_row.status == "ok" and kiln_row.tokens_equal and kiln_row.agreement == 1.0
    assert kiln_row.decode_s > 0 and kiln_row.step_bytes.total > 0 and kiln_row.first_s >= kiln_row.decode_s
    assert 0 < kiln_row.forward_s < kiln_row.decode_s  # (generate's own work between the steps)
    assert data["llm"]["results"][0]["decode_tokens_per_s"] == pytest.approx(1 / run.results[0].decode_s)
    assert "| model | batch | mode | prefill tok/s |" in md.read_text()

    assert main(["report", str(out)]) == 0  # re-rendered from the JSON alone
    assert {r["mode"] for r in _rows(capsys.readouterr().out, HEADER)} == {"eager", "kiln"}


def test_the_dynamic_kv_cache_is_generates_default_and_said_so(capsys, tmp_path, monkeypatch):
    """`--kv-cache dynamic` runs generate() with HF's default DynamicCache (no cache_implementation),
    eager's tokens; the table's title and the JSON say which cache ran."""
    import transformers

    caches = []
    generate = transformers.GenerationMixin.generate

    def spying(self, *args, **kwargs):
        caches.append(kwargs.get("cache_implementation"))
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(transformers.GenerationMixin, "generate", spying)
    out = tmp_path / "llm.json"
    assert main(["bench", *TINY, "--modes", "eager,kiln", "--kv-cache", "dynamic", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "dynamic KV cache" in text and caches and set(caches) == {None}
    rows = {r["mode"]: r for r in _rows(text, HEADER)}
    assert rows["kiln"]["accurate"] == "yes"
    run = LlmRun.from_json(json.loads(out.read_text())["llm"])
    assert run.settings.kv_cache == "dynamic"
    assert generate_options(4, "static")["cache_implementation"] == "static"
    with pytest.raises(ValueError, match="kv_cache must be one of static, dynamic"):
        generate_options(4, "paged")


def test_modes_without_their_api_are_not_available_with_the_reason(apis_missing):
    modes = [llm_modes.LLM_MODES[m] for m in ("kiln-bf16", "kiln-int8", "kiln-int4")]
    settings = LlmSettings(models=("llama-tiny",), modes=tuple(m.name for m in modes), batches=(1,), prompt_len=8,
                           new_tokens=4, rounds=1)
    results = measure_group(llm_modes.LLM_MODELS["llama-tiny"].build(), "llama-tiny", 1, 1, modes, settings)
    assert [r.status for r in results] == ["n/a"] * 3
    bf16, int8, int4 = results
    assert "kiln.compile does not accept options={'fp32_gemm': 'bf16'}" in bf16.note and "unknown option" in bf16.note
    assert int8.note == "kiln.quantize (weight-only int8) does not exist yet" and "int4" in int4.note
    # The bytes a step would read are still shown (the rule): int4 about an eighth of float32's weights.
    assert int4.step_bytes.linear < bf16.step_bytes.linear / 3
    run = LlmRun(settings, results, {1: 10.0})
    (_, header, rows), = llm_tables(run)
    notes = [dict(zip(header, row))["note"] for row in rows]
    assert notes[0].startswith("not available: kiln.compile does not accept options")
    assert notes[1] == "not available: kiln.quantize (weight-only int8) does not exist yet"


def test_a_mode_whose_tokens_differ_is_reported_not_hidden(monkeypatch):
    """A float32 mode that changes the logits shows NO with the share of tokens that still agree;
    a lower-precision mode shows its agreement."""
    def nudged(model):
        forward = model.forward

        def run(*args, **kwargs):
            out = forward(*args, **kwargs)
            out.logits[..., 7] += 1e3  # token 7 wins every step
            return out
        model.forward = functools.wraps(forward)(run)
        return model

    exact = llm_modes.LlmMode("nudged", "test", "fp32", True, nudged, lambda: None)
    approximate = llm_modes.LlmMode("nudged-int8", "test", "int8", False, nudged, lambda: None)
    modes = [llm_modes.LLM_MODES["eager"], exact, approximate]
    settings = LlmSettings(models=("llama-tiny",), modes=("eager",), batches=(2,), prompt_len=8, new_tokens=4, rounds=2)
    eager, wrong, low = measure_group(llm_modes.LLM_MODELS["llama-tiny"].build(), "llama-tiny", 2, 1, modes, settings)
    assert eager.tokens_equal and not wrong.tokens_equal and wrong.agreement < 1
    run = LlmRun(settings, [eager, wrong, low], {1: 10.0})
    (_, header, rows), = llm_tables(run)
    cells = [dict(zip(header, row))["accurate"] for row in rows]
    assert cells[0] == "reference" and cells[1].startswith("NO (") and cells[2].endswith("of tokens agree")


def _tiny_expected(batch: int, cache_len: float) -> dict[str, int]:
    """llama-tiny by hand: hidden 64, 2 layers, 4 heads over 2 KV heads (head dim 16), MLP 128, vocabulary 1000."""
    per_layer = [(64, 64), (32, 64), (32, 64), (64, 64), (128, 64), (128, 64), (64, 128)]  # q k v o gate up down: (out, in)
    layers = per_layer * 2 + [(1000, 64)]  # + the LM head
    weights = sum(o * i for o, i in layers)  # 137728
    rows = sum(o for o, _ in layers)  # output channels: 2024
    assert (weights, rows) == (137728, 2024)
    return dict(
        fp32=weights * 4, bf16=weights * 2, int8=weights + rows * 4,
        int4=weights // 2 + rows * 1 * 4,  # one group of 128 per row (in_features <= 128): a float32 scale with its zero
        embedding=batch * 64 * 4,
        other=(2 * 2 * 64 + 64) * 4 + 2 * 8 * 4,  # RMSNorm weights; inv_freq and original_inv_freq
        kv=2 * 2 * batch * 2 * 16 * int(cache_len) * 4,  # layers x (K, V) x batch x KV heads x head dim x length
    )


@pytest.mark.parametrize("weights", ["fp32", "bf16", "int8", "int4"])
def test_the_bytes_of_a_decode_step_of_the_tiny_llama_by_hand(weights):
    model = llm_modes.LLM_MODELS["llama-tiny"].build()
    expected = _tiny_expected(batch=2, cache_len=10)
    step = decode_step_bytes(model, weights, batch=2, cache_len=10)
    assert (step.linear, step.embedding, step.other, step.kv_cache) == (
        expected[weights], expected["embedding"], expected["other"], expected["kv"])
    assert step.total == expected[weights] + expected["embedding"] + expected["other"] + expected["kv"]


def test_a_tied_lm_head_is_read_in_full_and_the_embedding_a_row_per_sequence():
    import transformers

    config = transformers.Qwen2Config(vocab_size=500, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = transformers.Qwen2ForCausalLM(config).eval()
    assert model.lm_head.weight is model.model.embed_tokens.weight
    step = decode_step_bytes(model, "fp32", batch=3, cache_len=4)
    qkv_bias = (32 + 16 + 16) * 4
    layer = (32 * 32 + 16 * 32 * 2 + 32 * 32 + 3 * 64 * 32) * 4 + qkv_bias
    assert step.linear == layer + 500 * 32 * 4 and step.embedding == 3 * 32 * 4


def test_quantized_layers_are_counted_by_their_own_tensors():
    model = llm_modes.LLM_MODELS["llama-tiny"].build()
    names = linear_names(model)

    class Int8Linear(nn.Module):  # what a weight-only quantization leaves: int8 weights, a scale per row
        def __init__(self, linear):
            super().__init__()
            self.register_buffer("weight", torch.zeros(linear.weight.shape, dtype=torch.int8))
            self.register_buffer("scale", torch.ones(linear.out_features, dtype=torch.bfloat16))

    for name in names:
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, Int8Linear(model.get_submodule(name)))
    step = decode_step_bytes(model, "int8", batch=1, cache_len=10, linears=names, from_tensors=True)
    assert step.linear == 137728 + 2024 * 2 and step.source == "tensors"  # bfloat16 scales, as the tensors say


def test_an_int4_layer_s_zero_points_are_not_counted_apart_from_its_scales():
    import kiln

    model = llm_modes.LLM_MODELS["llama-tiny"].build()
    names = linear_names(model)
    kiln.quantize(model, "int4", group_size=32)
    step = decode_step_bytes(model, "int4", batch=1, cache_len=10, linears=names, from_tensors=True)
    layers = [model.get_submodule(name) for name in names]
    assert all(layer.zeros is not None for layer in layers)  # (kept by the layer; read inside the scales' words)
    assert step.linear == sum(layer.qweight.nbytes + layer.scales.nbytes for layer in layers)


def test_the_clock_times_the_prefill_and_each_decode_step():
    clock = StepClock()
    clock.calls = [(0.0, 0.5), (0.6, 0.7), (0.8, 0.9), (1.0, 1.1)]  # prefill, then 3 steps with gaps between
    prefill, step = clock.prefill_and_step()
    assert prefill == pytest.approx(0.5) and step == pytest.approx(0.2)  # (1.1 - 0.5) / 3: the gaps count
    assert clock.forward() == pytest.approx(0.1)  # the steps' forwards alone, without the gaps
    clock.calls = [(0.0, 0.5), (0.5, 0.51), (0.51, 0.52), (0.52, 0.92)]  # one slow step among fast ones
    assert clock.forward() == pytest.approx(0.14) and clock.forward() <= clock.prefill_and_step()[1] + 1e-12


def test_ratio_to_inductor_freeze_and_roofline_per_row():
    settings = LlmSettings(models=("m",), modes=("inductor-freeze", "kiln"), batches=(4,), prompt_len=10, new_tokens=8)
    step = StepBytes(linear=900_000_000, embedding=0, other=0, kv_cache=100_000_000)
    peer = LlmResult("m", 4, "inductor-freeze", 2, "ok", prefill_s=0.5, decode_s=0.2, step_bytes=step,
                     tokens_equal=True, agreement=1.0, prompt_len=10, new_tokens=8)
    mine = LlmResult("m", 4, "kiln", 2, "ok", prefill_s=0.25, decode_s=0.1, forward_s=0.08, step_bytes=step,
                     tokens_equal=True, agreement=1.0, prompt_len=10, new_tokens=8)
    (title, header, rows), = llm_tables(LlmRun(settings, [peer, mine], {2: 20.0}))
    cells = dict(zip(header, rows[1]))
    assert "2 threads" in title and "20.0 GB/s" in title
    assert (cells["prefill tok/s"], cells["decode tok/s"], cells["decode ms/token"], cells["forward ms"]) == (
        "160", "40.0", "100.00", "80.00")
    assert dict(zip(header, rows[0]))["forward ms"] == "-"  # (not measured: shown as such)
    assert (cells["÷ inductor-freeze"], cells["bytes/step"], cells["GB/s"], cells["roofline"]) == (
        "0.50x", "1000 MB", "10.0", "50%")
    assert dict(zip(header, rows[0]))["÷ inductor-freeze"] == "1.00x"


def test_a_bandwidth_measured_beside_busy_neighbours_says_so():
    settings = LlmSettings(models=("m",), modes=("kiln",))
    assert "20.0 GB/s at 2 threads;" not in describe_bandwidth(LlmRun(settings, [], {2: 20.0}, {2: 0.02}))
    busy = describe_bandwidth(LlmRun(settings, [], {2: 20.0}, {2: 0.66}))
    assert "20.0 GB/s at 2 threads (other processes used 66% of the CPUs meanwhile: likely below" in busy


def test_each_call_is_bracketed_by_probes_and_rounds_whose_probes_disagree_are_left_out(monkeypatch):
    # A shared VM's bandwidth moves while the suite runs (between ~34 and ~62 GB/s on a 2-core AMD
    # EPYC): a probe before the first timed call and after each, each call's GB/s over the mean of
    # the probes around it, counted where they agree; the best probe is the run's bandwidth.
    readings = iter([10.0, 30.0, 20.0, 40.0, 25.0, 27.0])
    monkeypatch.setattr(benchmarks.llm, "read_bandwidth", lambda threads=None, **how: next(readings))
    settings = LlmSettings(models=("llama-tiny",), modes=("eager", "kiln"), batches=(1,), threads=(1,), prompt_len=8,
                           new_tokens=4, rounds=2, warmup=1)
    run = benchmarks.llm.run_llm_suite(settings, progress=None)
    assert run.bandwidth_probes == {1: [10.0, 30.0, 20.0, 40.0, 25.0, 27.0]} and run.bandwidth == {1: 40.0}
    assert "40.0 GB/s at 1 thread (best of 6 probes, 10.0-40.0)" in describe_bandwidth(run)
    eager, compiled = run.results
    # Round 1 runs eager then kiln, round 2 kiln then eager (no mode always first).
    assert (eager.probes_gbps, eager.probes_after_gbps) == ([30.0, 25.0], [20.0, 27.0])
    assert (compiled.probes_gbps, compiled.probes_after_gbps) == ([20.0, 40.0], [40.0, 25.0])
    total = eager.step_bytes.total
    # eager: round 1's probes (30, 20) disagree, round 2's (25, 27) agree: round 2 alone, over 26
    assert eager.bracketed_rounds() == [False, True]
    assert eager.roofline == pytest.approx(total / eager.decode_rounds_s[1] / 1e9 / 26.0)
    # kiln: neither round's probes agree: every round, each over its probes' mean
    assert compiled.bracketed_rounds() == [False, False] and compiled.roofline_bandwidth == pytest.approx(31.25)
    fractions = [total / step / 1e9 / gbps for step, gbps in zip(compiled.decode_rounds_s, (30.0, 32.5))]
    assert compiled.roofline == pytest.approx(sum(fractions) / 2)
    (title, header, rows), = llm_tables(run)
    assert dict(zip(header, rows[0]))["roofline"] == f"{eager.roofline:.0%} of 26 (1 of 2 rounds)"
    assert dict(zip(header, rows[1]))["roofline"] == f"{compiled.roofline:.0%} of 31 (no round's probes agree)"
    assert "40.0 GB/s" in title and "agree within 1.2x" in title
    again = LlmRun.from_json(json.loads(json.dumps(run.to_json())))
    assert again.bandwidth_probes == run.bandwidth_probes and again.bandwidth == run.bandwidth
    assert again.results[1].roofline == compiled.roofline and again.results[0].roofline == eager.roofline


def test_the_probes_buffer_is_made_before_the_others_clock_starts(monkeypatch):
    # The line reader's C++ compiles in other processes: inside the clock, that read as "other
    # processes used 41-48 % of the CPUs" on an idle 2-core Intel Xeon.
    events, made, buffers = [], object(), []
    monkeypatch.setattr(benchmarks.llm, "probe_ready", lambda: events.append("buffer") or made)

    class Clock:
        def __init__(self) -> None:
            events.append("clock")

        def share(self) -> float:
            return 0.0

    monkeypatch.setattr(benchmarks.llm, "OthersClock", Clock)
    monkeypatch.setattr(benchmarks.llm, "read_bandwidth", lambda threads=None, **how: buffers.append(how.get("buffer")) or 10.0)
    settings = LlmSettings(models=("llama-tiny",), modes=("eager",), batches=(1,), threads=(1,), prompt_len=8,
                           new_tokens=4, rounds=1, warmup=1)
    benchmarks.llm.run_llm_suite(settings, progress=None)
    assert events[:2] == ["buffer", "clock"] and len(buffers) >= 2 and all(b is made for b in buffers)


def test_a_result_written_before_the_after_probes_keeps_its_roofline():
    step = StepBytes(linear=1_000_000_000, embedding=0, other=0, kv_cache=0)
    old = LlmResult("m", 1, "kiln", 2, "ok", decode_s=0.1, step_bytes=step, decode_rounds_s=[0.1, 0.05],
                    probes_gbps=[20.0, 40.0])
    assert old.bracketed_rounds() == [True, True] and old.roofline == pytest.approx(0.5)


def test_a_ready_probe_has_its_line_reader_built(monkeypatch):
    built = []
    monkeypatch.setattr(roofline, "lines_read", lambda buffer: built.append(buffer) or (lambda: None))
    buffer = roofline.probe_ready(1 << 20)
    assert len(built) == 1 and built[0] is buffer and buffer.numel() * 4 == 1 << 20


def test_the_read_bandwidth_probe_reads_a_buffer():
    assert 0.1 < roofline.read_bandwidth(1, buffer_bytes=1 << 24, passes=1) < 10_000


def test_the_probe_takes_the_best_of_aten_s_reads_and_kiln_s_line_reader(monkeypatch):
    timed = []

    def best_seconds(read, passes):
        read()  # (each way of reading runs: kiln's line reader included)
        timed.append(read)
        return 0.5 if len(timed) == 5 else 1.0  # the line reader, the fifth, is the fastest here

    monkeypatch.setattr(roofline, "best_seconds", best_seconds)
    gbps = roofline.read_bandwidth(2, buffer_bytes=(1 << 22) + 100, passes=1)
    assert len(timed) == 5 and gbps == pytest.approx(((1 << 22) + 100) // 4 * 4 / 0.5 / 1e9)


def _error(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exit:
        main(["bench", *argv])
    assert exit.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--models", "llama-tiny,gpt5"], "--models: unknown model 'gpt5'; valid models: llama-160m, qwen2-0.5b, "
                                      "tinyllama-1.1b, llama-tiny"),
    (["--modes", "eager,kiln-fp8"], "--modes: unknown mode 'kiln-fp8'; valid modes: eager, inductor-freeze, kiln, "
                                    "kiln-bf16, kiln-int8, kiln-int4, kiln-int8-bf16, kiln-int4-bf16, "
                                    "kiln-int4-a8"),
    (["--new-tokens", "1"], "--new-tokens must be at least 2"),
    (["--batch", "1,0"], "argument --batch: takes a positive integer, e.g. 8 (got '0')"),
    (["--train"], "--train does not apply to --suite llm"),
    (["--warmup", "0"], "--warmup (generate calls per mode, the first compiles) must be >= 1"),
])
def test_bad_arguments_name_the_argument_and_what_it_accepts(monkeypatch, capsys, argv, message):
    monkeypatch.setattr(benchmarks.llm, "run_llm_suite", lambda *a, **k: pytest.fail("a model ran"))
    assert message in _error(capsys, "--suite", "llm", *argv)


@pytest.mark.parametrize("argv, message", [
    (["--models", "mlp", "--prompt-len", "8"], "--prompt-len applies to --suite llm only"),
    (["--models", "mlp", "--kv-cache", "dynamic"], "--kv-cache applies to --suite llm only"),
    (["--models", "mlp", "--batch", "1,4"], "--batch takes one size here (got 1,4); several only with --suite llm"),
])
def test_llm_arguments_elsewhere_are_refused(capsys, argv, message):
    assert message in _error(capsys, *argv)


def test_bf16_int8_and_int4_modes_run_with_kilns_apis(capsys):
    """With bf16 fast math and kiln.quantize in kiln, their modes run end to end; the quantized
    models' bytes per step come from their own tensors (int4 below int8 below bf16's weights)."""
    kiln_modes = ("kiln-bf16", "kiln-int8", "kiln-int4", "kiln-int8-bf16", "kiln-int4-bf16", "kiln-int4-a8")
    assert main(["bench", *TINY, "--modes", ",".join(("eager",) + kiln_modes)]) == 0
    rows = {r["mode"]: r for r in _rows(capsys.readouterr().out, HEADER)}
    assert set(rows) == {"eager", *kiln_modes}
    for mode in kiln_modes:
        assert float(rows[mode]["decode tok/s"]) > 0 and "not available" not in rows[mode]["note"]
        assert rows[mode]["accurate"].endswith("of tokens agree")
    megabytes = {m: float(rows[m]["bytes/step"].split()[0]) for m in kiln_modes}
    assert megabytes["kiln-int4"] < megabytes["kiln-int8"] < megabytes["kiln-bf16"]
    # (the same weights)
    assert megabytes["kiln-int4-a8"] == megabytes["kiln-int4-bf16"] == megabytes["kiln-int4"]
    assert megabytes["kiln-int8-bf16"] == megabytes["kiln-int8"]


def test_a_mode_whose_graphs_ran_eagerly_says_so_beside_its_figures(monkeypatch):
    """A kiln mode whose graphs failed to compile runs eager's code: its row says how many and why
    (the table's note, the progress line), rather than passing eager's speed off as kiln's."""
    def failing(commands):
        raise RuntimeError("C++ compilation failed:\nkernels.cpp:1:1: error: planted")

    monkeypatch.setattr(native_build, "_run_all", failing)
    modes = [llm_modes.LLM_MODES["eager"], llm_modes.LLM_MODES["kiln"]]
    settings = LlmSettings(models=("llama-tiny",), modes=("eager", "kiln"), batches=(1,), prompt_len=8, new_tokens=4,
                           rounds=1)
    with kiln.config.patch({"backend.autotune": "off"}), pytest.warns(RuntimeWarning, match="runs eagerly"):
        eager, compiled = measure_group(llm_modes.LLM_MODELS["llama-tiny"].build(), "llama-tiny", 1, 1, modes, settings)
    assert eager.fallbacks == [] and compiled.status == "ok"
    assert compiled.fallbacks and set(compiled.fallbacks) == {"RuntimeError: C++ compilation failed:"}
    run = LlmRun(settings, [eager, compiled], {1: 10.0})
    (_, header, rows), = llm_tables(run)
    notes = [dict(zip(header, row))["note"] for row in rows]
    assert notes[0] == "" and notes[1].startswith(f"{len(compiled.fallbacks)} graph(s) ran eagerly, kiln could not "
                                                  "compile them: RuntimeError: C++ compilation failed:")
    assert "ran eagerly" in benchmarks.llm._verdict(compiled, 10.0)


def test_a_mode_that_compiles_during_its_timed_calls_says_so_beside_its_figures():
    """A timed call that compiled (kiln's capture here, a new kiln.compile at each call; Dynamo's
    frames are counted alike) is told in the row's note and the progress line:
    its times hold the compile (Inductor once compiled again inside the first timed round)."""
    import dataclasses

    class CompiledAfresh(nn.Module):
        """generate() through a new kiln.compile of the model at each call."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def generate(self, *args, **kwargs):
            return kiln.compile(self.model).generate(*args, **kwargs)

    recompiling = dataclasses.replace(llm_modes.LLM_MODES["kiln"], name="kiln-recompiling", prepare=CompiledAfresh)
    modes = [llm_modes.LLM_MODES["eager"], llm_modes.LLM_MODES["kiln"], recompiling]
    settings = LlmSettings(models=("llama-tiny",), modes=("eager", "kiln"), batches=(1,), prompt_len=8, new_tokens=4,
                           rounds=2)
    with kiln.config.patch({"backend.autotune": "off"}):
        eager, compiled, again = measure_group(llm_modes.LLM_MODELS["llama-tiny"].build(), "llama-tiny", 1, 1, modes,
                                               settings)
    assert eager.compiled_in_rounds == 0 and compiled.compiled_in_rounds == 0
    assert again.status == "ok" and again.compiled_in_rounds >= 2 * 2  # the prompt's and the step's, each round
    run = LlmRun(settings, [eager, compiled, again], {1: 10.0})
    (_, header, rows), = llm_tables(run)
    notes = [dict(zip(header, row))["note"] for row in rows]
    assert not any("during the timed rounds" in note for note in notes[:2])  # (others' CPU share may be noted)
    assert notes[2] == f"compiled {again.compiled_in_rounds} graph(s) during the timed rounds: its times include compiling"
    assert "during the timed rounds" in benchmarks.llm._verdict(again, 10.0)


def test_the_compile_count_counts_dynamos_frames_and_kilns_entries():
    from benchmarks.llm import CompileCount

    torch._dynamo.reset()
    with CompileCount() as compiles:
        start = compiles.total()
        torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.randn(3))
        assert compiles.total() == start + 1
        kiln.compile(lambda x: x * 3 + 1)(torch.randn(3))
        assert compiles.total() == start + 2
    from kiln.capture.cache import OBSERVERS

    assert compiles._observe not in OBSERVERS


def test_a_row_says_when_kilns_team_narrowed_and_the_json_keeps_it():
    from benchmarks.llm_report import note

    r = LlmResult("m", 1, "kiln-int4", 2, "ok", decode_s=0.01, team_narrowings=3, others_cpu=0.3)
    assert note(r) == "kiln's team narrowed 3x (busy cores); others used 30% of the CPUs"
    assert LlmResult.from_json(json.loads(json.dumps(r.to_json()))).team_narrowings == 3
    assert note(LlmResult("m", 1, "kiln", 2, "ok", decode_s=0.01)) == ""


def test_the_rounds_count_kilns_narrowings_per_mode(monkeypatch):
    counts = iter(range(100))
    monkeypatch.setattr(benchmarks.llm.libkiln, "team_narrowings", lambda: next(counts) * 2)  # +2 a call
    settings = LlmSettings(models=("llama-tiny",), modes=("eager",), batches=(1,), threads=(1,), prompt_len=8,
                           new_tokens=4, rounds=2, warmup=1)
    base = llm_modes.LLM_MODELS["llama-tiny"].build()
    (result,) = measure_group(base, "llama-tiny", 1, 1, [llm_modes.LLM_MODES["eager"]], settings)
    assert result.team_narrowings == 4  # two rounds, 2 each
