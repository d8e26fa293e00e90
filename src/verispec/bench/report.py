"""Reports: ``summary.json``, ``summary.md`` (tables shaped like the papers') and ``--compare``;
run as a module, it rebuilds them from a ``results.jsonl`` alone (no model is loaded)::

    python -m verispec.bench.report RESULTS.jsonl --out DIR [--meta run.json] [--no-plots]

``summary.md`` holds, per temperature:

1. every method (all categories pooled): block efficiency, mean τ, tokens/s, decode
   tokens/s, time per output token, prefill time, paired speed-ups over ``ar``
   (end to end and decoding alone) with their 95% intervals, forward calls and scored
   tokens per token, perplexity, distribution bias, peak memory, energy;
2. TOKENV vs BLOCKV per category with Improve % (block-verification.txt, Tables 1, 6–10);
3. speed-up over ``ar`` by category for every method (the shape of PEARL's Tables 1–2);
4. the peers: their configurations and every lossless verispec config against each, paired
   per prompt (:mod:`.comparisons`);
5. speed, speed-up, energy per token and perplexity under the target per method and
   category, with the bias of lossy methods (the shape of MJSD's Table 2);
6. greedy identity with ``ar`` at T = 0, acceptance by position and the one-sample law
   check (:mod:`.lawcheck`).

The estimators are defined in :mod:`.metrics`; ``summary.md`` restates them in its notes.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from verispec.bench.comparisons import (
    gamma_auto_comparisons,
    peer_comparisons,
    peer_configs,
    render_comparisons,
    render_gamma_auto,
)
from verispec.bench.lawcheck import KS_LIMIT, Z_LIMIT
from verispec.bench.metrics import ALL, ESTIMATOR_NOTES, PEER_PREFIXES, summarize

__all__ = ["COMPARED_METRICS", "build_summary", "compare", "main", "read_results_file",
           "regenerate", "render_markdown", "write_reports"]

Row = dict[str, Any]

COMPARED_METRICS = ("block_efficiency", "mean_accepted", "tokens_per_s", "speedup_vs_ar",
                    "decode_tokens_per_s", "speedup_vs_ar_decode", "tpot_ms", "prefill_ms",
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


def _speedup(row: Row, key: str = "speedup_vs_ar") -> str:
    s, ci = row.get(key), row.get(key + "_ci95")
    if s is None:
        return "–"
    return f"{s:.2f}× [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else f"{s:.2f}×"


def _name(row: Row) -> str:
    """The method's label, marked when it is lossy or its output failed the law check."""
    name = row["method"] + ("" if row["lossless"] else " (lossy)")
    return name + (" ⚠ law check failed" if row.get("law_flagged") else "")


def _law_table(rows: list[Row]) -> list[str]:
    """T > 0: the one-sample calibration check of :func:`.lawcheck.law_check`."""
    body = [[_name(r), _gamma(r), str(r["law_tokens"]), _f(r["law_z"]),
             f"{r['law_ks_pvalue']:.3g}", _f(r["law_excess_nll"], 4)]
            for r in rows if r.get("law_tokens")]
    if not body:
        return []
    return [("One-sample calibration check of emitted tokens under the target's law (Z of "
            "NLL − entropy, KS of randomized PIT); Z ~ N(0, 1) and KS p uniform for an exact "
            f"sampler, flagged when |Z| > {Z_LIMIT:g} or KS p < {KS_LIMIT:g}:"), ""] + _table(
        ["method", "γ", "tokens", "Z", "KS p", "excess NLL/token"], body)


def _main_table(rows: list[Row]) -> list[str]:
    header = ["method", "γ", "block eff.", "mean τ", "tok/s", "decode tok/s", "TPOT ms",
              "prefill ms", "speed-up vs ar [95% CI]", "decode speed-up vs ar [95% CI]",
              "target calls/tok", "draft calls/tok", "scored/tok", "perplexity",
              "bias TV/tok", "peak MB", "J/tok"]
    body = []
    for r in rows:
        body.append([
            _name(r), _gamma(r),
            _pm(r["block_efficiency"], r["block_efficiency_std"]),
            _pm(r["mean_accepted"], r["mean_accepted_std"]),
            _pm(r["tokens_per_s"], r["tokens_per_s_std"]), _f(r.get("decode_tokens_per_s")),
            _f(r.get("tpot_ms"), 1), _f(r.get("prefill_ms"), 1), _speedup(r),
            _speedup(r, "speedup_vs_ar_decode"),
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
                     _pm(r["block_efficiency"], r["block_efficiency_std"]),
                     _vs_best_fixed(r, rows)])
    return _table(["method", "γ", "batch", "tok/s", "vs batch 1", "vs ar at this batch",
                   "block eff.", "γ auto vs the best fixed config at this batch"], body)


