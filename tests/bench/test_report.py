"""Summaries, tables and JSON of kiln bench, from hand-made results."""

import json
import math

from benchmarks.machine import SPEED_FLAGS
from benchmarks.report import (compile_budget, compile_by_part, json_report, markdown_report, pivot, summarize, text_report,
                               versus_peer)
from benchmarks.results import Case, Result

META = dict(task="inference", suite="unit", threads=[1], iters=5, warmup=1, cache="cold", torch="2.x",
            cpu="cpu", cores=2, date="today")


def _ok(model, mode, speedup, compile_s=1.0, accuracy="pass", threads=1):
    return Result(Case(model, mode, threads), "ok", accuracy=accuracy, speedup=speedup, compile_s=compile_s,
                  eager_ms=1.0, compiled_ms=1.0 / speedup)


RESULTS = [
    _ok("a", "inductor", 2.0, compile_s=10.0),
    _ok("b", "inductor", 0.5, compile_s=30.0),
    _ok("c", "inductor", 8.0, compile_s=99.0, accuracy="fail"),
    Result(Case("d", "inductor", 1), "timeout", error="no result after 5 s"),
    Result(Case("a", "kiln", 1), "n/a", error="not built yet"),
]


def test_summary_counts_only_accurate_cases_and_skips_unavailable():
    by_mode = {s.mode: s for s in summarize(RESULTS)}
    inductor = by_mode["inductor"]
    assert (inductor.passed, inductor.ran, inductor.pass_rate) == (2, 4, "2/4")
    assert math.isclose(inductor.geomean_speedup, 1.0)  # sqrt(2 * 0.5); the wrong 8x is left out
    assert inductor.median_compile_s == 20.0
    assert by_mode["kiln"].pass_rate == "not available" and by_mode["kiln"].geomean_speedup is None


def test_pivot_marks_wrong_results_and_failures():
    header, rows = pivot(RESULTS)
    assert header == ["model", "threads", "inductor", "kiln"]
    cells = {row[0]: row[2:] for row in rows}
    assert cells["a"] == ["2.00x", "not available"]
    assert cells["c"][0] == "8.00x (wrong)"
    assert cells["d"][0] == "timeout"


def test_text_and_markdown_reports_hold_every_case():
    text = text_report(RESULTS, META)
    md = markdown_report(RESULTS, META, plot="run.png")
    for report in (text, md):
        assert "no result after 5 s" in report and "not built yet" in report
    assert "![speedup per model and mode](run.png)" in md
    table_rows = [line for line in md.splitlines() if line.startswith("| a | 1 |")]
    assert len(table_rows) == 3  # pivot row, and the detail rows of inductor and kiln


def test_json_round_trips_results():
    data = json.loads(json.dumps(json_report(RESULTS, META)))
    back = [Result.from_json(r) for r in data["results"]]
    assert back == RESULTS
    assert data["summary"][0]["pass_rate"] == "2/4"


def test_a_graph_that_fell_back_to_eager_is_a_failure():
    fell_back = _ok("e", "kiln-aot-eager", 1.0)
    fell_back.fallbacks = 2
    (summary,) = summarize([fell_back])
    assert not fell_back.passed and summary.pass_rate == "0/1"
    assert pivot([fell_back])[1][0][2] == "1.00x (2 graphs fell back)"


def test_the_run_header_names_the_cpus_vector_extensions():
    from benchmarks.report import describe_run, run_metadata

    meta = run_metadata(task="inference", suite="unit", threads=[1], iters=1, warmup=1, cache="cold")
    assert isinstance(meta["isa"], list) and set(meta["isa"]) <= set(SPEED_FLAGS)
    assert meta["cpu"] and meta["cores"] >= 1 and json.loads(json.dumps(meta)) == meta
    assert meta["kiln_commit"] is None or int(meta["kiln_commit"], 16) >= 0  # a checkout's short hash
    assert " · kiln abc1234 · " in describe_run({**META, "kiln_commit": "abc1234"})
    assert describe_run({**META, "isa": ["avx2", "avx512f"]}).endswith("cpu (2 cores; avx2, avx512f) · today")
    assert describe_run(META).endswith("cpu (2 cores) · today")  # runs saved before the field existed


def test_the_run_header_states_the_malloc_setting_every_case_ran_under():
    from benchmarks.report import describe_run

    assert " · malloc left alone · " in describe_run({**META, "keep_freed_mb": 0})
    assert (" · malloc keeps 256 MiB of freed heap in every case's process (runtime.keep_freed_mb) · "
            in describe_run({**META, "keep_freed_mb": 256}))
    assert "malloc" not in describe_run(META)  # runs saved before the field


