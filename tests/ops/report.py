"""Summaries of a kiln-vs-Inductor OpInfo sweep: pass rates, the family table, kiln's failures by cause.

Backends in the rows: "kiln" (`torch.compile(backend="kiln")`), "kiln.compile" (kiln's own capture)
and "inductor"; pass rates of all are over the same rows.
"""

from __future__ import annotations

import collections
import re

from tests.ops.families import FAMILIES

JUDGED = ("pass", "fail", "fallback")
ALL_BACKENDS = ("kiln", "kiln.compile", "inductor")
TOLERANCE_TEXT = {"1e-4": "atol = rtol = 1e-4",
                  "float32": "torch.testing's float32 defaults: rtol = 1.3e-6, atol = 1e-5"}


def tolerance_text(meta: dict) -> str:
    return TOLERANCE_TEXT[meta.get("tolerance", "1e-4")]  # runs before the option existed used 1e-4
CORE = ("pointwise", "reduction", "view", "indexing")


def _backends(rows: list[dict]) -> list[str]:
    return [b for b in ALL_BACKENDS if any(b in r for r in rows)]


def _is_judged(row: dict) -> bool:
    return any(row.get(b) in JUDGED for b in ALL_BACKENDS)


def judged(rows: list[dict]) -> list[dict]:
    """Rows some backend compiled and checked: not rejected by eager, not left uncompiled by Dynamo.
    Pass rates of both backends are over these same rows."""
    return [r for r in rows if _is_judged(r)]


def handled_by(rows: list[dict], backend: str = "inductor") -> list[dict]:
    """Rows `backend` was judged on (its capture handed it a graph): "the ops Inductor handles"."""
    return [r for r in rows if r.get(backend) in JUDGED]


def not_judged(rows: list[dict]) -> list[str]:
    return [f"{r['op']} ({next(r[b] for b in ALL_BACKENDS if b in r)})" for r in rows if not _is_judged(r)]


def family_table(rows: list[dict]) -> list[dict]:
    """Per family (and the four core families together, and all): swept, passed per backend, kiln-generated."""
    backends = _backends(rows)
    rows = judged(rows)
    groups = [(f, [r for r in rows if r["family"] == f]) for f in FAMILIES]
    groups.append(("core (first four)", [r for r in rows if r["family"] in CORE]))
    groups.append(("all", rows))
    table = []
    for name, part in groups:
        entry = dict(family=name, swept=len(part))
        for b in backends:
            entry[b] = sum(r.get(b) == "pass" for r in part)
        if "kiln" in entry:
            entry["generated"] = sum(bool(r.get("kiln_generated")) for r in part)
        table.append(entry)
    return table


def _key(text: str) -> str:
    text = re.sub(r"^kiln: graph \S+ runs eagerly: ", "", text)
    return re.sub(r"\d+", "N", text)[:140]


def failure_causes(rows: list[dict]) -> dict[str, dict[str, list[str]]]:
    """kiln's failures: kind -> cause -> ops. Kinds: extern (passed, but as an ATen call), fallback
    (compiling a graph raised; it ran eagerly), error (raised at compile or run time), wrong result,
    not captured (Dynamo handed kiln no graph where another door or backend compiled one)."""
    kinds: dict[str, dict[str, list[str]]] = {k: collections.defaultdict(list) for k in
                                              ("extern", "fallback", "error", "wrong result", "not captured")}
    for r in judged(rows):
        status, detail = r.get("kiln"), r.get("kiln_detail", "")
        if status == "pass":
            for e in r.get("kiln_fallback_externs", []):
                kinds["extern"][e].append(r["op"])
        elif status in ("not-exercised", "eager-error", None):
            kinds["not captured"][status or "not run"].append(r["op"])
        elif status == "fallback":
            kinds["fallback"][_key(detail)].append(r["op"])
        elif detail.startswith("raised"):
            kinds["error"][_key(detail)].append(r["op"])
        else:
            kinds["wrong result"][_key(detail)[:60]].append(r["op"])
    # Externs first by how many core-family ops wait for them (the order to lower them in), the rest by count.
    order = {k: (lambda kv: -len(kv[1])) for k in kinds}
    order["extern"] = lambda kv: (-core_count(rows, kv[1]), -len(kv[1]))
    return {k: dict(sorted(v.items(), key=order[k])) for k, v in kinds.items()}


