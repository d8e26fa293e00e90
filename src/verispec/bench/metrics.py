"""From per-prompt result rows to the summary: means ± std over repeats, paired speed-ups.

Conventions (every figure is computed from ``results.jsonl`` alone, so an interrupted and
resumed run summarises exactly like an uninterrupted one):

* A **group** is one method × temperature × γ × batch size × category; the category
  ``all`` pools every category.
* Per repeat, a group's ``tokens_per_s`` is Σ tokens / Σ seconds, ``block_efficiency`` is
  Σ tokens / Σ target calls (prefill excluded), ``mean_accepted`` is Σ τ / Σ iterations,
  ``perplexity`` is exp(Σ NLL / Σ tokens) under the unwarped target. Reported: the mean over
  repeats and the sample standard deviation (``*_std``; None with one repeat).
* **Speed-up over ``ar``** is paired per prompt: for prompt i and repeat r the ratio
  s_ir = throughput(method) / throughput(ar) of the same prompt, repeat, temperature (and
  seed). Per prompt, d_i = mean over repeats of log s_ir. ``speedup_vs_ar`` = exp(mean d_i),
  the geometric mean, with a 95% Student-t confidence interval exp(mean ± t·sd/√n) over the
  n prompts (``speedup_vs_ar_ci95``); ``speedup_vs_ar_std`` is the std over repeats of the
  per-repeat geometric means.
* Per-position acceptance and the τ histogram pool every iteration of the group.
* Forward calls and scored tokens are per generated token (prompt tokens never count).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from verispec.bench.lawcheck import law_check

__all__ = [
    "ALL",
    "group_key",
    "mean_std",
    "paired_ratio_ci",
    "student_t_quantile",
    "summarize",
]

ALL = "all"

Row = dict[str, Any]


def _t_two_sided_mass(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer ``df`` >= 1 (closed-form series in θ)."""
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 0:
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        return s * total
    if df == 1:
        return 2 * theta / math.pi
    term, total = 1.0, 1.0
    for k in range(1, (df - 1) // 2):
        term *= c2 * (2 * k) / (2 * k + 1)
        total += term
    return 2 / math.pi * (theta + s * math.cos(theta) * total)


def student_t_quantile(level: float, df: int) -> float:
    """The t with P(|T| <= t) = ``level`` (e.g. 0.95 -> the 97.5% quantile), by bisection."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    lo, hi = 0.0, 1.0
    while _t_two_sided_mass(hi, df) < level:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if _t_two_sided_mass(mid, df) < level:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def mean_std(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    """(mean, sample std) of the non-None values; std is None with fewer than two."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else None)


def paired_ratio_ci(log_ratios: Sequence[float], level: float = 0.95
                    ) -> tuple[float | None, tuple[float, float] | None]:
    """Geometric-mean ratio exp(mean) and its t confidence interval from per-unit log ratios."""
    n = len(log_ratios)
    if n == 0:
        return None, None
    m = statistics.fmean(log_ratios)
    if n < 2:
        return math.exp(m), None
    half = student_t_quantile(level, n - 1) * statistics.stdev(log_ratios) / math.sqrt(n)
    return math.exp(m), (math.exp(m - half), math.exp(m + half))


def group_key(row: Row, category: str | None = None) -> tuple[Any, ...]:
    return (row["method"], row["temperature"], row["gamma"], row["batch_size"],
            row["category"] if category is None else category)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _sum(rows: Iterable[Row], key: str) -> float:
    return float(sum(r.get(key) or 0 for r in rows))


def _pool_lists(rows: Iterable[Row], key: str) -> list[int]:
    out: list[int] = []
    for r in rows:
        for i, v in enumerate(r.get(key) or []):
            if i == len(out):
                out.append(0)
            out[i] += int(v)
    return out


def _throughput(row: Row) -> float | None:
    if not row["tokens"] or not row["seconds"]:
        return None
    return row["tokens"] / row["seconds"]


def _per_repeat(rows: list[Row]) -> dict[str, float | None]:
    tokens = _sum(rows, "tokens")
    iters = _sum(rows, "iterations")
    lossless = all(r.get("lossless", True) for r in rows)
    nll_known = all(r.get("nll_sum") is not None for r in rows)
    return {
        "tokens_per_s": _ratio(tokens, _sum(rows, "seconds")),
        "block_efficiency": _ratio(tokens, _sum(rows, "target_calls")),
        "mean_accepted": (_ratio(_sum(rows, "accepted_total"), iters)
                          if iters and _sum(rows, "drafted_total") else None),
        "perplexity": (math.exp(_sum(rows, "nll_sum") / tokens) if tokens and nll_known
                       else None),
        "bias_tv_per_token": None if lossless else _ratio(_sum(rows, "bias_tv_sum"), tokens),
    }


def _ar_lookup(rows: list[Row]) -> dict[tuple[Any, ...], Row]:
    """(temperature, prompt_id, repeat) -> the plain ``ar`` row at batch size 1."""
    return {(r["temperature"], r["prompt_id"], r["repeat"]): r for r in rows
            if r["method"] == "ar" and r["batch_size"] == 1}


def _speedups(rows: list[Row], ar: dict[tuple[Any, ...], Row]) -> dict[str, Any]:
    by_prompt: dict[str, list[float]] = defaultdict(list)
    by_repeat: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        base = ar.get((r["temperature"], r["prompt_id"], r["repeat"]))
        mine = _throughput(r)
        theirs = _throughput(base) if base is not None else None
        if mine is None or theirs is None:
            continue
        lr = math.log(mine / theirs)
        by_prompt[r["prompt_id"]].append(lr)
        by_repeat[r["repeat"]].append(lr)
    point, ci = paired_ratio_ci([statistics.fmean(v) for v in by_prompt.values()])
    per_repeat = {r: math.exp(statistics.fmean(v)) for r, v in sorted(by_repeat.items())}
    _, std = mean_std(list(per_repeat.values()))
    return {"speedup_vs_ar": point, "speedup_vs_ar_ci95": list(ci) if ci else None,
            "speedup_vs_ar_std": std, "speedup_pairs": len(by_prompt),
            "_speedup_by_repeat": per_repeat}


def _identical(rows: list[Row], ar: dict[tuple[Any, ...], Row]) -> float | None:
    pairs = [(r, ar.get((r["temperature"], r["prompt_id"], r["repeat"]))) for r in rows]
    pairs = [(r, b) for r, b in pairs if b is not None and "output" in r and "output" in b]
    if not pairs or rows[0]["temperature"] != 0:
        return None
    return sum(r["output"] == b["output"] for r, b in pairs) / len(pairs)


def _summarize_group(key: tuple[Any, ...], rows: list[Row],
                     ar: dict[tuple[Any, ...], Row]) -> Row:
    method, temperature, gamma, batch_size, category = key
    repeats: dict[int, list[Row]] = defaultdict(list)
    for r in rows:
        repeats[r["repeat"]].append(r)
    per = [_per_repeat(rs) for _, rs in sorted(repeats.items())]
    tokens = _sum(rows, "tokens")
    first = rows[0]
    out: Row = {
        "method": method, "base_method": first.get("base_method", method),
        "options": first.get("options", {}), "temperature": temperature, "gamma": gamma,
        "batch_size": batch_size, "category": category,
        "lossless": all(r.get("lossless", True) for r in rows),
        "num_prompts": len({r["prompt_id"] for r in rows}), "repeats": len(repeats),
        "tokens": int(tokens), "seconds": _sum(rows, "seconds"),
    }
    for name in ("block_efficiency", "mean_accepted", "tokens_per_s", "perplexity",
                 "bias_tv_per_token"):
        out[name], out[name + "_std"] = mean_std([p[name] for p in per])
    speed = _speedups(rows, ar)
    by_repeat = speed.pop("_speedup_by_repeat")
    out.update(speed)
    out["per_repeat"] = {
        "repeat": sorted(repeats),
        "block_efficiency": [p["block_efficiency"] for p in per],
        "tokens_per_s": [p["tokens_per_s"] for p in per],
        "speedup_vs_ar": [by_repeat.get(r) for r in sorted(repeats)],
    }
    drafted = _pool_lists(rows, "drafted_by_position")
    accepted = _pool_lists(rows, "accepted_by_position")
    accepted += [0] * (len(drafted) - len(accepted))
    out["acceptance_by_position"] = [a / d for a, d in zip(accepted, drafted) if d]
    out["tau_histogram"] = _pool_lists(rows, "tau_histogram")
    for name, src in (("target_calls_per_token", "target_calls"),
                      ("draft_calls_per_token", "draft_calls"),
                      ("target_tokens_scored_per_token", "target_tokens_scored"),
                      ("extra_tokens_scored_per_token", "extra_tokens_scored")):
        out[name] = _ratio(_sum(rows, src), tokens)
    out["target_calls"] = int(_sum(rows, "target_calls"))
    out["draft_calls"] = int(_sum(rows, "draft_calls"))
    out["target_tokens_scored"] = int(_sum(rows, "target_tokens_scored"))
    mems = [r["peak_memory_mb"] for r in rows if r.get("peak_memory_mb") is not None]
    out["peak_memory_mb"] = max(mems) if mems else None
    energies = [r.get("energy_joules") for r in rows]
    known = all(e is not None for e in energies)
    out["energy_j_per_token"] = _ratio(sum(energies), tokens) if known else None  # type: ignore[arg-type]
    out["energy_source"] = first.get("energy_source", "unavailable")
    out["identical_to_ar"] = _identical(rows, ar)
    checked = [r for r in rows if r.get("law_pits") is not None]
    if checked:
        check = law_check(_sum(checked, "law_z_sum"), _sum(checked, "law_v_sum"),
                          [u for r in checked for u in r["law_pits"]])
        out.update(law_tokens=check.tokens, law_z=check.z, law_ks_pvalue=check.ks_pvalue,
                   law_excess_nll=check.excess_nll, law_flagged=check.flagged)
    return out


def summarize(rows: list[Row]) -> list[Row]:
    """One summary row per method × temperature × γ × batch size × category (and ``all``),
    in the order the groups first appear in ``rows``."""
    groups: dict[tuple[Any, ...], list[Row]] = {}
    for r in rows:
        for key in (group_key(r, ALL), group_key(r)):
            groups.setdefault(key, []).append(r)
    categories = {r["category"] for r in rows}
    ar = _ar_lookup(rows)
    out = []
    for key, grows in groups.items():
        if key[4] != ALL and len(categories) == 1:
            continue  # one category: its row would repeat the "all" row
        out.append(_summarize_group(key, grows, ar))
    return out
