"""PNG plots of a benchmark run (matplotlib, Agg backend; skipped with a note if missing).

* ``speedup_vs_gamma.png`` — paired speed-up over ``ar`` (the geometric mean over prompts
  of the per-prompt tokens/s ratios, with its 95% interval over prompts; :mod:`.metrics`)
  against γ, one panel per temperature; methods without γ are horizontal lines;
* ``block_efficiency_vs_gamma.png`` — block efficiency against γ;
* ``tau_ccdf.png`` — complementary CDF P(τ ≥ x) of the accepted draft length, at the largest
  γ (block-verification.txt, Figure 3);
* ``acceptance_by_position.png`` — P(τ ≥ i | the draft had ≥ i tokens), at the largest γ;
* ``pearl_timeline.png`` — the busy/idle timeline of the first result row that has one
  (PEARL), drawn by :func:`verispec.telemetry.timeline.draw_timeline`.

All plots use the pooled (``all`` category) rows at batch size 1. They are drawn from the
summary and the result rows alone, so ``python -m verispec.bench.report`` redraws them
from a results file.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, TextIO

from verispec.bench.metrics import ALL

__all__ = ["PLOT_FILES", "write_plots"]

Row = dict[str, Any]

PLOT_FILES = ("speedup_vs_gamma.png", "block_efficiency_vs_gamma.png", "tau_ccdf.png",
              "acceptance_by_position.png")


def _panels(plt: Any, temperatures: list[float], ylabel: str) -> tuple[Any, list[Any]]:
    fig, axes = plt.subplots(1, len(temperatures), figsize=(4.8 * len(temperatures), 3.8),
                             squeeze=False)
    for ax, t in zip(axes[0], temperatures, strict=True):
        ax.set_title(f"T = {t:g}")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    return fig, list(axes[0])


def _vs_gamma(plt: Any, rows: list[Row], temperatures: list[float], metric: str,
              ylabel: str, path: Path) -> None:
    fig, axes = _panels(plt, temperatures, ylabel)
    for ax, t in zip(axes, temperatures, strict=True):
        trows = [r for r in rows if r["temperature"] == t]
        methods = list(dict.fromkeys(r["method"] for r in trows))
        ticks = sorted({r["gamma"] for r in trows
                        if isinstance(r["gamma"], int) and r["gamma"] > 0})
        spread = 0.08 * (min(b - a for a, b in itertools.pairwise(ticks)) if len(ticks) > 1 else 1)
        for k, m in enumerate(methods):
            colour = f"C{k % 10}"
            mrows = sorted((r for r in trows if r["method"] == m and r[metric] is not None),
                           key=lambda r: r["gamma"] if isinstance(r["gamma"], int) else -1)
            gammas = [r["gamma"] for r in mrows if isinstance(r["gamma"], int) and r["gamma"] > 0]
            if not mrows:
                continue
            if not gammas:  # a method without γ: a horizontal line
                ax.axhline(mrows[0][metric], linestyle="--", linewidth=1, label=m,
                           color=colour)
                continue
            mrows = [r for r in mrows if r["gamma"] in gammas]
            ys = [r[metric] for r in mrows]
            shift = spread * (k - (len(methods) - 1) / 2) / max(1, len(methods) - 1)
            gammas = [g + shift for g in gammas]  # side by side, so error bars stay readable
            if metric == "speedup_vs_ar" and all(r["speedup_vs_ar_ci95"] for r in mrows):
                lo = [y - r["speedup_vs_ar_ci95"][0] for y, r in zip(ys, mrows, strict=True)]
                hi = [r["speedup_vs_ar_ci95"][1] - y for y, r in zip(ys, mrows, strict=True)]
                ax.errorbar(gammas, ys, yerr=[lo, hi], marker="o", capsize=3, label=m,
                            color=colour)
            else:
                ax.plot(gammas, ys, marker="o", label=m, color=colour)
        ax.set_xlabel("γ (draft length)")
        if ticks:
            ax.set_xticks(ticks)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _largest_gamma(rows: list[Row], t: float) -> int | None:
    gs = [r["gamma"] for r in rows if r["temperature"] == t and isinstance(r["gamma"], int)
          and r["gamma"] > 0 and r["tau_histogram"]]
    return max(gs) if gs else None


def _tau_ccdf(plt: Any, rows: list[Row], temperatures: list[float], path: Path) -> None:
    fig, axes = _panels(plt, temperatures, "P(τ ≥ x)")
    for ax, t in zip(axes, temperatures, strict=True):
        g = _largest_gamma(rows, t)
        for r in rows:
            if r["temperature"] != t or r["gamma"] != g or not r["tau_histogram"]:
                continue
            hist = r["tau_histogram"]
            total = sum(hist)
            ccdf = [sum(hist[x:]) / total for x in range(len(hist))]
            ax.step(range(len(ccdf)), ccdf, where="post", label=r["method"])
        ax.set_xlabel(f"accepted draft tokens τ (γ = {g})")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _acceptance(plt: Any, rows: list[Row], temperatures: list[float], path: Path) -> None:
    fig, axes = _panels(plt, temperatures, "P(τ ≥ i | drafted ≥ i)")
    for ax, t in zip(axes, temperatures, strict=True):
        g = _largest_gamma(rows, t)
        for r in rows:
            if r["temperature"] == t and r["gamma"] == g and r["acceptance_by_position"]:
                acc = r["acceptance_by_position"]
                ax.plot(range(1, len(acc) + 1), acc, marker="o", label=r["method"])
        ax.set_xlabel(f"draft position i (γ = {g})")
        ax.set_ylim(0, 1.02)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _timeline(results: list[Row], path: Path) -> bool:
    row = next((r for r in results if r.get("timeline")), None)
    if row is None:
        return False
    try:
        from verispec.telemetry.timeline import draw_timeline
    except ImportError:
        return False
    intervals = [tuple(iv) for iv in row["timeline"]]
    waits = (row.get("extra_stats") or {}).get("wait_fraction") or {}
    title = (f"{row['method']} T={row['temperature']:g} γ={row['gamma']} {row['prompt_id']}"
             + ("; waiting " + ", ".join(f"{k} {v:.0%}" for k, v in waits.items())
                if waits else ""))
    draw_timeline(intervals, str(path), title=title)  # type: ignore[arg-type]
    return True


def write_plots(out: Path, summary: dict[str, Any], results: list[Row],
                err: TextIO | None = None) -> list[Path]:
    """Write the PNGs into ``out``; return their paths (empty if matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        if err is not None:
            print("matplotlib is not installed: no plots (pip install matplotlib)", file=err)
        return []
    rows = [r for r in summary["rows"] if r["category"] == ALL and r["batch_size"] == 1]
    if not rows:
        return []
    temperatures = list(dict.fromkeys(r["temperature"] for r in rows))
    written = []
    _vs_gamma(plt, rows, temperatures, "speedup_vs_ar", "speed-up over ar (tokens/s, paired)",
              out / PLOT_FILES[0])
    _vs_gamma(plt, rows, temperatures, "block_efficiency", "block efficiency (tokens/call)",
              out / PLOT_FILES[1])
    _tau_ccdf(plt, rows, temperatures, out / PLOT_FILES[2])
    _acceptance(plt, rows, temperatures, out / PLOT_FILES[3])
    written = [out / f for f in PLOT_FILES]
    if _timeline(results, out / "pearl_timeline.png"):
        written.append(out / "pearl_timeline.png")
    return written