def core_count(rows: list[dict], ops: list[str]) -> int:
    """How many of `ops` are pointwise, reduction, view or indexing ops."""
    core = {r["op"] for r in rows if r["family"] in CORE}
    return len(core & set(ops))


def _pct(n: int, d: int) -> str:
    return f"{n / d:.1%}" if d else "-"


def summary_text(rows: list[dict], meta: dict, seconds: float | None) -> str:
    rows_j = judged(rows)
    backends = _backends(rows)
    lines = [f"OpInfo {meta['dtype']} {meta['device']} {meta['direction']} sweep, torch {meta['torch']}, "
             f"{meta['samples_per_op']} samples per op, threads={meta['threads']}"
             + f", {tolerance_text(meta)}"
             + (f", kiln's {meta['codegen']} code generator" if meta.get("codegen") else "")
             + (f", commit {meta['commit']}" if meta.get("commit") else "")
             + (f", {meta['cpu']}" if meta.get("cpu") else "")
             + (f", {meta['note']}" if meta.get("note") else "")
             + (f", {seconds:.0f} s" if seconds else "")]
    counts = {b: collections.Counter(r.get(b) for r in rows) for b in backends}
    for b in backends:
        passed = counts[b]["pass"]
        lines.append(f"{b:12s}: pass rate {passed}/{len(rows_j)} = {_pct(passed, len(rows_j))}   {dict(counts[b])}")
    handled = handled_by(rows)
    if "inductor" in backends and len(handled) != len(rows_j):
        rates = ", ".join(f"{b} {sum(r.get(b) == 'pass' for r in handled)}" for b in backends)
        lines.append(f"over the {len(handled)} ops Dynamo handed Inductor a graph for: {rates}")
    lines.append("")
    header = f"{'family':18s} {'swept':>5s} " + " ".join(f"{b:>12s}" for b in backends)
    if "kiln" in backends:
        header += f" {'kiln-generated':>16s}"
    lines.append(header)
    for e in family_table(rows):
        line = f"{e['family']:18s} {e['swept']:5d} " + " ".join(f"{e[b]:12d}" for b in backends)
        if "generated" in e:
            line += f" {e['generated']:5d} = {_pct(e['generated'], e['swept']):>7s}"
        lines.append(line)
    if "kiln" in backends:
        for kind, causes in failure_causes(rows).items():
            n = len({op for ops in causes.values() for op in ops})
            lines.append(f"\nkiln {kind} ({n} ops):")
            for cause, ops in causes.items():
                core = f", core {core_count(rows, ops)}" if kind == "extern" else ""
                lines.append(f"  [{len(ops)}{core}] {cause}: {' '.join(ops)}")
    for b in backends:
        if b != "kiln":
            bad = [f"{r['op']} ({r.get(b)}: {r.get(f'{b}_detail', '')[:100]})" for r in rows_j if r.get(b) != "pass"]
            lines.append(f"\n{b} not passing ({len(bad)}):\n  " + "\n  ".join(bad))
    skipped = not_judged(rows)
    lines.append(f"\nnot judged ({len(skipped)}): {' '.join(skipped)}")
    return "\n".join(lines)


