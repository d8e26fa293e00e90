"""Reports: ``summary.json``, ``summary.md`` (tables shaped like the papers') and ``--compare``.

``summary.md`` holds, per temperature:

1. every method (all categories pooled): block efficiency, mean τ, tokens/s, paired speed-up
   over ``ar`` with its 95% CI, forward calls and scored tokens per token, perplexity,
   distribution bias, peak memory, energy;
2. TOKENV vs BLOCKV per category with Improve % (block-verification.txt, Tables 1, 6–10);
3. speed-up over ``ar`` by category for every method (the shape of PEARL's Tables 1–2);
4. the peer comparison: each method's tokens/s relative to ``hf-ar`` and ``hf-assisted``;
5. speed, speed-up, energy per token and perplexity under the target per method and
   category, with the bias of lossy methods (the shape of MJSD's Table 2);
6. greedy identity with ``ar`` at T = 0, and acceptance by position.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verispec.bench.metrics import ALL

__all__ = ["COMPARED_METRICS", "compare", "render_markdown", "write_reports"]

Row = dict[str, Any]

COMPARED_METRICS = ("block_efficiency", "mean_accepted", "tokens_per_s", "speedup_vs_ar",
                    "perplexity", "target_calls_per_token", "draft_calls_per_token",
                    "peak_memory_mb", "energy_j_per_token")


def _f(x: float | None, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}"


def _pm(mean: float | None, std: float | None, digits: int = 2) -> str:
    if mean is None:
        return "–"
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if std is not None else f"{mean:.{digits}f}"


def _gamma(row: Row) -> str:
    g = row["gamma"]
    return "–" if g is None else str(g)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines + [""]


def _speedup(row: Row) -> str:
    s, ci = row.get("speedup_vs_ar"), row.get("speedup_vs_ar_ci95")
    if s is None:
        return "–"
    return f"{s:.2f}× [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else f"{s:.2f}×"


def _name(row: Row) -> str:
    """The method's label, marked when it is lossy or its output failed the law check."""
    name = row["method"] + ("" if row["lossless"] else " (lossy)")
    return name + (" ⚠ law check failed" if row.get("law_flagged") else "")


def _law_table(rows: list[Row]) -> list[str]:
    """T > 0: does each method's output follow the target's law? (:mod:`.lawcheck`)"""
    body = [[_name(r), _gamma(r), str(r["law_tokens"]), _f(r["law_z"]),
             f"{r['law_ks_pvalue']:.3g}", _f(r["law_excess_nll"], 4)]
            for r in rows if r.get("law_tokens")]
    if not body:
        return []
    return ["Output law against the target's (Z ~ N(0, 1) and KS p uniform for an exact sampler;"
            " flagged when |Z| > 3.3 or KS p < 1e-3):", ""] + _table(
        ["method", "γ", "tokens", "Z", "KS p", "excess NLL/token"], body)


def _main_table(rows: list[Row]) -> list[str]:
    header = ["method", "γ", "block eff.", "mean τ", "tok/s", "speed-up vs ar [95% CI]",
              "target calls/tok", "draft calls/tok", "scored/tok", "perplexity",
              "bias TV/tok", "peak MB", "J/tok"]
    body = []
    for r in rows:
        body.append([
            _name(r), _gamma(r),
            _pm(r["block_efficiency"], r["block_efficiency_std"]),
            _pm(r["mean_accepted"], r["mean_accepted_std"]),
            _pm(r["tokens_per_s"], r["tokens_per_s_std"]), _speedup(r),
            _f(r["target_calls_per_token"], 3), _f(r["draft_calls_per_token"], 3),
            _f(r["target_tokens_scored_per_token"], 2), _pm(r["perplexity"], r["perplexity_std"]),
            "–" if r["lossless"] else _f(r["bias_tv_per_token"], 4),
            _f(r["peak_memory_mb"], 0), _f(r["energy_j_per_token"], 3),
        ])
    return _table(header, body)