def test_reports_name_the_cpu_its_flags_and_cores():
    meta = {**META, "cpu": "Intel(R) Xeon(R) Platinum 8480+", "cores": 4, "isa": ["fma", "avx512f", "amx_tile"]}
    for report in (text_report(RESULTS, meta), markdown_report(RESULTS, meta)):
        assert "Intel(R) Xeon(R) Platinum 8480+ (4 cores; fma, avx512f, amx_tile)" in report
    old = {k: v for k, v in META.items() if k not in ("isa", "cores")}  # a run saved before the fields
    assert "· cpu ·" in text_report(RESULTS, old)


def test_reports_name_the_cpu_generation_behind_a_cloud_name(monkeypatch):
    from benchmarks import machine

    meta = {**META, "cpu": "AMD EPYC", "cpu_generation": "family 26, model 2, stepping 1", "cores": 2, "isa": ["avx2"]}
    assert "AMD EPYC (family 26, model 2, stepping 1; 2 cores; avx2)" in markdown_report(RESULTS, meta)
    cpuinfo = ["vendor_id\t: AuthenticAMD", "cpu family\t: 25", "model\t\t: 17", "model name\t: AMD EPYC",
               "stepping\t: 1"]
    monkeypatch.setattr(machine, "_cpuinfo", lambda: cpuinfo)
    machine.cpu_generation.cache_clear()
    try:
        assert machine.cpu_generation() == "family 25, model 17, stepping 1"
        monkeypatch.setattr(machine, "_cpuinfo", lambda: ["Features\t: fp asimd"])  # aarch64: no such numbers
        machine.cpu_generation.cache_clear()
        assert machine.cpu_generation() is None
    finally:
        machine.cpu_generation.cache_clear()


def test_cpu_flags_come_from_cpuinfo_or_lscpu(monkeypatch):
    from benchmarks import machine

    monkeypatch.setattr(machine, "_cpuinfo", lambda: ["processor\t: 0", "Features\t: fp asimd sve bf16 crc32"])
    monkeypatch.setattr(machine, "_lscpu", lambda: ["Architecture: aarch64", "Model name:   Neoverse-V1"])
    machine.cpu_model.cache_clear(), machine.cpu_flags.cache_clear()
    try:
        assert machine.cpu_model() == "Neoverse-V1" and machine.cpu_flags() == ("asimd", "sve", "bf16")
    finally:
        machine.cpu_model.cache_clear(), machine.cpu_flags.cache_clear()


def test_kiln_compile_times_are_held_against_half_of_the_peers():
    results = [_ok("a", "inductor-freeze", 1.0, compile_s=20.0), _ok("a", "kiln", 2.0, compile_s=6.0),
               _ok("b", "inductor-freeze", 1.0, compile_s=10.0), _ok("b", "kiln", 2.0, compile_s=7.0),
               _ok("c", "kiln", 2.0, compile_s=7.0)]  # no peer to compare with
    header, rows = compile_budget(results)
    assert header[4] == "inductor-freeze compile s"
    assert [(r[0], r[5], r[6].split()[0]) for r in rows] == [("a", "0.30", "within"), ("b", "0.70", "OVER")]
    assert "Cold compile against the peer's" in markdown_report(results, META)
    assert compile_budget(RESULTS[:1]) == (compile_budget(RESULTS[:1])[0], [])  # no kiln mode: no rows
    assert "Cold compile" not in text_report(RESULTS, META)


def test_kiln_compiles_are_split_by_part_with_a_median_row():
    def parted(model, build, lowering):
        result = _ok(model, "kiln", 2.0, compile_s=build + lowering + 1.0)
        result.compile_parts = {"capture": 0.5, "build": build, "lowering": lowering, "other": 0.5}
        return result

    results = [parted("a", 4.0, 1.0), parted("b", 1.0, 3.0), parted("c", 2.0, 2.5), *RESULTS]
    title, header, rows = compile_by_part(results)
    assert header == ["model", "threads", "mode", "compile s", "capture", "build", "lowering", "other", "largest"]
    assert [(r[0], r[3], r[-1]) for r in rows] == [("a", "6.0", "build"), ("b", "5.0", "lowering"),
                                                   ("c", "5.5", "lowering"), ("median of 3", "5.5", "lowering")]
    assert rows[-1][5:7] == ["2.0", "2.5"]  # each part's own median
    assert "first compile by part" in text_report(results, META)
    assert compile_by_part(RESULTS) is None and "by part" not in text_report(RESULTS, META)
    assert json.loads(json.dumps(json_report(results, META)))["results"][0]["compile_parts"]["build"] == 4.0


