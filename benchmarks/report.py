"""Turns benchmark results into a summary, a terminal table, markdown and JSON."""

from __future__ import annotations

import math
import platform
import statistics
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.machine import cpu_cores, cpu_flags, cpu_generation, cpu_model, gpu_model
from benchmarks.results import Result

if TYPE_CHECKING:
    from benchmarks.gemm import GemmRun
    from benchmarks.llm import LlmRun


@dataclass
class ModeSummary:
    mode: str
    threads: int
    passed: int
    ran: int  # cases that were attempted (not "n/a")
    geomean_speedup: float | None  # over passing cases
    median_compile_s: float | None

    @property
    def pass_rate(self) -> str:
        return f"{self.passed}/{self.ran}" if self.ran else "not available"


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarize(results: list[Result]) -> list[ModeSummary]:
    """Per (mode, threads): pass rate, geometric-mean speedup and median compile time."""
    keys = list(dict.fromkeys((r.case.mode, r.case.threads) for r in results))
    out = []
    for mode, threads in keys:
        group = [r for r in results if (r.case.mode, r.case.threads) == (mode, threads)]
        ran = [r for r in group if r.status != "n/a"]
        passed = [r for r in ran if r.passed]
        compile_times = [r.compile_s for r in passed if r.compile_s is not None]
        out.append(
            ModeSummary(
                mode,
                threads,
                len(passed),
                len(ran),
                geomean([r.speedup for r in passed if r.speedup]),
                statistics.median(compile_times) if compile_times else None,
            )
        )
    return out


# The compile-time budget (issue 22): a kiln mode's cold compile against the peer's in the same
# run, by model. Over half of the peer's is reported as over budget.
COMPILE_PEERS = ("inductor-freeze", "inductor")
COMPILE_BUDGET = 0.5


def compile_budget(results: list[Result]) -> tuple[list[str], list[list[str]]]:
    """Rows (model, threads, kiln mode): its compile time, the peer's, their ratio and a verdict;
    empty when the run has no peer mode. Cases where either did not compile are left out."""
    compiled = {(r.case.model, r.case.threads, r.case.mode): r.compile_s for r in results
                if r.status == "ok" and r.compile_s is not None}
    modes = {mode for _, _, mode in compiled}
    peer = next((p for p in COMPILE_PEERS if p in modes), None)
    header = ["model", "threads", "mode", "compile s", f"{peer} compile s", "ratio", "budget"]
    rows = []
    for (model, threads, mode), seconds in compiled.items():
        theirs = compiled.get((model, threads, peer))
        if peer is None or not mode.startswith("kiln") or theirs is None or theirs <= 0:
            continue
        ratio = seconds / theirs
        verdict = "within" if ratio <= COMPILE_BUDGET else f"OVER (more than {COMPILE_BUDGET:g} of {peer}'s)"
        rows.append([model, str(threads), mode, f"{seconds:.1f}", f"{theirs:.1f}", f"{ratio:.2f}", verdict])
    return header, rows


def compile_by_part(results: list[Result]) -> tuple[str, list[str], list[list[str]]] | None:
    """Rows (model, threads, mode) of kiln's first compile split into its parts (seconds), the
    largest part named; and a median row per (threads, mode) when there are several models."""
    parted = [r for r in results if r.compile_parts]
    if not parted:
        return None
    parts = list(parted[0].compile_parts)
    header = ["model", "threads", "mode", "compile s", *parts, "largest"]

    def row(label: str, threads: str, mode: str, total: float, seconds: dict[str, float]) -> list[str]:
        return [label, threads, mode, f"{total:.1f}", *(f"{seconds.get(p, 0.0):.1f}" for p in parts),
                max(parts, key=lambda p: seconds.get(p, 0.0))]

    rows = [row(r.case.model, str(r.case.threads), r.case.mode, r.compile_s or 0.0, r.compile_parts) for r in parted]
    groups: dict[tuple[int, str], list[Result]] = {}
    for r in parted:
        groups.setdefault((r.case.threads, r.case.mode), []).append(r)
    for (threads, mode), group in groups.items():
        if len(group) > 1:
            medians = {p: statistics.median(r.compile_parts.get(p, 0.0) for r in group) for p in parts}
            rows.append(row(f"median of {len(group)}", str(threads), mode,
                            statistics.median(r.compile_s or 0.0 for r in group), medians))
    title = ("kiln's first compile by part (s): its own stages (kiln.compile_time.PARTS); other = the rest of the "
             "first call (running it; Dynamo's capture under the Dynamo door)")
    return title, header, rows


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def cell(result: Result) -> str:
    """A short verdict for a pivot table: speedup, or what went wrong."""
    if result.status == "n/a":
        return "not available"
    if result.status != "ok":
        return result.status
    if result.accuracy != "pass":
        return f"{result.speedup:.2f}x (wrong)"
    if result.fallbacks:
        return f"{result.speedup:.2f}x ({result.fallbacks} graphs fell back)"
    return f"{result.speedup:.2f}x"


