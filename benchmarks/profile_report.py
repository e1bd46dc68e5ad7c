"""The profile as text: one roofline table per compiled graph, sorted by time, then the whole
call against the entries' sum (benchmarks/profile.py measures; docs/profile.md explains the
columns)."""

from __future__ import annotations

from benchmarks.profile import Entry, GraphProfile, Profile

HEADER = ("step", "kind", "calls", "ms", "%", "MFLOP", "MB", "GFLOP/s", "GB/s", "bound", "% peak", "what")
_RIGHT = {"calls", "ms", "%", "MFLOP", "MB", "GFLOP/s", "GB/s", "% peak"}


def _num(value: float | None, digits: int) -> str:
    return "?" if value is None else f"{value:.{digits}f}"


def _row(e: Entry, total_ms: float, peak: dict | None) -> list[str]:
    fraction = e.peak_fraction(peak)
    return [e.step, e.kind, str(e.calls), f"{e.ms:.3f}", f"{100 * e.ms / total_ms:.1f}" if total_ms else "-",
            _num(None if e.flops is None else e.flops / 1e6, 1), _num(None if e.bytes is None else e.bytes / 1e6, 2),
            _num(e.gflops_per_s, 1), _num(e.gb_per_s, 1), e.bound(peak) or "-",
            "-" if fraction is None else f"{100 * fraction:.0f}", e.what]


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = []
    for r in rows:
        cells = [c.rjust(w) if h in _RIGHT else c.ljust(w) for c, w, h in zip(r, widths, HEADER)]
        lines.append("  " + "  ".join(cells).rstrip())
    return lines


def _by_kind(graph: GraphProfile, peak: dict | None) -> str:
    """Per kind of entry: its time and, for GEMMs, convolutions and attention, its GFLOP/s."""
    parts = []
    kinds = sorted({e.kind for e in graph.entries}, key=lambda k: -sum(e.ms for e in graph.entries if e.kind == k))
    for kind in kinds:
        entries = [e for e in graph.entries if e.kind == kind]
        ms = sum(e.ms for e in entries)
        flops = [e.flops for e in entries]
        rate = ""
        if kind in ("gemm", "conv", "attention") and None not in flops and ms > 0:
            gflops = sum(flops) / ms / 1e6
            rate = f" at {gflops:.0f} GFLOP/s" + (f" ({100 * gflops / peak['gflops']:.0f} % of peak)" if peak else "")
        parts.append(f"{kind} {ms:.2f} ms{rate}")
    return "by kind: " + "; ".join(parts)


def format_profile(profile: Profile, top: int | None = None) -> str:
    """The profile's tables; `top`: show only the slowest `top` entries of each graph."""
    peak = profile.peak
    lines = []
    if peak:
        lines.append(f"peak: {peak['gflops']:.1f} GFLOP/s, {peak['gbps']:.1f} GB/s ({peak['cpu']}, {peak['threads']} "
                     f"thread{'s' if peak['threads'] != 1 else ''}); an entry above {peak['gflops'] / peak['gbps']:.1f} "
                     f"FLOP/byte is compute-bound")
    else:
        lines.append("peak: not measured (no roofline columns)")
    for graph in profile.graphs:
        shown = graph.entries[:top] if top else graph.entries
        rows = [list(HEADER)] + [_row(e, profile.call_ms, peak) for e in shown]
        lines += ["", graph.label] + _table(rows)
        hidden = graph.entries[len(shown):]
        if hidden:
            lines.append(f"  … {len(hidden)} more entries: {sum(e.ms for e in hidden):.3f} ms")
        lines.append(f"  graph total: {graph.ms:.3f} ms ({100 * graph.ms / profile.call_ms:.1f} % of the call)")
        lines.append(f"  {_by_kind(graph, peak)}")
    share = 100 * profile.entries_ms / profile.call_ms
    median = f", median {profile.call_median_ms:.3f}" if profile.call_median_ms is not None else ""
    lines += [
        "",
        f"whole call: {profile.call_ms:.3f} ms (mean of the half of {profile.iters} plain calls nearest their median{median}); "
        f"entries {profile.entries_ms:.3f} ms "
        f"({share:.1f} %); unaccounted {profile.unaccounted_ms:.3f} ms (Python wrapper lines, freezing check, guards, "
        f"code between graphs)",
        f"instrumented call: {profile.timed_call_ms:.3f} ms (likewise); {profile.timed_entries} timed "
        f"steps at {profile.timer_us:.2f} µs each ≈ {profile.timed_entries * profile.timer_us / 1e3:.3f} ms of timing",
    ]
    return "\n".join(lines)


def format_results(results: list, top: int | None = None) -> str:
    """The profile of every benchmark result that has one (`kiln bench --profile`, `kiln profile`),
    each under a line naming its case and its plain timing."""
    parts = []
    for r in results:
        if not r.kernel_profile:
            continue
        timing = f"compiled call {r.compiled_ms:.2f} ms, eager {r.eager_ms:.2f} ms ({r.speedup:.2f}x)" \
            if r.compiled_ms and r.eager_ms else ""
        parts += [f"== profile: {r.case.label}{': ' + timing if timing else ''}",
                  format_profile(Profile.from_json(r.kernel_profile), top), ""]
    return "\n".join(parts).rstrip()
