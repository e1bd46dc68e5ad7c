"""The llm suite's tables: per thread count, a row per (model, batch, mode) with prefill and decode
tokens per second, the decode step's time and its forward's alone (the rest is `generate`'s loop),
decode time against Inductor-freeze's, the bytes a decode step reads, the GB/s
that makes and its fraction of the machine's measured read bandwidth, and whether the tokens are
eager's."""

from __future__ import annotations

from benchmarks.llm import LlmResult, LlmRun, compiled_while_timed, fallen, roofline_of
from benchmarks.roofline import BRACKET_AGREEMENT

Table = tuple[str, list[str], list[list[str]]]
PEER = "inductor-freeze"

HEADER = ["model", "batch", "mode", "prefill tok/s", "decode tok/s", "decode ms/token", "forward ms", f"÷ {PEER}",
          "bytes/step", "GB/s", "roofline", "accurate", "note"]


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _megabytes(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e6:.0f} MB" if n >= 1e8 else f"{n / 1e6:.3g} MB"  # (no "1e+03" from :.3g)


def accurate(r: LlmResult) -> str:
    """"yes", "NO (97% of tokens agree)" for a float32 mode; the agreement for a bf16 or quantized one."""
    if r.tokens_equal is None:
        return "-"
    if r.mode == "eager":
        return "reference"
    if r.exact:
        return "yes" if r.tokens_equal else f"NO ({r.agreement:.0%} of tokens agree)"
    return f"{r.agreement:.0%} of tokens agree"


def note(r: LlmResult) -> str:
    if r.status == "n/a":
        return f"not available: {r.note}"
    if r.status != "ok":
        return f"error: {r.note}"
    if r.fallbacks:
        return fallen(r)
    if r.compiled_in_rounds:
        return compiled_while_timed(r)
    busy = [f"kiln's team narrowed {r.team_narrowings}x (busy cores)"] if r.team_narrowings else []
    if (r.others_cpu or 0) > 0.05:
        busy.append(f"others used {r.others_cpu:.0%} of the CPUs")
    return "; ".join(busy)


def versus_peer(r: LlmResult, results: list[LlmResult]) -> float | None:
    """The decode time over Inductor-freeze's, same model, batch and threads."""
    peer = next((p for p in results if p.mode == PEER and (p.model, p.batch, p.threads) == (r.model, r.batch, r.threads)),
                None)
    if peer is None or peer.decode_s is None or r.decode_s is None:
        return None
    return r.decode_s / peer.decode_s


def roofline_cell(r: LlmResult, bandwidth: float | None) -> str:
    """"70% of 34" (the fraction and the GB/s it is of), "(2 of 3 rounds)" where some rounds' probes
    disagreed and were left out, "(no round's probes agree)" where every round's did."""
    roofline = roofline_of(r, bandwidth)
    if roofline is None:
        return "-"
    bracketed, over = r.bracketed_rounds(), r.roofline_bandwidth
    if bracketed is None or over is None:
        return f"{roofline:.0%}"
    kept = sum(bracketed)
    counted = "" if kept == len(bracketed) else (f" ({kept} of {len(bracketed)} rounds)" if kept
                                                 else " (no round's probes agree)")
    return f"{roofline:.0%} of {over:.0f}{counted}"


def row(r: LlmResult, results: list[LlmResult], bandwidth: float | None) -> list[str]:
    return [r.model, str(r.batch), r.mode, _fmt(r.prefill_tokens_per_s, ".0f"), _fmt(r.decode_tokens_per_s, ".1f"),
            _fmt(r.decode_s and r.decode_s * 1e3, ".2f"), _fmt(r.forward_s and r.forward_s * 1e3, ".2f"),
            _fmt(versus_peer(r, results), ".2f", "x"),
            _megabytes(r.step_bytes.total if r.step_bytes else None), _fmt(r.gbps, ".1f"), roofline_cell(r, bandwidth),
            accurate(r), note(r)]


def llm_tables(run: LlmRun) -> list[Table]:
    s = run.settings
    tables = []
    for threads in dict.fromkeys(r.threads for r in run.results):
        results = [r for r in run.results if r.threads == threads]
        bandwidth = run.bandwidth.get(threads)
        title = (f"Text generation, {threads} thread{'s' if threads > 1 else ''}: prompt {s.prompt_len}, "
                 f"{s.new_tokens} new tokens, greedy, {s.kv_cache} KV cache, median of {s.rounds} rounds; roofline: "
                 f"each call's GB/s over the mean of the read bandwidth probed just before and just after it, "
                 f"the median of the rounds whose two probes agree within {BRACKET_AGREEMENT:g}x, 'of' that "
                 f"bandwidth in GB/s (the machine's best probe: {_fmt(bandwidth, '.1f')} GB/s)")
        tables.append((title, HEADER, [row(r, results, bandwidth) for r in results]))
    return tables


def _busy(share: float | None) -> str:
    if (share or 0) <= 0.1:
        return ""
    return f" (other processes used {share:.0%} of the CPUs meanwhile: likely below the machine's)"


def _probes(probes: list[float] | None) -> str:
    if not probes or len(probes) < 2:
        return ""
    return f" (best of {len(probes)} probes, {min(probes):.1f}-{max(probes):.1f})"


def describe_bandwidth(run: LlmRun) -> str:
    measured = "; ".join(f"{gbps:.1f} GB/s at {t} thread{'s' if t > 1 else ''}{_probes(run.bandwidth_probes.get(t))}"
                         f"{_busy(run.bandwidth_others.get(t))}" for t, gbps in run.bandwidth.items())
    return (f"machine read bandwidth (best read-only pass over 1 GiB on 2 MB pages where the kernel gives them: "
            f"torch.sum, amax, dot, row sums or kiln's line reader; probed before "
            f"the run and between the timed calls): {measured}. "
            f"bytes/step: what a decode step reads — every linear weight (LM head included) at the mode's bytes "
            f"per weight, one embedding row per sequence, norms, the KV cache at its average length "
            f"({run.settings.cache_len:g} positions)")
