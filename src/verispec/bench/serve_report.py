"""The tables of ``verispec bench serve``: cells averaged over repeats, and γ auto against
the better of its alternatives at every concurrency.

A *config* is a method with one γ (``block γ=auto``, ``block γ=8``, ``ar``). For each
temperature and concurrency the benchmark runs every config ``repeats`` times, interleaved
(repeat → temperature → concurrency → config), so a repeat's cells are measured minutes
apart at most and are paired by repeat:

* **throughput** of a config: the mean of its repeats' tokens/s;
* **auto / best**: for every config with γ ``auto``, the geometric mean over repeats of
  its throughput divided by that of the *best other config* of the same temperature and
  concurrency (best by mean throughput: ``ar`` or the same method at a fixed γ), with a
  Student-t interval over repeats (none with one repeat);
* **TPOT auto / ar**: the same ratio of p50 times per output token against ``ar``;
* **mean γ**: drafted tokens per target pass of the config's requests (from the server's
  ``speculative`` extension), the γ the policy chose on average.

Merging: ``python -m verispec.bench.serve_report MERGED.json A.json B.json ...`` puts the
cells of several reports (say verispec's, ``vllm-plain``'s and ``vllm-spec-k4``'s) into
one report whose tables show every config's rows side by side; each source's config, peer
and machine are kept under ``sources``. A label already taken by an earlier report gets
`` @FILE-STEM`` appended; γ auto is compared within each report only, so two runs'
repeats are never paired. Where peers' reports are merged with verispec's, one more table
puts **verispec's best against the peers' best** at every temperature and concurrency (best:
the config of highest mean throughput on each side): the ratio of the geometric means of
the two configs' repeats, with a Welch t interval on the log throughputs (the two sides ran
in different processes at different times, so their repeats are not paired). A merged
report can be merged again (or rendered alone: ``serve_report OUT.json MERGED.json``): its
peers are the cells labelled by its sources' peer names, its γ auto comparisons the ones it
holds. Reports from before configs, temperatures and repeats (one row per method and
concurrency, no ``label``) are read as γ None, their run's temperature and one repeat.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

from verispec.bench.metrics import paired_ratio_ci, student_t_quantile

__all__ = ["CellLike", "auto_comparisons", "main", "merge_reports", "peer_comparisons",
           "render_comparisons", "render_file", "render_means", "render_peer_comparisons"]


class CellLike(Protocol):
    label: str
    gamma: str | None
    temperature: float
    concurrency: int
    repeat: int
    throughput_tok_s: float
    ttft_p50_s: float | None
    tpot_p50_s: float | None
    block_efficiency: float | None
    mean_gamma: float | None
    errors: int


Key = tuple[float, int, str]  # (temperature, concurrency, config label)


def _by_key(cells: Sequence[CellLike]) -> dict[Key, dict[int, CellLike]]:
    out: dict[Key, dict[int, CellLike]] = defaultdict(dict)
    for c in cells:
        out[(c.temperature, c.concurrency, c.label)][c.repeat] = c
    return out


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.fmean(vals) if vals else None


def render_means(cells: Sequence[CellLike]) -> str:
    """One row per (temperature, concurrency, config): means over repeats."""
    head = ["T", "clients", "config", "repeats", "errors", "tok/s", "TTFT p50 ms",
            "TPOT p50 ms", "block eff.", "mean γ"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (t, n, label), reps in sorted(_by_key(cells).items()):
        runs = list(reps.values())
        ttft, tpot = _mean([c.ttft_p50_s for c in runs]), _mean([c.tpot_p50_s for c in runs])
        eff, gamma = _mean([c.block_efficiency for c in runs]), _mean([c.mean_gamma for c in runs])
        lines.append("| " + " | ".join([
            f"{t:g}", str(n), label, str(len(runs)), str(sum(c.errors for c in runs)),
            f"{statistics.fmean(c.throughput_tok_s for c in runs):.2f}",
            "—" if ttft is None else f"{ttft * 1e3:.1f}",
            "—" if tpot is None else f"{tpot * 1e3:.1f}",
            "—" if eff is None else f"{eff:.2f}", "—" if gamma is None else f"{gamma:.2f}",
        ]) + " |")
    return "\n".join(lines)


def _paired(a: dict[int, CellLike], b: dict[int, CellLike],
            metric: Callable[[CellLike], float | None]) -> dict[str, Any]:
    logs = []
    for rep in sorted(set(a) & set(b)):
        x, y = metric(a[rep]), metric(b[rep])
        if x is not None and y is not None and x > 0 and y > 0:
            logs.append(math.log(x / y))
    ratio, ci = paired_ratio_ci(logs)
    return {"ratio": ratio, "ci": list(ci) if ci else None, "repeats": len(logs)}


def auto_comparisons(cells: Sequence[CellLike]) -> list[dict[str, Any]]:
    """γ auto against the best other config at each temperature and concurrency."""
    keyed = _by_key(cells)
    out = []
    for (t, n, label), reps in sorted(keyed.items()):
        if next(iter(reps.values())).gamma != "auto":
            continue
        method = label.split(" ")[0]
        rivals = {lab: r for (t2, n2, lab), r in keyed.items()
                  if (t2, n2) == (t, n) and lab != label
                  and (lab == "ar" or lab.split(" ")[0] == method)}
        if not rivals:
            continue
        best = max(rivals, key=lambda lab: statistics.fmean(
            c.throughput_tok_s for c in rivals[lab].values()))
        entry = {"temperature": t, "concurrency": n, "config": label, "best_other": best,
                 "throughput": _paired(reps, rivals[best], lambda c: c.throughput_tok_s)}
        if "ar" in rivals:
            entry["tpot_vs_ar"] = _paired(reps, rivals["ar"], lambda c: c.tpot_p50_s)
        out.append(entry)
    return out


def _ratio(entry: dict[str, Any] | None) -> str:
    if entry is None or entry["ratio"] is None:
        return "—"
    ci = entry["ci"]
    return f"{entry['ratio']:.3f}×" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")


def render_comparisons(entries: Sequence[dict[str, Any]]) -> str:
    """The γ auto table (empty string when no config has γ auto)."""
    if not entries:
        return ""
    head = ["T", "clients", "config", "best other", "throughput auto / best (95% CI)",
            "TPOT p50 auto / ar"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in entries:
        lines.append("| " + " | ".join([
            f"{e['temperature']:g}", str(e["concurrency"]), e["config"], e["best_other"],
            _ratio(e["throughput"]), _ratio(e.get("tpot_vs_ar"))]) + " |")
    return "\n".join(lines)


def _unpaired(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """exp(mean log a − mean log b) with a Welch t interval (degrees of freedom rounded
    down; none with fewer than two values on a side)."""
    la, lb = [math.log(x) for x in a if x > 0], [math.log(x) for x in b if x > 0]
    if not la or not lb:
        return {"ratio": None, "ci": None, "repeats": [len(la), len(lb)]}
    diff = statistics.fmean(la) - statistics.fmean(lb)
    out: dict[str, Any] = {"ratio": math.exp(diff), "ci": None, "repeats": [len(la), len(lb)]}
    if len(la) > 1 and len(lb) > 1:
        va, vb = statistics.variance(la) / len(la), statistics.variance(lb) / len(lb)
        if va + vb > 0:
            df = (va + vb) ** 2 / (va ** 2 / (len(la) - 1) + vb ** 2 / (len(lb) - 1))
            half = student_t_quantile(level, max(int(df), 1)) * math.sqrt(va + vb)
        else:
            half = 0.0
        out["ci"] = [math.exp(diff - half), math.exp(diff + half)]
    return out


def peer_comparisons(cells: Sequence[CellLike], peers: set[str]) -> list[dict[str, Any]]:
    """verispec's best config against the best of the ``peers`` (config labels) at every
    temperature and concurrency where both sides ran."""
    keyed = _by_key(cells)
    out = []
    for t, n in sorted({(t, n) for t, n, _ in keyed}):
        here = {lab: reps for (t2, n2, lab), reps in keyed.items() if (t2, n2) == (t, n)}
        ours = {lab: r for lab, r in here.items() if lab not in peers}
        theirs = {lab: r for lab, r in here.items() if lab in peers}
        if not ours or not theirs:
            continue

        def best(side: dict[str, dict[int, CellLike]]) -> str:
            return max(side, key=lambda lab: statistics.fmean(
                c.throughput_tok_s for c in side[lab].values()))

        mine, peer = best(ours), best(theirs)
        out.append({"temperature": t, "concurrency": n, "config": mine, "peer": peer,
                    "throughput": _unpaired(
                        [c.throughput_tok_s for c in ours[mine].values()],
                        [c.throughput_tok_s for c in theirs[peer].values()])})
    return out


def render_peer_comparisons(entries: Sequence[dict[str, Any]]) -> str:
    """The table of verispec's best against the peers' best (empty string without peers)."""
    if not entries:
        return ""
    head = ["T", "clients", "verispec's best", "peers' best",
            "throughput verispec / peer (95% CI)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in entries:
        lines.append("| " + " | ".join([
            f"{e['temperature']:g}", str(e["concurrency"]), e["config"], e["peer"],
            _ratio(e["throughput"])]) + " |")
    return "\n".join(lines)


def _cells(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The report's cells, older rows (no ``label``: one γ per method, one temperature, one
    repeat) given the fields of the current ones."""
    temperature = float((report.get("config") or {}).get("temperature") or 0.0)
    out = []
    for c in report["cells"]:
        gamma = c.get("gamma")
        label = c["method"] if gamma is None else f"{c['method']} γ={gamma}"
        out.append({"label": label, "gamma": gamma, "temperature": temperature, "repeat": 0,
                    "mean_gamma": None, "ttft_p50_s": None, **c})
    return out