def markdown(rows: list[dict], meta: dict, seconds: float | None) -> str:
    rows_j = judged(rows)
    backends = _backends(rows)
    note = f"; {meta['note']}" if meta.get("note") else ""
    flags = (" --backward" if meta["direction"] == "backward" else "") + (
        f" --tolerance {meta['tolerance']}" if meta.get("tolerance") else "")
    doors = ("through `torch.compile(backend=...)` (*kiln*, *inductor*) and `kiln.compile` (*kiln.compile*: kiln's "
             "own capture)" if "kiln.compile" in backends else "through `torch.compile(backend=...)`")
    where = "".join(f", {k} {meta[k]}" for k in ("commit", "cpu", "started") if meta.get(k))
    resumed = f", resumed at {', '.join(meta['resumed_at'])}" if meta.get("resumed_at") else ""
    out = [f"# OpInfo {meta['direction']} sweep: kiln beside Inductor\n",
           f"`python -m tests.ops.sweep_opinfo{flags}`: every "
           f"OpInfo entry with {meta['dtype']} support on {meta['device']}, its first {meta['samples_per_op']} samples, "
           f"{doors} against eager, every backend interleaved in one process "
           f"(torch {meta['torch']}, threads={meta['threads']}{f', {seconds / 60:.0f} min' if seconds else ''}"
           f"{where}{resumed}{note}). "
           "An op passes when every sample eager accepts compiled without a fallback to eager and matched "
           f"({tolerance_text(meta)}). *kiln-generated*: passed, and no graph called an ATen op as an extern other "
           "than structural views and library kernels (GEMM, convolution, SDPA, LAPACK, FFT; "
           "`tests/ops/families.py`).\n",
           "| backend | passed | swept | pass rate |", "|---|---:|---:|---:|"]
    for b in backends:
        passed = sum(r.get(b) == "pass" for r in rows_j)
        out.append(f"| {b} | {passed} | {len(rows_j)} | {_pct(passed, len(rows_j))} |")
    handled = handled_by(rows)
    if "inductor" in backends and len(handled) != len(rows_j):
        out += ["", f"Over the {len(handled)} ops Dynamo handed Inductor a graph for (the others were compiled only "
                "through kiln.compile): " + ", ".join(f"{b} {sum(r.get(b) == 'pass' for r in handled)}" for b in backends)
                + "."]
    out += ["", "| family | swept | " + " | ".join(f"passed ({b})" for b in backends)
            + (" | kiln-generated | share |" if "kiln" in backends else " |"),
            "|---|---:|" + "---:|" * len(backends) + ("---:|---:|" if "kiln" in backends else "")]
    for e in family_table(rows):
        cells = [e["family"], str(e["swept"]), *(str(e[b]) for b in backends)]
        if "generated" in e:
            cells += [str(e["generated"]), _pct(e["generated"], e["swept"])]
        out.append("| " + " | ".join(cells) + " |")
    if "kiln" in backends:
        out.append("\n## kiln's failures by cause\n")
        for kind, causes in failure_causes(rows).items():
            n = len({op for ops in causes.values() for op in ops})
            if kind == "extern":
                out += [f"### {kind}: passed, but called ATen for ({n} ops)\n",
                        "| ops | core ops | extern | which |", "|---:|---:|---|---|"]
                out += [f"| {len(ops)} | {core_count(rows, ops)} | `{cause}` | {', '.join(ops)} |"
                        for cause, ops in causes.items()]
            else:
                out += [f"### {kind} ({n} ops)\n", "| ops | cause | which |", "|---:|---|---|"]
                out += [f"| {len(ops)} | `{cause.replace('|', '/')}` | {', '.join(ops)} |" for cause, ops in causes.items()]
            out.append("")
    for b in backends:
        if b != "kiln":
            bad = [f"| {r['op']} | {r.get(b)} | `{r.get(f'{b}_detail', '')[:160].replace('|', '/')}` |"
                   for r in rows_j if r.get(b) != "pass"]
            out += [f"## {b} not passing ({len(bad)})\n", "| op | status | first failing sample |", "|---|---|---|",
                    *bad, ""]
    skipped = not_judged(rows)
    out.append(f"## Not judged ({len(skipped)})\n\nNo backend compiled anything for these: Dynamo handed no graph "
               "(OpInfo wrappers defined in `torch.testing`, which Dynamo does not trace; data-dependent output "
               "shapes; random in-place ops), or eager rejected every sample.\n\n" + ", ".join(skipped) + "\n")
    return "\n".join(out)
