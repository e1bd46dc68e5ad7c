"""A PNG of speedup over eager per model and mode, one panel per thread count, geomean last."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.report import describe_run, geomean
from benchmarks.results import Result


def plot_speedups(results: list[Result], meta: dict[str, Any], path: str | Path) -> None:
    """Write the bar chart; only accurate, measured cases get a bar (others are left empty)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Eager is the 1.0 line; modes that never ran (not available) get no empty legend entry.
    modes = [m for m in dict.fromkeys(r.case.mode for r in results if r.status != "n/a") if m != "eager"]
    models = list(dict.fromkeys(r.case.model for r in results))
    threads = sorted({r.case.threads for r in results})
    fig, axes = plt.subplots(len(threads), 1, figsize=(max(6.0, 1.1 * (len(models) + 1) * max(1, len(modes)) ** 0.5 + 2), 3.2 * len(threads)), squeeze=False)
    width = 0.8 / max(1, len(modes))
    for ax, t in zip(axes[:, 0], threads):
        for j, mode in enumerate(modes):
            by_model = {r.case.model: r for r in results if r.case.mode == mode and r.case.threads == t}
            values = [by_model[m].speedup if m in by_model and by_model[m].passed else 0.0 for m in models]
            values.append(geomean([v for v in values if v > 0]) or 0.0)
            xs = [i + (j - (len(modes) - 1) / 2) * width for i in range(len(models) + 1)]
            ax.bar(xs, values, width, label=mode)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(models) + 1), models + ["geomean"], rotation=20)
        ax.set_ylabel("speedup over eager")
        ax.set_title(f"{t} thread{'s' if t > 1 else ''}", fontsize=10)
        if modes:
            ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(describe_run(meta), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