def _vs_best_fixed(row: Row, rows: list[Row]) -> str:
    """For a γ auto row: its throughput over the best of ``ar`` and every fixed-γ config at
    the same batch size (pooled tok/s), with that config's name."""
    if row["gamma"] != "auto" or not row["tokens_per_s"]:
        return ""
    others = [r for r in rows if r["batch_size"] == row["batch_size"] and r["gamma"] != "auto"
              and r["tokens_per_s"]]
    if not others:
        return "–"
    best = max(others, key=lambda r: r["tokens_per_s"])
    name = best["method"] if best["gamma"] in (None, 0) else f"{best['method']} γ={best['gamma']}"
    return f"{row['tokens_per_s'] / best['tokens_per_s']:.3f}× ({name})"


def _meta_lines(meta: dict[str, Any], rows: list[Row]) -> list[str]:
    """The header of ``summary.md``: what was run, where, and how the figures are made."""
    cats = ", ".join(f"{c} ({n})" for c, n in (meta.get("prompts_per_category") or {}).items())
    precision = meta.get("precision_note", meta.get("dtype_note")) or "precision not recorded"
    lines = [
        (f"- target `{meta.get('target') or 'not recorded'}`, draft "
         f"`{meta.get('draft') or '–'}`, {precision}, device {meta.get('device', '–')}, "
         f"{meta.get('threads', '–')} threads"),
        f"- machine: {meta.get('machine') or 'not recorded'}",
        f"- pair costs, measured at start-up: {meta.get('pair_costs') or 'not measured'}",
        *([f"- γ auto's acceptance prior at the start: {'; '.join(meta['gamma_auto_priors'])}"]
          if meta.get("gamma_auto_priors") else []),
        f"- suites {', '.join(meta.get('suites') or []) or '–'}; prompts per category: {cats}",
        (f"- {meta.get('max_new_tokens', '–')} new tokens"
         + (" (end of sequence ignored)" if meta.get("ignore_eos") else "")
         + f", {meta.get('repeats', '–')} repeat(s), seed {meta.get('seed', '–')}, drafter "
         f"{meta.get('drafter', '–')}"),
    ]
    if meta.get("order"):
        lines.append(f"- order of the configs on each prompt: {meta['order']}")
    for key in sorted(k for k in meta if k.startswith("peer")):
        value = meta[key]
        text = ("; ".join(f"{k}: {v}" for k, v in value.items()) if isinstance(value, dict)
                else str(value))
        lines.append(f"- {key.replace('_', ' ')}: {text}")
    if meta.get("results_file"):
        lines.append(f"- regenerated from `{meta['results_file']}` by "
                     "`python -m verispec.bench.report`")
    lines.append(f"- energy: {'; '.join(sorted({r['energy_source'] for r in rows}))}")
    lines += _peer_provenance(meta)
    return lines + ["", "Notes:", ""] + [f"- {n}" for n in ESTIMATOR_NOTES] + [""]


def _recorded(value: Any) -> str:
    """A provenance value whole, in words: ``k=v`` pairs, space-separated flags."""
    if value is None or value == "" or value == [] or value == {}:
        return "not recorded"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return str(value)


def _peer_provenance(meta: dict[str, Any]) -> list[str]:
    """The llama.cpp peers' provenance from ``meta["llamacpp"]`` (:func:`.sides.llamacpp_meta`),
    one line per item, values whole; nothing for a meta without it (runs without those peers,
    older results)."""
    info = meta.get("llamacpp")
    if not isinstance(info, dict):
        return []
    lines = ["", "Peer provenance:", "",
             f"- llama.cpp (llama-cpp-python): {_recorded(info.get('llama_cpp_python'))}",
             (f"- llama.cpp build options: CMake flags {_recorded(info.get('cmake_flags'))}; "
              f"installed CMake files record {_recorded(info.get('installed_build'))}")]
    if "speculative_build" in info:
        build = info["speculative_build"] or {}
        lines.append("- llama-speculative-simple build flags: "
                     f"{_recorded(build.get('cmake_flags'))}"
                     + (f"; CMake cache {_recorded(build['cmake_cache'])}"
                        if build.get("cmake_cache") else ""))
    lines.append(f"- llama.cpp system_info: {_recorded(info.get('system_info'))}")
    logged = ""
    if "speculative_threads_logged" in info:
        spec = _recorded(info["speculative_threads_logged"])
        logged = f" (llama-speculative-simple logged {spec})"
    lines.append(f"- threads: llama.cpp {_recorded(info.get('threads'))}{logged}; torch "
                 f"{_recorded(meta.get('torch_threads'))}")
    return lines