def test_the_peer_table_holds_same_process_ratios_and_their_geomean():
    def paired(model, ms, peer_ms, peer_accuracy="pass", threads=1):
        return Result(Case(model, "kiln", threads, against="inductor-freeze"), "ok", accuracy="pass", eager_ms=2.0,
                      compiled_ms=ms, speedup=2.0 / ms, peer_ms=peer_ms, peer_accuracy=peer_accuracy)

    results = [paired("a", 1.0, 2.0), paired("b", 2.0, 1.0), paired("c", 1.0, 4.0, peer_accuracy="fail"),
               _ok("a", "eager", 1.0)]
    title, header, rows = versus_peer(results)
    assert "inductor-freeze" in title and header == ["model", "threads", "kiln"]
    assert rows[:3] == [["a", "1", "0.50"], ["b", "1", "2.00"], ["c", "1", "0.25 (wrong)"]]
    assert rows[3] == ["geomean", "1", "1.00 (max 2.00)"]  # the wrong peer's case left out
    assert "0.50" in text_report(results, META) and versus_peer(RESULTS) is None
    assert json.loads(json.dumps(json_report(results, META)))["results"][0]["peer_ms"] == 2.0


def test_a_failed_peer_shows_in_the_peer_table_and_the_cases_note():
    failed = Result(Case("a", "kiln", 1, against="inductor-freeze"), "ok", accuracy="pass", eager_ms=2.0,
                    compiled_ms=1.0, speedup=2.0, peer_error="RuntimeError: boom")
    title, header, rows = versus_peer([failed])
    assert rows == [["a", "1", "inductor-freeze failed"], ["geomean", "1", "-"]]
    assert "inductor-freeze: RuntimeError: boom" in text_report([failed], META)


def _paired(model, **fields):
    case = Case(model, "kiln", 1, device="cuda", dtype="bfloat16", batch=8, against="inductor")
    base = dict(accuracy="pass", peer_accuracy="pass", eager_ms=4.0, compiled_ms=1.0, peer_ms=2.0, speedup=4.0,
                compile_s=20.0, peer_compile_s=10.0, eager_fp32_rel_err=4e-3, fp32_rel_err=3e-3, peer_fp32_rel_err=5e-3)
    return Result(case, "ok", **{**base, **fields})


def test_a_gpu_runs_tables_state_each_case_against_its_peer_and_float32():
    from benchmarks.report import against_peer

    results = [_paired("bert"), _paired("gpt2", peer_error="RuntimeError: boom", peer_ms=None, peer_accuracy=None,
                                        peer_fp32_rel_err=None)]
    title, header, rows = against_peer(results)
    assert "max |out - float32 eager out| / max |float32 eager out|" in title
    row = dict(zip(header, rows[0]))
    assert (row["ms"], row["peer ms"], row["÷ peer"], row["compile s"], row["peer compile s"]) == (
        "1.00", "2.00", "0.50x", "20.0", "10.0")
    assert (row["eager err vs fp32"], row["err vs fp32"], row["peer err vs fp32"]) == ("4.0e-03", "3.0e-03", "5.0e-03")
    assert dict(zip(header, rows[1]))["peer accuracy"] == "failed: RuntimeError: boom"
    meta = {**META, "device": "cuda", "gpu": "NVIDIA H200", "dtype": "bfloat16", "batch": 8, "jobs": 4}
    md = markdown_report(results, meta)
    assert "suite unit · device cuda · bfloat16 weights · batch 8 · threads 1" in md and "NVIDIA H200" in md
    assert "4 cases at once (compile times inflated by the CPUs they shared; calls timed one at a time on the GPU)" in md
    every_case = md[md.index("## Every case"):]
    assert "| peer ms | peer compile s | eager err vs fp32 | err vs fp32 | peer err vs fp32 | note |" in every_case


def test_runs_without_peers_or_lowered_precision_keep_their_tables():
    from benchmarks.report import against_peer

    assert against_peer(RESULTS) is None
    md = markdown_report(RESULTS, META)
    assert "err vs fp32" not in md and "peer ms" not in md and "cases at once" not in md
