"""Figures for ``verispec theory`` and ``verispec audit`` (matplotlib, Agg canvas, PNG).

Each function takes the dict that the matching computation returns (the same object that
``--json`` prints) and writes one PNG. No global pyplot state is touched.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "plot_audit",
    "plot_batch",
    "plot_ccdf",
    "plot_draft_length",
    "plot_ot_bound",
    "plot_pareto",
    "plot_predict",
    "plot_rejections",
]


def _figure(ncols: int = 1, width: float = 6.0, height: float = 4.0) -> tuple[Any, list[Any]]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:  # pragma: no cover - matplotlib is a dependency
        raise RuntimeError("--plot needs matplotlib (pip install matplotlib)") from exc
    fig = Figure(figsize=(width * ncols, height))
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    return fig, axes


def _save(fig: Any, path: str | Path) -> None:
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)


def plot_ccdf(toy: dict[str, Any], path: str | Path) -> None:
    """Figure 3 of *Block Verification Accelerates Speculative Decoding* (Sun et al.), exact:
    P(τ ≥ x) for token and block verification."""
    cc = toy["ccdf"]
    fig, (ax,) = _figure()
    ax.step(cc["x"], cc["token"], where="mid", marker="o", label="token verification")
    ax.step(cc["x"], cc["block"], where="mid", marker="s", label="block verification")
    ax.set_xlabel("x")
    ax.set_ylabel("P(τ ≥ x)")
    ax.set_title(f"Exact CCDF of τ, A/B toy models, γ = {cc['gamma']}")
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, path)


def plot_ot_bound(res: dict[str, Any], path: str | Path) -> None:
    names = ["token", "block", "greedy_block", "bound"]
    fig, (ax,) = _figure()
    ax.bar(names, [res[n] for n in names], color=["C0", "C1", "C2", "C3"])
    ax.set_ylabel("E[τ] (accepted draft tokens)")
    ax.set_title(f"Lemma 10 bound, {res['model']} V={res['vocab']} γ={res['gamma']}")
    _save(fig, path)


def plot_rejections(res: dict[str, Any], path: str | Path) -> None:
    """Running mean of simulated N_rej converging to the exact value (Figure 2a)."""
    sim = res["simulation"]
    runs = list(range(1, len(sim["running_mean"]) + 1))
    fig, (ax,) = _figure()
    mean, se = sim["running_mean"], sim["running_se"]
    ax.plot(runs, mean, color="C2", label="engine simulation (running mean)")
    ax.fill_between(runs, [m - 2 * s for m, s in zip(mean, se, strict=True)],
                    [m + 2 * s for m, s in zip(mean, se, strict=True)], color="C2", alpha=0.2)
    ax.axhline(res["exact"], color="C1", label=f"exact Σ E[TV] = {res['exact']:.3f}")
    ax.set_xlabel("runs")
    ax.set_ylabel("rejections")
    ax.set_title(f"Expected rejections, {res['states']} states, T = {res['horizon']}, "
                 f"M = {res['num_drafts']}")
    ax.legend()
    _save(fig, path)


def plot_batch(res: dict[str, Any], path: str | Path) -> None:
    """Theorem 3: Markov rejections vs M; Bernoulli and uniform batch improvement vs M."""
    ms = res["M"]
    fig, (a0, a1, a2) = _figure(3, 4.5, 4.0)
    mk = res["markov"]
    a0.plot(ms, mk["expected_rejections"], marker="o")
    a0.axhline(mk["limit_M_inf"], ls="--", color="gray", label="M → ∞")
    a0.set_title(f"Markov chains: E[N_rej] vs M (T = {mk['horizon']})")
    a0.set_xlabel("M")
    a0.legend()
    for ax, key, label in ((a1, "bernoulli", "u"), (a2, "uniform", "r")):
        for i, row in enumerate(res[key]):
            ax.plot(ms, row["batch_improvement"], marker="o", color=f"C{i}",
                    label=f"{label} = {row[label]}")
            ax.axhline(row["limit_M_inf"], ls="--", color=f"C{i}", alpha=0.6)
        ax.set_xlabel("M")
        ax.set_ylabel("batch improvement")
        ax.legend()
    a1.set_title(f"Bernoulli: target Ber({res['bernoulli'][0]['v']}), draft Ber(u)")
    a2.set_title("Uniform: r = V / V'")
    _save(fig, path)


def plot_pareto(res: dict[str, Any], path: str | Path) -> None:
    pts = res["points"]
    fig, (ax,) = _figure()
    tv = res["tv"]
    ax.plot([0, tv], [tv, 0], color="C3", label="Pareto front (Theorem 5)")
    ax.scatter([r["p_reject"] for r in pts], [r["tv_opt"] for r in pts], label="Decoding-OPT", zorder=3)
    ax.scatter([r["p_reject"] for r in pts], [r["tv_uno"] for r in pts], marker="x",
               label="Decoding-UNO (residual = p)", zorder=3)
    ax.set_xlabel("P(reject)")
    ax.set_ylabel("TV(emitted token, p)")
    ax.set_title("Rejection vs bias, lossy verification over ε")
    ax.legend()
    _save(fig, path)


def _speedup_axes(ax: Any, gammas: list[int], series: dict[str, list[float]], title: str) -> None:
    for name, vals in series.items():
        ax.plot(gammas, vals, marker="o", label=name)
    ax.axhline(1.0, ls=":", color="gray", label="ar")
    ax.set_xlabel("γ")
    ax.set_ylabel("predicted speed-up over ar")
    ax.set_title(title)
    ax.legend()


def plot_draft_length(res: dict[str, Any], path: str | Path) -> None:
    fig, (ax,) = _figure()
    _speedup_axes(ax, res["gamma"], {"SD (equation 2)": res["sd_speedup"], "PEARL": res["pearl_speedup"]},
                  f"α = {res['alpha']}, c = {res['c']}")
    _save(fig, path)


def plot_predict(res: dict[str, Any], path: str | Path) -> None:
    rows = res["predictions"]
    fig, axes = _figure(len(rows))
    for ax, row in zip(axes, rows, strict=True):
        _speedup_axes(ax, row["gamma"], {row["method"]: row["sd_speedup"], "pearl": row["pearl_speedup"]},
                      f"{row['method']} (T={row['temperature']}), c = {row['c']:.2f}")
    _save(fig, path)


def plot_audit(res: dict[str, Any], path: str | Path) -> None:
    """Sequence probabilities: target vs method (the first 40 sequences by target mass)."""
    laws = res.get("laws")
    if not laws:
        raise ValueError("plot_audit needs an audit result computed with with_laws=True")
    keys = sorted(set(laws["target"]) | set(laws["method"]), key=lambda k: -laws["target"].get(k, 0.0))[:40]
    fig, (ax,) = _figure(1, max(6.0, 0.25 * len(keys)), 4.0)
    xs = range(len(keys))
    ax.bar([x - 0.2 for x in xs], [laws["target"].get(k, 0.0) for k in keys], width=0.4, label="target")
    ax.bar([x + 0.2 for x in xs], [laws["method"].get(k, 0.0) for k in keys], width=0.4,
           label=res["method"])
    ax.set_xticks(list(xs))
    ax.set_xticklabels(keys, rotation=90, fontsize=7)
    ax.set_ylabel("probability")
    verdict = "lossless" if res["lossless"] else "NOT lossless"
    ax.set_title(f"{res['method']}: max |error| {res['max_abs_error']:.2e}, TV {res['tv']:.2e} ({verdict})")
    ax.legend()
    _save(fig, path)


PLOTTERS: dict[str, Callable[[dict[str, Any], str | Path], None]] = {
    "toy-example": plot_ccdf, "ot-bound": plot_ot_bound, "rejections": plot_rejections,
    "batch": plot_batch, "pareto": plot_pareto, "draft-length": plot_draft_length,
    "predict": plot_predict,
}