def render_markdown(summary: dict[str, Any]) -> str:
    meta, rows = summary.get("meta") or {}, summary["rows"]
    lines = ["# verispec bench", "", *_meta_lines(meta, rows)]
    for t in dict.fromkeys(r["temperature"] for r in rows):
        trows = [r for r in rows if r["temperature"] == t and r["batch_size"] == 1]
        lines += [f"## Temperature {t:g}", "", "### All methods (every category pooled)", ""]
        lines += _main_table([r for r in trows if r["category"] == ALL])
        tb = _token_vs_block(trows, t)
        if tb:
            lines += ["### Block verification vs token verification", ""] + tb
        if len({r["category"] for r in trows}) > 1:
            lines += ["### Speed-up over `ar` by category", ""] + _by_category(trows)
        peers = render_comparisons(summary, t)
        if peers:
            lines += ["### Against peers (paired per prompt)", ""] + peers
        auto = render_gamma_auto(summary, t)
        if auto:
            lines += ["### γ chosen by measurement against fixed γ", ""] + auto
        lines += ["### Speed, energy and quality (perplexity under the target)", ""]
        lines += _quality(trows)
        lines += _extras(trows, t)
        lines += _law_table([r for r in trows if r["category"] == ALL])
        batched = [r for r in rows if r["temperature"] == t and r["category"] == ALL]
        if any(r["batch_size"] > 1 for r in batched):
            lines += ["### Batched decoding (throughput of the whole batch)", ""]
            lines += _batch_table(batched)
    return "\n".join(lines).rstrip() + "\n"


def build_summary(meta: dict[str, Any], results: list[Row]) -> dict[str, Any]:
    """The summary of a run's result rows: ``meta``, the groups' ``rows``
    (:func:`.metrics.summarize`), ``peer_configs`` and ``comparisons`` (:mod:`.comparisons`)."""
    return {"meta": meta, "rows": summarize(results), "peer_configs": peer_configs(results),
            "comparisons": peer_comparisons(results),
            "gamma_auto": gamma_auto_comparisons(results)}


def _add_comparisons(summary: dict[str, Any], results_path: Path) -> None:
    """Fill in a summary made of ``meta`` and ``rows`` only: its comparisons with peers from
    the rows of ``results_path`` whose configs the summary holds."""
    shown = {(r["method"], r["temperature"], r["gamma"], r["batch_size"])
             for r in summary["rows"]}
    results = [r for r in (read_results_file(results_path) if results_path.is_file() else [])
               if (r["method"], r["temperature"], r["gamma"], r["batch_size"]) in shown]
    summary["peer_configs"] = peer_configs(results)
    summary["comparisons"] = peer_comparisons(results)
    summary["gamma_auto"] = gamma_auto_comparisons(results)


def write_reports(out: Path, summary: dict[str, Any]) -> None:
    """Write ``summary.json`` and ``summary.md`` into ``out``. A summary without
    ``comparisons`` gets them (in place) from ``out/results.jsonl``."""
    if "comparisons" not in summary:
        _add_comparisons(summary, out / "results.jsonl")
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


# ---------------------------------------------------------------- regeneration


