"""The printed report of kiln.debug.bisect: the verdict, the ladder's table, then what the search
inside a wrong backend rung found (each rewrite skipped; each graph's lowering and kernels).

Example (the start of a report; docs/debugging.md has a whole one)::

    kiln.debug.bisect: the output goes wrong at rung `backend`, in kernel kernel_b182f7467e65d654 (kernel3 of graph 0)
    tolerance: |actual - expected| <= 0.001 x max|expected| + 0.001 x |expected|, per output tensor

      rung     largest error                             verdict
      capture  0 (identical)                             ok
      aot      0 (identical)                             ok
      backend  0.0705 (180 x tolerance) at output[2, 6]  WRONG
"""

from __future__ import annotations

from typing import Any

from kiln.debug.tolerance import Difference


def _verdict(difference: Difference) -> str:
    return "ok" if difference.ok else "WRONG"


def _table(rows: list[tuple[str, ...]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]) - 1)]
    return [(indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1]).rstrip()
            for row in rows]


def _headline(result: Any) -> str:
    if result.rung == "none":
        return "kiln.debug.bisect: every rung matches eager within tolerance"
    where = f"kiln.debug.bisect: the output goes wrong at rung `{result.rung}`"
    if result.culprit_pass is not None:
        return f"{where}, in rewrite pass `{result.culprit_pass}`"
    if result.culprit_kernel is not None:
        graph, kernel = result.wrong_kernels[0]
        return f"{where}, in kernel {kernel.function} ({kernel.kernel} of graph {graph})"
    return where


def _passes(result: Any) -> list[str]:
    if not result.passes:
        return ["", "no rewrite pass changed a graph: none to skip"]
    rows = [("skipped pass", "largest error", "verdict")]
    for run in result.passes:
        verdict = "ran eagerly (not counted)" if run.fallbacks else ("fixed" if run.ok else "still wrong")
        rows.append((run.name, str(run.difference), verdict))
    lines = ["", "the backend again with each rewrite that changed a graph skipped:", *_table(rows)]
    fixing = result.fixing_passes
    if len(fixing) > 1:
        lines.append(f"skipping any of {', '.join(fixing)} fixes it: {fixing[0]} is the first in pipeline order")
    return lines


def _graphs(result: Any) -> list[str]:
    lines = ["", "no rewrite explains it; each compiled graph checked on the inputs of its first call:"]
    for finding in result.graphs:
        if finding.check is None:
            lines.append(f"  graph {finding.index}: compiled graph vs its ATen graph: {finding.compiled} "
                         f"{_verdict(finding.compiled)}; not checked further: {finding.skipped}")
            continue
        check = finding.check
        lines.append(f"  graph {finding.index}:")
        lines += _table([("compiled graph vs its ATen graph:", str(finding.compiled), _verdict(finding.compiled)),
                         ("lowering (loop-IR reference vs ATen graph):", str(check.lowering), _verdict(check.lowering))],
                        indent="    ")
        rows = [("kernel", "function", "largest error vs reference", "verdict", "ops")]
        for k in check.kernels:
            ops = ", ".join(f"{op} x{n}" for op, n in sorted(k.ops.items()))
            rows.append((k.kernel, k.function, str(k.difference), _verdict(k.difference), ops))
        lines += _table(rows, indent="    ")
    wrong = result.wrong_kernels
    if wrong:
        graph, kernel = wrong[0]
        lines += ["", f"culprit: {kernel.function}, graph {graph}'s {kernel.description}",
                  f"  (given reference inputs, its outputs differ by {kernel.difference})"]
        if len(wrong) > 1:
            lines.append(f"also wrong on reference inputs: {', '.join(k.function for _, k in wrong[1:])}")
    elif any(f.check is not None and not f.check.lowering.ok for f in result.graphs):
        lines += ["", "culprit: the lowering (ATen graph -> loop IR): its reference differs from the ATen graph"]
    else:
        lines += ["", "every kernel and lowering matches its reference: look at the extern calls, the wrapper, "
                  "or graphs that could not be checked"]
    return lines


def report(result: Any) -> str:
    """`result` (a BisectResult) as text."""
    t = result.tolerance
    lines = [_headline(result),
             f"tolerance: |actual - expected| <= {t.atol:g} x max|expected| + {t.rtol:g} x |expected|, per output tensor",
             ""]
    rows = [("rung", "largest error", "verdict")]
    rows += [(run.name, str(run.difference), _verdict(run.difference)) for run in result.rungs]
    lines += _table(rows)
    for run in result.rungs + result.passes:
        lines += [f"  ({run.name}: {reason})" for reason in run.fallbacks]
    if result.rung == "backend":
        lines += _passes(result)
        if result.culprit_pass is None:
            lines += _graphs(result)
    lines += [f"note: {note}" for note in result.notes]
    return "\n".join(lines)
