"""The gemm suite's tables: per shape, each implementation's time, GFLOP/s and fraction of the
machine's measured peak, and the fastest; then a summary per implementation."""

from __future__ import annotations

from benchmarks.gemm import GemmResult, GemmRun
from benchmarks.peak import Peak
from benchmarks.report import geomean

Table = tuple[str, list[str], list[list[str]]]


def peak_gflops(peak: Peak | None, dtype: str) -> float | None:
    """The peak a GEMM of `dtype` is measured against: torch.mm's at that dtype."""
    if peak is None:
        return None
    return peak.bf16_gflops if dtype == "bfloat16" else peak.gflops


def _share(gflops: float, peak: float | None) -> str:
    return f" ({gflops / peak:.0%})" if peak else ""


def _cell(result: GemmResult, impl: str, peak: Peak | None) -> str:
    ms = result.ms.get(impl)
    if ms is None:
        note = result.notes.get(impl, "n/a")
        return "wrong" if note.startswith("wrong") else "n/a"
    gflops = result.gflops(impl)
    return f"{ms:.3f} ms · {gflops:.0f}{_share(gflops, peak_gflops(peak, result.dtype))}"


def _groups(run: GemmRun) -> list[tuple[int, str, list[GemmResult]]]:
    keys = list(dict.fromkeys((r.threads, r.dtype) for r in run.results))
    return [(t, d, [r for r in run.results if (r.threads, r.dtype) == (t, d)]) for t, d in keys]


def _impls(results: list[GemmResult]) -> list[str]:
    return list(dict.fromkeys(name for r in results for name in r.ms))


def shape_table(threads: int, dtype: str, results: list[GemmResult], peak: Peak | None) -> Table:
    impls = _impls(results)
    header = ["M x K x N", "bias", "models"] + impls + ["fastest", "others' CPU"]
    rows = []
    for r in results:
        best = r.fastest
        held = "-" if r.others_cpu is None else f"{r.others_cpu:.0%}"
        rows.append([r.shape.label, "yes" if r.shape.bias else "no", r.shape.models]
                    + [_cell(r, impl, peak) for impl in impls] + [best or "-", held])
    title = (f"GEMM time per implementation, {dtype}, {threads} thread{'s' if threads > 1 else ''}: "
             f"ms · GFLOP/s (fraction of the machine's {dtype} peak); others' CPU: the share of the machine's "
             "CPUs other processes used during the row's timing (above a few %, every time in the row is inflated)")
    return title, header, rows


def summary_table(run: GemmRun) -> Table:
    """Per (threads, dtype, implementation): shapes won, geomean time over the fastest's, and the
    best fraction of peak reached."""
    header = ["threads", "dtype", "implementation", "fastest on", "geomean time / fastest", "best GFLOP/s (of peak)", "n/a or wrong"]
    rows = []
    for t, dtype, results in _groups(run):
        peak = run.peaks.get(t)
        for impl in _impls(results):
            timed = [r for r in results if r.ms.get(impl) is not None and r.fastest]
            ratios = [r.ms[impl] / r.ms[r.fastest] for r in timed]
            mean = geomean(ratios)
            best = max((r.gflops(impl) for r in timed), default=None)
            rows.append([
                str(t), dtype, impl,
                f"{sum(r.fastest == impl for r in results)}/{len(results)}",
                f"{mean:.2f}x" if mean else "-",
                "-" if best is None else f"{best:.0f}{_share(best, peak_gflops(peak, dtype))}",
                str(len(results) - len(timed)),
            ])
    return "Summary per implementation", header, rows


def describe_peaks(run: GemmRun) -> str:
    def one(p: Peak) -> str:
        bf16 = f", {p.bf16_gflops:.0f} bfloat16" if p.bf16_gflops else ""
        return (f"machine peak at {p.threads} thread{'s' if p.threads > 1 else ''} (best of torch.mm and oneDNN): {p.gflops:.0f} GFLOP/s "
                f"float32{bf16}; copy {p.gbps:.1f} GB/s")

    return "; ".join(one(p) for p in run.peaks.values())


def gemm_tables(run: GemmRun) -> list[Table]:
    tables = [shape_table(t, d, results, run.peaks.get(t)) for t, d, results in _groups(run)]
    return tables + [summary_table(run)]


def gemm_notes(run: GemmRun) -> list[str]:
    """Why each n/a or wrong cell is so, once per distinct reason."""
    seen = dict.fromkeys(f"{impl} {r.dtype}: {note}" for r in run.results for impl, note in r.notes.items())
    return list(seen)