DETAIL_COLUMNS = [
    ("model", lambda r: r.case.model),
    ("threads", lambda r: str(r.case.threads)),
    ("mode", lambda r: r.case.mode),
    ("status", lambda r: r.status),
    ("accuracy", lambda r: r.accuracy or "-"),
    ("compile s", lambda r: _fmt(r.compile_s, ".1f")),
    ("eager ms", lambda r: _fmt(r.eager_ms, ".2f")),
    ("compiled ms", lambda r: _fmt(r.compiled_ms, ".2f")),
    ("speedup", lambda r: _fmt(r.speedup, ".2f", "x")),
    ("÷ peer", lambda r: _fmt(r.versus_peer, ".2f", "x")),
    ("peak MB", lambda r: _fmt(r.peak_rss_mb, ".0f")),
    ("graphs", lambda r: _fmt(r.graphs, "d")),
    ("breaks", lambda r: _fmt(r.graph_breaks, "d")),
    ("fallbacks", lambda r: _fmt(r.fallbacks, "d")),
    ("note", lambda r: r.error or r.accuracy_detail or (f"{r.case.against}: {r.peer_error}" if r.peer_error else "")),
]
# Shown only where some case has them: a peer (--against), lowered precision (--dtype, --autocast).
OPTIONAL_DETAIL_COLUMNS = {
    "peer ms": lambda r: r.peer_ms,
    "peer compile s": lambda r: r.peer_compile_s,
    "eager err vs fp32": lambda r: r.eager_fp32_rel_err,
    "err vs fp32": lambda r: r.fp32_rel_err,
    "peer err vs fp32": lambda r: r.peer_fp32_rel_err,
    "launches": lambda r: r.launches,
    "waits": lambda r: r.waits,
    "peer launches": lambda r: r.peer_launches,
    "peer waits": lambda r: r.peer_waits,
}
_OPTIONAL_FORMATS = {"peer ms": ".2f", "peer compile s": ".1f", "launches": ".0f", "waits": ".1f",
                     "peer launches": ".0f", "peer waits": ".1f"}


def detail_columns(results: list[Result]) -> list[tuple[str, Any]]:
    """The "every case" table's columns: the fixed ones, and before the note each optional one
    that some result has."""
    shown = [(name, lambda r, get=get, spec=_OPTIONAL_FORMATS.get(name, ".1e"): _fmt(get(r), spec))
             for name, get in OPTIONAL_DETAIL_COLUMNS.items() if any(get(r) is not None for r in results)]
    return DETAIL_COLUMNS[:-1] + shown + DETAIL_COLUMNS[-1:]

SUMMARY_COLUMNS = [
    ("mode", lambda s: s.mode),
    ("threads", lambda s: str(s.threads)),
    ("pass rate", lambda s: s.pass_rate),
    ("geomean speedup", lambda s: _fmt(s.geomean_speedup, ".2f", "x")),
    ("median compile s", lambda s: _fmt(s.median_compile_s, ".1f")),
]


def pivot(results: list[Result]) -> tuple[list[str], list[list[str]]]:
    """Rows (model, threads) x columns mode, each cell a speedup or a status."""
    modes = list(dict.fromkeys(r.case.mode for r in results))
    rows: dict[tuple[str, int], dict[str, str]] = {}
    for r in results:
        rows.setdefault((r.case.model, r.case.threads), {})[r.case.mode] = cell(r)
    header = ["model", "threads"] + modes
    body = [[model, str(threads)] + [cells.get(m, "") for m in modes] for (model, threads), cells in rows.items()]
    return header, body


def versus_peer(results: list[Result]) -> tuple[str, list[str], list[list[str]]] | None:
    """Rows (model, threads) x columns mode: the compiled call's time over the `--against` peer's,
    both timed in the case's own process; a geomean row per thread count over accurate cases."""
    paired = [r for r in results if r.versus_peer is not None]
    failed = [r for r in results if r.peer_error]
    if not paired and not failed:
        return None
    peers = sorted({r.case.against for r in paired + failed})
    modes = list(dict.fromkeys(r.case.mode for r in paired + failed))
    rows: dict[tuple[str, int], dict[str, str]] = {}
    for r in paired:
        ok = r.passed and r.peer_accuracy == "pass"
        rows.setdefault((r.case.model, r.case.threads), {})[r.case.mode] = f"{r.versus_peer:.2f}" + ("" if ok else " (wrong)")
    for r in failed:  # (their own calls timed; the peer's compile or first call failed)
        rows.setdefault((r.case.model, r.case.threads), {})[r.case.mode] = f"{r.case.against} failed"
    body = [[model, str(threads)] + [cells.get(m, "") for m in modes] for (model, threads), cells in rows.items()]
    for threads in sorted({r.case.threads for r in paired + failed}):
        cells = []
        for m in modes:
            group = [r.versus_peer for r in paired if r.case.mode == m and r.case.threads == threads and r.passed
                     and r.peer_accuracy == "pass"]
            cells.append(f"{geomean(group):.2f} (max {max(group):.2f})" if group else "-")
        body.append(["geomean", str(threads)] + cells)
    title = (f"Compiled time ÷ {', '.join(peers)}'s, both timed in one process (interleaved rounds); "
             "below 1: kiln faster")
    return title, ["model", "threads"] + modes, body


