"""The gemm suite times every kiln::mm implementation registered when it runs, and reports each with
its GFLOP/s and fraction of the machine's peak; implementations that raise or compute something
else are shown as such, not timed."""

import json

import pytest
import torch

import kiln
from benchmarks import gemm, peak
from benchmarks.gemm_report import gemm_tables
from benchmarks.report import json_report, markdown_report, text_report
from kiln.cli import main
from kiln.externs import prepacked

TINY = [gemm.GemmShape(8, 16, 12, True, "test")]


@pytest.fixture(autouse=True)
def known_peak(monkeypatch, tmp_path):
    # The real peak takes seconds to measure; these tests are about the suite, not the machine.
    monkeypatch.setattr(peak, "_gemm_gflops", lambda dtype=torch.float32: 100.0 if dtype == torch.float32 else 400.0)
    monkeypatch.setattr(peak, "_copy_gbps", lambda: 10.0)
    peak.clear_memory()
    with kiln.config.patch({"cache.dir": str(tmp_path / "cache")}):
        yield
    peak.clear_memory()


def _fake(a, b, bias, unary, scalars, algorithm):
    return torch.addmm(bias, a, b) if bias is not None else a @ b


def _float32_only(a, b, bias, unary, scalars, algorithm):
    if a.dtype != torch.float32:
        raise RuntimeError("this library takes float32 only")
    return _fake(a, b, bias, unary, scalars, algorithm)


def _off_by_one(a, b, bias, unary, scalars, algorithm):
    return _fake(a, b, bias, unary, scalars, algorithm) + 1


def cells_of(header, rows):
    return dict(zip(header, rows[0]))


def test_a_row_per_registered_implementation(monkeypatch):
    impls = {**gemm.implementations(), "fake": _fake, "fp32only": _float32_only, "wrong": _off_by_one}
    monkeypatch.setattr(gemm, "implementations", lambda: impls)
    run = gemm.run_gemm_suite(TINY, [1], ["float32", "bfloat16"], rounds=3, warmup=1, progress=None)
    f32, bf16 = run.results
    assert list(f32.ms) == list(impls) and set(prepacked.MM_IMPLS) < set(impls)  # "fake" included
    assert f32.ms["fake"] > 0 and f32.gflops("fake") == pytest.approx(TINY[0].flops / f32.ms["fake"] / 1e6)
    assert bf16.ms["fp32only"] is None and "float32 only" in bf16.notes["fp32only"]
    assert f32.ms["wrong"] is None and f32.notes["wrong"].startswith("wrong")
    assert f32.fastest in impls and f32.fastest != "wrong"
    assert run.peaks[1].gflops == 100.0

    (title, header, rows), (_, bf16_header, bf16_rows), summary = gemm_tables(run)
    assert "float32" in title and header[3:-2] == list(impls) and header[-2:] == ["fastest", "others' CPU"]
    assert f32.others_cpu is None or cells_of(header, rows)["others' CPU"].endswith("%")
    cells = dict(zip(header, rows[0]))
    share = f"({f32.gflops('fake') / 100.0:.0%})"
    assert cells["M x K x N"] == "8x16x12" and cells["fake"].endswith(share) and cells["wrong"] == "wrong"
    assert dict(zip(bf16_header, bf16_rows[0]))["fp32only"] == "n/a"
    assert [row[2] for row in summary[2][:len(impls)]] == list(impls)


def test_json_round_trip_and_reports(monkeypatch):
    impls = {**gemm.implementations(), "fake": _fake}
    monkeypatch.setattr(gemm, "implementations", lambda: impls)
    run = gemm.run_gemm_suite(TINY, [1], ["float32"], rounds=2, warmup=0, progress=None)
    meta = dict(task="gemm", suite="gemm", threads=[1], iters=2, warmup=0, cache="-", torch="2.x", cpu="cpu",
                cores=2, isa=["avx2"], date="today")
    data = json.loads(json.dumps(json_report([], meta, run)))
    back = gemm.GemmRun.from_json(data["gemm"])
    assert back == run
    for report in (text_report([], meta, back), markdown_report([], meta, None, back)):
        assert "8x16x12" in report and "fake" in report and "100 GFLOP/s float32" in report
        assert "Speedup over eager" not in report  # no model ran


def test_cli_runs_the_suite_on_given_shapes(monkeypatch, capsys, tmp_path):
    impls = {**gemm.implementations(), "fake": _fake}
    monkeypatch.setattr(gemm, "implementations", lambda: impls)
    out = tmp_path / "gemm.json"
    assert main(["bench", "--suite", "gemm", "--shapes", "4x8x4", "--dtypes", "float32", "--iters", "2",
                 "--warmup", "0", "--json", str(out)]) == 0
    assert "4x8x4" in capsys.readouterr().out
    assert main(["report", str(out)]) == 0
    assert "fake" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--shapes", "4x8"], "--shapes takes MxKxN"),
    (["--dtypes", "float16"], "unknown dtype 'float16'"),
    (["--train"], "--train does not apply to --suite gemm"),
    (["--modes", "kiln"], "--modes does not apply"),
])
def test_cli_rejects_what_does_not_apply(capsys, argv, message):
    with pytest.raises(SystemExit) as exit:
        main(["bench", "--suite", "gemm", *argv])
    assert exit.value.code == 2 and message in capsys.readouterr().err