def _improve(a: list[float | None], b: list[float | None]) -> str:
    """Improve % of b over a, mean ± std over repeats (paired by repeat)."""
    vals = [100 * (y / x - 1) for x, y in zip(a, b) if x and y is not None]
    if not vals:
        return "–"
    if len(vals) == 1:
        return f"{vals[0]:.2f}"
    return f"{statistics.fmean(vals):.2f} ± {statistics.stdev(vals):.2f}"


def _token_vs_block(rows: list[Row], temperature: float) -> list[str]:
    out: list[str] = []
    by = {(r["method"], r["gamma"], r["category"]): r for r in rows
          if r["temperature"] == temperature and r["batch_size"] == 1}
    gammas = sorted({g for (m, g, _) in by if m == "token" and isinstance(g, int)})
    for g in gammas:
        cats = [c for (m, gg, c) in by if m == "token" and gg == g]
        cats = [c for c in cats if c != ALL] + [ALL]
        body = []
        for c in cats:
            t, b = by.get(("token", g, c)), by.get(("block", g, c))
            if t is None or b is None:
                continue
            body.append([
                "all (pooled)" if c == ALL else c,
                _pm(t["block_efficiency"], t["block_efficiency_std"]),
                _pm(b["block_efficiency"], b["block_efficiency_std"]),
                _improve(t["per_repeat"]["block_efficiency"], b["per_repeat"]["block_efficiency"]),
                _pm(t["speedup_vs_ar"], t["speedup_vs_ar_std"]),
                _pm(b["speedup_vs_ar"], b["speedup_vs_ar_std"]),
                _improve(t["per_repeat"]["speedup_vs_ar"], b["per_repeat"]["speedup_vs_ar"]),
            ])
        if body:
            out += [f"#### γ = {g}: token verification (TOKENV) vs block verification (BLOCKV)",
                    ""]
            out += _table(["category", "block eff. TOKENV", "block eff. BLOCKV", "Improve %",
                           "speed-up TOKENV", "speed-up BLOCKV", "Improve %"], body)
    return out


def _by_category(rows: list[Row]) -> list[str]:
    cats = [c for c in dict.fromkeys(r["category"] for r in rows) if c != ALL] + [ALL]
    cols = [(r["method"], r["gamma"]) for r in rows if r["category"] == ALL]
    by = {(r["method"], r["gamma"], r["category"]): r for r in rows}
    header = ["category"] + [m if g in (None, 0) else f"{m} γ={g}" for m, g in cols]
    body = []
    for c in cats:
        line = ["all" if c == ALL else c]
        for m, g in cols:
            r = by.get((m, g, c))
            line.append(_f(r["speedup_vs_ar"]) + "×" if r and r["speedup_vs_ar"] else "–")
        body.append(line)
    return _table(header, body)


def _rel(tps: float | None, other: Row | None) -> str:
    if other is None or not tps or not other["tokens_per_s"]:
        return "–"
    return f"{tps / other['tokens_per_s']:.2f}×"


def _peers(rows: list[Row]) -> list[str]:
    pooled = [r for r in rows if r["category"] == ALL]
    hf_ar = next((r for r in pooled if r["method"] == "hf-ar"), None)
    assisted = {r["gamma"]: r for r in pooled if r["method"] == "hf-assisted"}
    default = next((r for r in pooled if r["method"] == "hf-assisted-default"), None)
    if hf_ar is None and not assisted and default is None:
        return []
    body = []
    best = max(assisted.values(), key=lambda x: x["tokens_per_s"] or 0, default=None)
    for r in pooled:
        tps = r["tokens_per_s"]
        same = assisted.get(r["gamma"])
        body.append([r["method"], _gamma(r), _f(tps), _rel(tps, hf_ar), _rel(tps, same),
                     _rel(tps, best), _rel(tps, default)])
    return _table(["method", "γ", "tok/s", "vs hf-ar", "vs hf-assisted (same γ)",
                   "vs best hf-assisted", "vs hf-assisted-default"], body)