def against_peer(results: list[Result]) -> tuple[str, list[str], list[list[str]]] | None:
    """One row per case that had a peer: both compiled calls' times and their ratio, both cold
    compiles, both accuracy verdicts, and where precision was lowered each one's error against
    float32 (eager's too): the figures an issue states a GPU run with."""
    paired = [r for r in results if r.case.against and r.compile_s is not None]  # (stopped ones too: their compiles)
    if not paired:
        return None
    lowered = any(r.case.lowers_precision for r in paired)
    header = ["model", "threads", "mode", "peer", "ms", "peer ms", "÷ peer", "compile s", "peer compile s",
              "accuracy", "peer accuracy"] + (["eager err vs fp32", "err vs fp32", "peer err vs fp32"] if lowered else [])
    rows = []
    for r in paired:
        mode = r.case.mode if r.status == "ok" else f"{r.case.mode} ({r.status}: {r.error})"
        row = [r.case.model, str(r.case.threads), mode, r.case.against, _fmt(r.compiled_ms, ".2f"),
               _fmt(r.peer_ms, ".2f"), _fmt(r.versus_peer, ".2f", "x"), _fmt(r.compile_s, ".1f"),
               _fmt(r.peer_compile_s, ".1f"), r.accuracy or "-", r.peer_accuracy or (f"failed: {r.peer_error}" if r.peer_error else "-")]
        if lowered:
            row += [_fmt(r.eager_fp32_rel_err, ".1e"), _fmt(r.fp32_rel_err, ".1e"), _fmt(r.peer_fp32_rel_err, ".1e")]
        rows.append(row)
    title = "Each case against its peer, in one process" + (
        " (err vs fp32: max |out - float32 eager out| / max |float32 eager out|, the worst output's)" if lowered else "")
    return title, header, rows