def results_by_key(path: Path, *, truncate: bool = False) -> dict[str, Row]:
    """The complete rows of a ``results.jsonl`` by key, in file order (a later row with the
    same key replaces the earlier one). An unterminated last line, a torn write, is ignored,
    and with ``truncate`` cut off the file so that appending continues cleanly."""
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if truncate and end < len(data):  # the last write was interrupted
        with path.open("r+b") as f:
            f.truncate(end)
    rows: dict[str, Row] = {}
    for lineno, line in enumerate(data[:end].decode("utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno} is not valid JSON; the file is damaged") from exc
        rows[row.get("key", f"line {lineno}")] = row
    return rows


def read_results_file(path: Path) -> list[Row]:
    """The rows of a ``results.jsonl`` (:func:`results_by_key`); the file is only read."""
    return list(results_by_key(path).values())


def _derived_meta(results: list[Row]) -> dict[str, Any]:
    """What the rows themselves tell of the run."""
    prompts: dict[str, set[str]] = {}
    for r in results:
        prompts.setdefault(r["category"], set()).add(r["prompt_id"])
    return {
        "suites": list(dict.fromkeys(r["suite"] for r in results if r.get("suite"))),
        "prompts_per_category": {c: len(ids) for c, ids in prompts.items()},
        "repeats": len({r["repeat"] for r in results}),
        "methods": list(dict.fromkeys(r["method"] for r in results)),
        "temperatures": list(dict.fromkeys(r["temperature"] for r in results)),
        "batch_sizes": list(dict.fromkeys(r["batch_size"] for r in results)),
    }


def _read_meta(path: Path) -> dict[str, Any]:
    """A ``run.json`` (the settings) or a ``summary.json`` (its ``meta``)."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a run.json or summary.json")  # noqa: TRY004
    return dict(data["meta"]) if isinstance(data.get("meta"), dict) else data


def load_meta(results_path: Path, meta_path: Path | None = None) -> dict[str, Any]:
    """The recorded meta of a results file: the ``summary.json`` and then the ``run.json``
    next to it (where present), overridden by ``meta_path``."""
    meta: dict[str, Any] = {}
    for path in (results_path.parent / "summary.json", results_path.parent / "run.json",
                 meta_path):
        if path is not None and path.is_file():
            meta.update(_read_meta(path))
    return meta


def _natural(value: Any) -> tuple[int, Any]:
    """Numbers before names, each in its own order; ``ar`` first among names."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (1, "") if value == "ar" else (2, str(value))


def canonical_order(results: list[Row], meta: dict[str, Any]) -> list[Row]:
    """The rows in the order a run lists them, whatever order they ran in: repeat, prompt,
    then config as the grid expands it (batch size 1 first; temperature, method, γ, batch
    size). Each is ranked by ``meta``'s list where it has one; otherwise by first appearance
    in ``results`` when the configs ran in a fixed order (rows without ``order``), else by
    value (numbers ascending; ``ar``, then the other methods by name, peers last)."""
    fixed = not any("order" in r for r in results)
    first: dict[str, dict[Any, int]] = {"t": {}, "m": {}, "g": {}, "b": {}, "p": {}}
    for r in results:
        for name, value in (("t", r["temperature"]), ("m", r["method"]), ("g", r["gamma"]),
                            ("b", r["batch_size"]), ("p", r["prompt_id"])):
            first[name].setdefault(value, len(first[name]))

    def rank(name: str, listed: str, value: Any) -> tuple[Any, ...]:
        known = list(meta.get(listed) or [])
        if value in known:
            return (known.index(value), 0, 0)
        if fixed:
            return (len(known), first[name][value], 0)
        peer = name == "m" and str(value).startswith(PEER_PREFIXES)
        return (len(known), int(peer), _natural(value))

    def key(r: Row) -> tuple[Any, ...]:
        gamma = r["gamma"] if r["gamma"] not in (0, None) else None
        return (r["repeat"], r.get("prompt_index", first["p"][r["prompt_id"]]),
                r["batch_size"] > 1, rank("t", "temperatures", r["temperature"]),
                rank("m", "methods", r["method"]),
                (-1, 0, 0) if gamma is None else rank("g", "gammas", gamma),
                rank("b", "batch_sizes", r["batch_size"]))

    return sorted(results, key=key)


def regenerate(results_path: Path, out: Path, meta_path: Path | None = None,
               plots: bool = True, err: TextIO | None = None) -> dict[str, Any]:
    """Rebuild ``summary.json``, ``summary.md`` (and the plots) in ``out`` from a results
    file alone; return the summary. The meta is what the rows tell (prompts per category,
    repeats, the grid), overridden by :func:`load_meta`."""
    results = read_results_file(results_path)
    if not results:
        raise ValueError(f"{results_path} holds no result rows")
    recorded = load_meta(results_path, meta_path)
    ordered = canonical_order(results, recorded)
    meta = {**_derived_meta(ordered), **recorded, "results_file": results_path.name}
    summary = build_summary(meta, ordered)
    out.mkdir(parents=True, exist_ok=True)
    write_reports(out, summary)
    if plots:
        from verispec.bench.plots import write_plots

        write_plots(out, summary, ordered, err)
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m verispec.bench.report RESULTS.jsonl --out DIR``."""
    parser = argparse.ArgumentParser(
        prog="python -m verispec.bench.report",
        description="Rebuild summary.md, summary.json and the plots of a verispec bench run "
                    "from its results.jsonl alone (no model is loaded).")
    parser.add_argument("results", type=Path, help="a bench run's results.jsonl")
    parser.add_argument("--out", type=Path, required=True, help="directory for the reports")
    parser.add_argument("--meta", type=Path, default=None,
                        help="a run.json or summary.json giving the run's settings (default: "
                             "those next to RESULTS, where present)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    args = parser.parse_args(argv)
    try:
        regenerate(args.results, args.out, args.meta, plots=not args.no_plots, err=sys.stderr)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out / 'summary.md'} and {args.out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