def _quality(rows: list[Row]) -> list[str]:
    """MJSD's Table 2 shape: one column per method, per category the rows speed (tok/s),
    speed-up, energy (J/token), perplexity under the target and, for lossy methods, bias."""
    cols = [(r["method"], r["gamma"]) for r in rows if r["category"] == ALL]
    by = {(r["method"], r["gamma"], r["category"]): r for r in rows}
    cats = [c for c in dict.fromkeys(r["category"] for r in rows) if c != ALL] + [ALL]
    if len(cats) == 2:
        cats = [ALL]  # one category: its rows would repeat the pooled ones
    header = ["category", "metric"] + [m if g in (None, 0) else f"{m} γ={g}" for m, g in cols]
    metrics = (
        ("speed (tok/s) ↑", lambda r: _pm(r["tokens_per_s"], r["tokens_per_s_std"])),
        ("speed-up ↑", lambda r: _pm(r["speedup_vs_ar"], r["speedup_vs_ar_std"])),
        ("energy (J/token) ↓", lambda r: _f(r["energy_j_per_token"], 3)),
        ("perplexity ↓", lambda r: _pm(r["perplexity"], r["perplexity_std"], 3)),
        ("bias TV/token", lambda r: "lossless" if r["lossless"] else _f(r["bias_tv_per_token"], 4)),
    )
    body = []
    for c in cats:
        for i, (name, cell) in enumerate(metrics):
            line = [("all" if c == ALL else c) if i == 0 else "", name]
            for m, g in cols:
                r = by.get((m, g, c))
                line.append(cell(r) if r is not None else "–")
            body.append(line)
    return _table(header, body)


def _extras(rows: list[Row], temperature: float) -> list[str]:
    pooled = [r for r in rows if r["category"] == ALL]
    out: list[str] = []
    if temperature == 0:
        ident = [[r["method"], _gamma(r), _f(100 * r["identical_to_ar"], 1) + "%"]
                 for r in pooled if r["identical_to_ar"] is not None and r["method"] != "ar"]
        if ident:
            out += ["Greedy outputs identical to `ar` (token for token):", ""]
            out += _table(["method", "γ", "identical prompts"], ident)
    acc = [[r["method"], _gamma(r), " ".join(f"{a:.2f}" for a in r["acceptance_by_position"])]
           for r in pooled if r["acceptance_by_position"]]
    if acc:
        out += ["Acceptance by position, P(τ ≥ i | the draft had ≥ i tokens):", ""]
        out += _table(["method", "γ", "i = 1, 2, …"], acc)
    return out


def _batch_table(rows: list[Row]) -> list[str]:
    single = {(r["method"], r["gamma"]): r for r in rows if r["batch_size"] == 1}
    ar = {r["batch_size"]: r for r in rows if r["method"] == "ar"}
    body = []
    for r in sorted(rows, key=lambda r: (r["method"], str(r["gamma"]), r["batch_size"])):
        one = single.get((r["method"], r["gamma"]))
        base = ar.get(r["batch_size"])
        vs_one = (f"{r['tokens_per_s'] / one['tokens_per_s']:.2f}×"
                  if one and one["tokens_per_s"] and r["tokens_per_s"] else "–")
        vs_ar = (f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}×"
                 if base and base["tokens_per_s"] and r["tokens_per_s"] else "–")
        body.append([r["method"], _gamma(r), str(r["batch_size"]),
                     _pm(r["tokens_per_s"], r["tokens_per_s_std"]), vs_one, vs_ar,
                     _pm(r["block_efficiency"], r["block_efficiency_std"])])
    return _table(["method", "γ", "batch", "tok/s", "vs batch 1", "vs ar at this batch",
                   "block eff."], body)