def _text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(lines)


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    escape = lambda s: s.replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(escape(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _tables(results: list[Result]) -> list[tuple[str, list[str], list[list[str]]]]:
    summaries = summarize(results)
    budget_header, budget_rows = compile_budget(results)
    budget = [(f"Cold compile against the peer's (budget: at most {COMPILE_BUDGET:g} of its time)",
               budget_header, budget_rows)] if budget_rows else []
    paired, each_against, by_part = versus_peer(results), against_peer(results), compile_by_part(results)
    details = detail_columns(results)
    return [
        ("Speedup over eager (median latency, eager / compiled)", *pivot(results)),
        *([paired] if paired else []),
        *([each_against] if each_against else []),
        ("Summary per mode", [c for c, _ in SUMMARY_COLUMNS], [[f(s) for _, f in SUMMARY_COLUMNS] for s in summaries]),
        *budget,
        *([by_part] if by_part else []),
        ("Every case", [c for c, _ in details], [[f(r) for _, f in details] for r in results]),
    ]


def describe_run(meta: dict[str, Any]) -> str:
    threads = ",".join(str(t) for t in meta["threads"])
    device = f" · device {meta['device']}" if meta.get("device") else ""  # runs saved before the field: none
    dtype = f" · {meta['dtype']} weights" if meta.get("dtype") not in (None, "float32") else ""
    batch = f" · batch {meta['batch']}" if meta.get("batch", 1) != 1 else ""
    return (
        f"{meta['task']} · suite {meta['suite']}{device}{dtype}{batch} · threads {threads} · {meta['iters']} iters after "
        f"{meta['warmup']} warm-up · {meta['cache']} cache{describe_jobs(meta)} · torch {meta['torch']}"
        f"{' · kiln ' + meta['kiln_commit'] if meta.get('kiln_commit') else ''}{describe_malloc(meta)} · {describe_cpu(meta)}"
        f"{' · ' + meta['gpu'] if meta.get('gpu') else ''} · {meta['date']}"
        f"{' · PARTIAL: ' + meta['finished'] if meta.get('finished') else ''}"
    )


def describe_jobs(meta: dict[str, Any]) -> str:
    """" · 4 cases at once (...)" for a run with --jobs 4; nothing for one case at a time."""
    jobs = meta.get("jobs", 1)
    if jobs == 1:
        return ""
    timing = "timed one at a time on the GPU" if meta.get("device") == "cuda" else "timed side by side too"
    return (f" · {jobs} cases at once (compile times inflated by the CPUs they shared; calls {timing})")


def describe_malloc(meta: dict[str, Any]) -> str:
    """" · malloc left alone", or the MiB of freed heap glibc's malloc kept in every case's process
    (`runtime.keep_freed_mb`, applied to every mode alike); nothing for runs saved before the field,
    when kiln's processes alone set it."""
    keep_mb = meta.get("keep_freed_mb")
    if keep_mb is None:
        return ""
    if keep_mb <= 0:
        return " · malloc left alone"
    return f" · malloc keeps {keep_mb} MiB of freed heap in every case's process (runtime.keep_freed_mb)"


def describe_cpu(meta: dict[str, Any]) -> str:
    """"AMD EPYC (family 26, model 2, stepping 1; 2 cores; avx2, avx512f)"; runs saved before a field
    existed show what they have."""
    flags = meta.get("isa") or []
    cores = meta.get("cores")
    parts = [meta.get("cpu_generation") or "", f"{cores} cores" if cores else "", ", ".join(flags)]
    inside = "; ".join(part for part in parts if part)
    return f"{meta.get('cpu', 'unknown CPU')}" + (f" ({inside})" if inside else "")


def _all_tables(results: list[Result], gemm: "GemmRun | None",
                llm: "LlmRun | None" = None) -> tuple[list[str], list[tuple[str, list[str], list[list[str]]]]]:
    """Lines under the run's header, and the tables: the models' (when any ran), then the gemm
    suite's or the llm suite's."""
    if llm is not None:
        from benchmarks.llm_report import describe_bandwidth, llm_tables

        return [describe_bandwidth(llm)], (_tables(results) if results else []) + llm_tables(llm)
    if gemm is None:
        return [], _tables(results)
    from benchmarks.gemm_report import describe_peaks, gemm_notes, gemm_tables

    notes = gemm_notes(gemm)
    tables = (_tables(results) if results else []) + gemm_tables(gemm)
    if notes:
        tables.append(("Why a cell is n/a or wrong", ["implementation, dtype: reason"], [[n] for n in notes]))
    return [describe_peaks(gemm)], tables


def text_report(results: list[Result], meta: dict[str, Any], gemm: "GemmRun | None" = None,
                llm: "LlmRun | None" = None) -> str:
    lines, tables = _all_tables(results, gemm, llm)
    parts = [describe_run(meta), *lines]
    for title, header, rows in tables:
        parts += ["", title, _text_table(header, rows)]
    return "\n".join(parts)


def markdown_report(results: list[Result], meta: dict[str, Any], plot: str | None = None,
                    gemm: "GemmRun | None" = None, llm: "LlmRun | None" = None) -> str:
    lines, tables = _all_tables(results, gemm, llm)
    parts = ["# kiln bench", "", describe_run(meta), *("\n" + line for line in lines)]
    if plot:
        parts += ["", f"![speedup per model and mode]({plot})"]
    for title, header, rows in tables:
        parts += ["", f"## {title}", "", _markdown_table(header, rows)]
    return "\n".join(parts) + "\n"


def json_report(results: list[Result], meta: dict[str, Any], gemm: "GemmRun | None" = None,
                llm: "LlmRun | None" = None) -> dict[str, Any]:
    out = {
        "meta": meta,
        "results": [r.to_json() for r in results],
        "summary": [s.__dict__ | {"pass_rate": s.pass_rate} for s in summarize(results)],
    }
    if gemm is not None:
        out["gemm"] = gemm.to_json()
    if llm is not None:
        out["llm"] = llm.to_json()
    return out


def _kiln_commit() -> str | None:
    """The commit of the kiln checkout that ran (None for an installed copy): kiln changes faster
    than its version number."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def run_metadata(**settings: Any) -> dict[str, Any]:
    """What a reader needs to reproduce the numbers: machine, versions, settings."""
    import torch

    import kiln

    try:
        import transformers

        transformers_version = transformers.__version__
    except ImportError:
        transformers_version = None
    return {
        **settings,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        "cpu_generation": cpu_generation(),  # "family 26, model 2, stepping 1": which EPYC or Xeon it is
        "isa": list(cpu_flags()),  # the speed flags of benchmarks.machine.SPEED_FLAGS it has
        "cores": cpu_cores(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # the kernels ATen dispatches to
        **({"gpu": gpu_model()} if settings.get("device") == "cuda" else {}),  # where a cuda run's models ran
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers_version,
        "kiln": kiln.__version__,
        "kiln_commit": _kiln_commit(),
    }