def _peer_labels(report: dict[str, Any], cells: Sequence[dict[str, Any]]) -> set[str]:
    """The labels of a report's peer cells: all of them in a peer's own report; in a merged
    report, those named by its sources' peers (`` @SOURCE`` suffixes aside)."""
    if report.get("peer"):
        return {c["label"] for c in cells}
    names = {s["peer"]["name"] for s in report.get("sources") or [] if s.get("peer")}
    return {c["label"] for c in cells if c["label"].split(" @")[0] in names}


def merge_reports(reports: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One report from ``(name, report)`` pairs: all cells, the tables over all of them,
    and each source's config, peer and machine under ``sources`` (a merged report's own
    sources, where one is merged again)."""
    cells: list[dict[str, Any]] = []
    sources: list[dict[str, Any]] = []
    comparisons: list[dict[str, Any]] = []
    peers: set[str] = set()
    for name, report in reports:
        taken = {c["label"] for c in cells}
        own = [{**c, "label": c["label"] + (f" @{name}" if c["label"] in taken else "")}
               for c in _cells(report)]
        if "sources" in report:  # already merged: its comparisons were made within each run
            comparisons += report.get("comparisons") or []
            sources += report["sources"]
        else:
            comparisons += auto_comparisons([SimpleNamespace(**c) for c in own])  # within a run
            sources.append({"name": name, "config": report.get("config"),
                            "peer": report.get("peer"), "machine": report.get("machine")})
        cells += own
        peers |= _peer_labels(report, own)
    rows: list[Any] = [SimpleNamespace(**c) for c in cells]
    against = peer_comparisons(rows, peers)
    table = "\n\n".join(t for t in (render_means(rows), render_comparisons(comparisons),
                                     render_peer_comparisons(against)) if t)
    return {"sources": sources, "cells": cells, "comparisons": comparisons,
            "peer_comparisons": against, "markdown": table}


def render_file(*paths: str | Path) -> str:
    """The tables of one report (a run's or a merged one), or of several merged, as
    :func:`main` prints them."""
    reports = [(Path(p).stem, json.loads(Path(p).read_text(encoding="utf-8"))) for p in paths]
    return str(merge_reports(reports)["markdown"])


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m verispec.bench.serve_report MERGED.json A.json B.json ...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or any(a.startswith("-") for a in args):
        print("usage: python -m verispec.bench.serve_report MERGED.json REPORT.json ...\n"
              "merges reports of verispec bench serve into one", file=sys.stderr)
        return 2
    try:
        reports = [(Path(a).stem, json.loads(Path(a).read_text(encoding="utf-8")))
                   for a in args[1:]]
        merged = merge_reports(reports)
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    Path(args[0]).write_text(json.dumps(merged, indent=2) + "\n", encoding="utf-8")
    print(merged["markdown"])
    print(f"written {args[0]}", file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