def render_markdown(summary: dict[str, Any]) -> str:
    meta, rows = summary["meta"], summary["rows"]
    cats = ", ".join(f"{c} ({n})" for c, n in meta["prompts_per_category"].items())
    lines = [
        "# verispec bench", "",
        (f"- target `{meta['target']}`, draft `{meta['draft'] or '–'}`, "
         f"{meta.get('precision_note', meta.get('dtype_note', ''))}, device {meta['device']}, {meta['threads']} threads"),
        f"- machine: {meta.get('machine') or 'not recorded'}",
        f"- pair costs, measured at start-up: {meta.get('pair_costs') or 'not measured'}",
        f"- suites {', '.join(meta['suites'])}; prompts per category: {cats}",
        (f"- {meta['max_new_tokens']} new tokens, {meta['repeats']} repeat(s), seed "
         f"{meta['seed']}, drafter {meta['drafter']}"),
        ("- mean ± std over repeats; speed-up = geometric mean over prompts of the paired "
         "throughput ratio to `ar` (same prompt, repeat and seed), 95% Student-t CI over "
         "prompts; forward calls and scored tokens per generated token (prefill excluded)"),
        "",
    ]
    energy = {r["energy_source"] for r in rows}
    lines += [f"- energy: {'; '.join(sorted(energy))}", ""]
    for t in dict.fromkeys(r["temperature"] for r in rows):
        trows = [r for r in rows if r["temperature"] == t and r["batch_size"] == 1]
        lines += [f"## Temperature {t:g}", "", "### All methods (every category pooled)", ""]
        lines += _main_table([r for r in trows if r["category"] == ALL])
        tb = _token_vs_block(trows, t)
        if tb:
            lines += ["### Block verification vs token verification", ""] + tb
        if len({r["category"] for r in trows}) > 1:
            lines += ["### Speed-up over `ar` by category", ""] + _by_category(trows)
        peers = _peers(trows)
        if peers:
            lines += ["### Against transformers (tokens/s ratios)", ""] + peers
        lines += ["### Speed, energy and quality (perplexity under the target)", ""]
        lines += _quality(trows)
        lines += _extras(trows, t)
        lines += _law_table([r for r in trows if r["category"] == ALL])
        batched = [r for r in rows if r["temperature"] == t and r["category"] == ALL]
        if any(r["batch_size"] > 1 for r in batched):
            lines += ["### Batched decoding (throughput of the whole batch)", ""]
            lines += _batch_table(batched)
    return "\n".join(lines).rstrip() + "\n"


def write_reports(out: Path, summary: dict[str, Any]) -> None:
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "summary.md").write_text(render_markdown(summary))


def _load(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        p = p / "summary.json"
    if not p.is_file():
        raise FileNotFoundError(f"{p} does not exist")
    data = json.loads(p.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        # A bad input file, reported like every other input error (exit status 2).
        raise ValueError(f"{p} is not a verispec bench summary.json (no 'rows' list)")  # noqa: TRY004
    return data


def _row_key(r: Row) -> tuple[Any, ...]:
    return (r["method"], r["temperature"], r.get("gamma"), r.get("batch_size", 1),
            r.get("category", ALL))


def compare(a_path: str | Path, b_path: str | Path) -> str:
    """A table of B / A for every metric of every row present in both summaries."""
    a, b = _load(a_path), _load(b_path)
    index_a = {_row_key(r): r for r in a["rows"]}
    index_b = {_row_key(r): r for r in b["rows"]}
    shared = [k for k in index_a if k in index_b]
    header = ["method", "T", "γ", "batch", "category"] + [f"{m} B/A" for m in COMPARED_METRICS]
    body = []
    for k in shared:
        ra, rb = index_a[k], index_b[k]
        cells = []
        for m in COMPARED_METRICS:
            x, y = ra.get(m), rb.get(m)
            cells.append(f"{y / x:.3f}" if isinstance(x, (int, float)) and x
                         and isinstance(y, (int, float)) else "–")
        body.append([str(k[0]), f"{k[1]:g}", "–" if k[2] is None else str(k[2]), str(k[3]),
                     str(k[4])] + cells)
    lines = [f"B = {b_path}, A = {a_path}: ratio B / A per metric", ""]
    lines += _table(header, body) if body else ["(no rows in common)", ""]
    only_a = [k for k in index_a if k not in index_b]
    only_b = [k for k in index_b if k not in index_a]
    if only_a:
        lines.append(f"{len(only_a)} row(s) only in A: "
                     + ", ".join(f"{k[0]} T={k[1]:g} γ={k[2]} {k[4]}" for k in only_a))
    if only_b:
        lines.append(f"{len(only_b)} row(s) only in B: "
                     + ", ".join(f"{k[0]} T={k[1]:g} γ={k[2]} {k[4]}" for k in only_b))
    return "\n".join(lines).rstrip() + "\n"
