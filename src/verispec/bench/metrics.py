"""From per-prompt result rows to the summary: speeds, paired ratios, their intervals.

Every figure is computed from ``results.jsonl`` alone, so an interrupted and resumed run
summarises exactly like an uninterrupted one, and ``python -m verispec.bench.report``
rebuilds the reports from the file. A **group** is one method × temperature × γ × batch
size × category; the category ``all`` pools every category. The estimators, defined here
once (``summary.md`` restates them in its notes):

**Per result row** (one prompt, one repeat, one config; the timing fields are defined in
:mod:`.runner`):

* throughput x = tokens / seconds (prefill included); undefined when either is 0;
* prefill p = ``prefill_seconds``, the phase before decoding (what it covers is the row's
  ``prefill_covers``: for verispec and ``llamacpp-spec`` the prompt read up to its last
  token, no token generated yet; for ``llamacpp-ar`` and ``hf-ar`` up to the first
  generated token; for ``hf-assisted*`` up to the first accepted block). Rows of files
  written before that field: verispec's own rows use ``prefill_time_s`` (the same span);
  peer rows have none;
* decode rate y = ``decode_tokens`` / ``decode_seconds``: the tokens generated after the
  prefill over the time after it (``decode_seconds`` = seconds − p), the same work on
  every side. Older verispec rows: tokens / (seconds − ``prefill_time_s``), every token
  being made after that prefill. Undefined without those fields, with no decode token or
  a non-positive decode time;
* time per output token 1 / y.

**Per group**, for a per-row figure f (x, y or p), each prompt i first averages logs over
its repeats, ℓ_i = mean_r log f_ir, and the group's figure is the geometric mean over the
prompts, exp(mean_i ℓ_i):

* ``tokens_per_s`` of x; ``decode_tokens_per_s`` of y; ``tpot_ms`` = 1000 / that (the
  same geometric mean of 1/y, in ms); ``prefill_ms`` of p, in ms (a time to first token
  only where p covers the first token, see above). ``decode_prompts`` counts the prompts
  with a decode figure;
* ``tokens_per_s_std``: the sample standard deviation over repeats of the per-repeat
  geometric means exp(mean_i log x_ir) (None with one repeat; listed in ``per_repeat``);
* ``pooled_tokens_per_s`` = Σ tokens / Σ seconds over every row of the group: a
  length-weighted throughput, kept under that name only; no ratio is computed from it;
* count ratios pooled per repeat, then mean ± sample std over repeats: ``block_efficiency``
  Σ tokens / Σ target calls (prefill excluded), ``mean_accepted`` Σ τ / Σ iterations,
  ``perplexity`` exp(Σ NLL / Σ tokens) under the unwarped target, ``bias_tv_per_token``;
* per-position acceptance and the τ histogram pool every iteration of the group; forward
  calls and scored tokens are per generated token (prompt tokens never count).

**Paired ratios** of A over B (``speedup_vs_ar`` and ``speedup_vs_ar_decode`` against the
``ar`` rows at batch size 1, and the comparisons with peers of :mod:`.comparisons`): a pair
is A's and B's rows of the same prompt, temperature and repeat (hence the same seed). Per
prompt, d_i = mean over its repeats of log(f_A / f_B); the ratio is exp(mean_i d_i) and its
95% interval exp(mean ± t·sd/√n), Student's t with n − 1 degrees of freedom over the n
prompts: prompts are the unit, repeats of a prompt are not independent samples. When A and
B have f on the same prompts and repeats, the ratio equals A's column divided by B's column
(up to rounding: a difference of means of logs). ``speedup_vs_ar_std`` is the std over
repeats of the per-repeat geometric-mean ratios; ``speedup_pairs`` /
``speedup_decode_pairs`` count the prompts paired.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from verispec.bench.lawcheck import law_check

__all__ = [
    "ALL",
    "ESTIMATOR_NOTES",
    "PEER_PREFIXES",
    "Metric",
    "PairedRatio",
    "decode_throughput",
    "geometric_mean_over_prompts",
    "group_key",
    "is_peer",
    "mean_std",
    "paired_ratio",
    "paired_ratio_ci",
    "prefill_seconds",
    "prompt_ratio_ci",
    "student_t_quantile",
    "summarize",
    "throughput",
]

ALL = "all"
#: Method names (``base_method``) of peer systems: transformers' and llama.cpp's generators.
PEER_PREFIXES = ("hf-", "llamacpp")

Row = dict[str, Any]
Metric = Callable[[Row], float | None]

#: The notes ``summary.md`` prints: the estimators of this module's docstring, in short.
ESTIMATOR_NOTES = (
    ("tok/s = geometric mean over prompts of tokens / seconds (prefill included), each "
     "prompt's repeats averaged in logs first; ± = sample std over repeats of the "
     "per-repeat geometric means. Σ tokens / Σ seconds is kept in summary.json as "
     "`pooled_tokens_per_s` only"),
    ("decode tok/s = the same geometric mean of decode tokens / decode seconds: the tokens "
     "made after the prefill over the time after it, the same work on every side (older "
     "verispec rows: tokens / (seconds − prefill_time_s)); TPOT = 1000 / decode tok/s (ms "
     "per output token); prefill ms = geometric mean of the prefill seconds: for verispec "
     "and llamacpp-spec the prompt read up to its last token, for llamacpp-ar and hf-ar up "
     "to the first generated token, for hf-assisted up to the first accepted block; – "
     "where a row records no prefill time"),
    ("speed-ups and comparisons are paired: the same prompt, temperature and repeat (hence "
     "seed); per prompt the log ratios are averaged over repeats, the ratio is their "
     "geometric mean over prompts with a 95% Student-t interval over prompts (prompts are "
     "the unit). On the same prompts, column A / column B equals the stated ratio"),
    ("block efficiency, mean τ, perplexity: Σ over a repeat's rows, then mean ± std over "
     "repeats; forward calls and scored tokens per generated token (prefill excluded)"),
)


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
    """Geometric-mean ratio exp(mean) and its t confidence interval from per-unit log ratios
    (one value per independent unit: a prompt)."""
    n = len(log_ratios)
    if n == 0:
        return None, None
    m = statistics.fmean(log_ratios)
    if n < 2:
        return math.exp(m), None
    half = student_t_quantile(level, n - 1) * statistics.stdev(log_ratios) / math.sqrt(n)
    return math.exp(m), (math.exp(m - half), math.exp(m + half))


def prompt_ratio_ci(by_prompt: Mapping[Any, Sequence[float]], level: float = 0.95
                    ) -> tuple[float | None, tuple[float, float] | None]:
    """:func:`paired_ratio_ci` with prompts as the unit: ``by_prompt`` maps a prompt to the
    log ratios of its repeats (or rounds), which are averaged before the interval."""
    return paired_ratio_ci([statistics.fmean(v) for v in by_prompt.values() if v], level)


# ---------------------------------------------------------------- per-row figures


def is_peer(row: Row) -> bool:
    """Whether the row is a peer system's (transformers or llama.cpp), not verispec's."""
    return str(row.get("base_method", row["method"])).startswith(PEER_PREFIXES)


def throughput(row: Row) -> float | None:
    """tokens / seconds, prefill included."""
    if not row.get("tokens") or not row.get("seconds") or row["seconds"] <= 0:
        return None
    return row["tokens"] / row["seconds"]


def prefill_seconds(row: Row) -> float | None:
    """The row's prefill: ``prefill_seconds``; for rows of older files, verispec's own
    ``prefill_time_s`` (peers recorded none)."""
    p = row.get("prefill_seconds")
    if p is None and not is_peer(row):
        p = row.get("prefill_time_s")
    return None if p is None or p < 0 else float(p)


def decode_throughput(row: Row) -> float | None:
    """``decode_tokens`` / ``decode_seconds``; for older verispec rows, tokens / (seconds −
    ``prefill_time_s``) (that prefill ends before the first generated token)."""
    tokens, seconds = row.get("decode_tokens"), row.get("decode_seconds")
    if tokens is None or seconds is None:
        p = prefill_seconds(row)
        if is_peer(row) or p is None or row.get("prefill_seconds") is not None:
            return None
        tokens, seconds = row.get("tokens") or 0, (row.get("seconds") or 0.0) - p
    if tokens < 1 or seconds <= 0:
        return None
    return tokens / seconds


def _prefill_positive(row: Row) -> float | None:
    p = prefill_seconds(row)
    return p if p else None


def geometric_mean_over_prompts(rows: Iterable[Row], metric: Metric) -> tuple[float | None, int]:
    """(exp(mean over prompts of the mean over repeats of log metric), prompts counted)."""
    logs: dict[Any, list[float]] = defaultdict(list)
    for r in rows:
        v = metric(r)
        if v is not None and v > 0:
            logs[r["prompt_id"]].append(math.log(v))
    if not logs:
        return None, 0
    return math.exp(statistics.fmean(statistics.fmean(v) for v in logs.values())), len(logs)


# ---------------------------------------------------------------- paired ratios


class PairedRatio:
    """A over B, paired per (prompt, repeat), logs averaged per prompt, t interval over
    prompts; ``by_repeat`` holds the per-repeat geometric-mean ratios."""

    def __init__(self, pairs: Iterable[tuple[Row, Row]], metric: Metric) -> None:
        by_prompt: dict[Any, list[float]] = defaultdict(list)
        by_repeat: dict[Any, list[float]] = defaultdict(list)
        for a, b in pairs:
            fa, fb = metric(a), metric(b)
            if not fa or not fb or fa <= 0 or fb <= 0:
                continue
            lr = math.log(fa / fb)
            by_prompt[a["prompt_id"]].append(lr)
            by_repeat[a["repeat"]].append(lr)
        self.ratio, ci = prompt_ratio_ci(by_prompt)
        self.ci95: list[float] | None = list(ci) if ci else None
        self.prompts = len(by_prompt)
        self.by_repeat = {r: math.exp(statistics.fmean(v)) for r, v in sorted(by_repeat.items())}


def paired_ratio(rows_a: Iterable[Row], rows_b: Iterable[Row], metric: Metric) -> PairedRatio:
    """A over B for ``metric``, pairing rows of the same temperature, prompt and repeat."""
    index = {(r["temperature"], r["prompt_id"], r["repeat"]): r for r in rows_b}
    pairs = [(a, index[k]) for a in rows_a
             if (k := (a["temperature"], a["prompt_id"], a["repeat"])) in index]
    return PairedRatio(pairs, metric)


# ---------------------------------------------------------------- groups


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


def _per_repeat(rows: list[Row]) -> dict[str, float | None]:
    tokens = _sum(rows, "tokens")
    iters = _sum(rows, "iterations")
    lossless = all(r.get("lossless", True) for r in rows)
    nll_known = all(r.get("nll_sum") is not None for r in rows)
    return {
        "tokens_per_s": geometric_mean_over_prompts(rows, throughput)[0],
        "block_efficiency": _ratio(tokens, _sum(rows, "target_calls")),
        "mean_accepted": (_ratio(_sum(rows, "accepted_total"), iters)
                          if iters and _sum(rows, "drafted_total") else None),
        "perplexity": (math.exp(_sum(rows, "nll_sum") / tokens) if tokens and nll_known
                       else None),
        "bias_tv_per_token": None if lossless else _ratio(_sum(rows, "bias_tv_sum"), tokens),
    }


def _ar_rows(rows: list[Row]) -> list[Row]:
    """The plain ``ar`` rows at batch size 1: the base of every speed-up."""
    return [r for r in rows if r["method"] == "ar" and r["batch_size"] == 1]


def _speeds(rows: list[Row], ar: list[Row]) -> Row:
    """The group's speed figures and its paired speed-ups over ``ar``."""
    tps, _ = geometric_mean_over_prompts(rows, throughput)
    decode, decode_prompts = geometric_mean_over_prompts(rows, decode_throughput)
    prefill, _ = geometric_mean_over_prompts(rows, _prefill_positive)
    e2e = paired_ratio(rows, ar, throughput)
    dec = paired_ratio(rows, ar, decode_throughput)
    _, std = mean_std(list(e2e.by_repeat.values()))
    return {
        "tokens_per_s": tps, "pooled_tokens_per_s": _ratio(_sum(rows, "tokens"),
                                                           _sum(rows, "seconds")),
        "decode_tokens_per_s": decode, "decode_prompts": decode_prompts,
        "tpot_ms": 1000 / decode if decode else None,
        "prefill_ms": 1000 * prefill if prefill is not None else None,
        "speedup_vs_ar": e2e.ratio, "speedup_vs_ar_ci95": e2e.ci95, "speedup_vs_ar_std": std,
        "speedup_pairs": e2e.prompts,
        "speedup_vs_ar_decode": dec.ratio, "speedup_vs_ar_decode_ci95": dec.ci95,
        "speedup_decode_pairs": dec.prompts,
        "_speedup_by_repeat": e2e.by_repeat,
    }


def _identical(rows: list[Row], ar: list[Row]) -> float | None:
    index = {(r["temperature"], r["prompt_id"], r["repeat"]): r for r in ar}
    pairs = [(r, index.get((r["temperature"], r["prompt_id"], r["repeat"]))) for r in rows]
    pairs = [(r, b) for r, b in pairs if b is not None and "output" in r and "output" in b]
    if not pairs or rows[0]["temperature"] != 0:
        return None
    return sum(r["output"] == b["output"] for r, b in pairs) / len(pairs)


def _costs(rows: list[Row], tokens: float) -> Row:
    """Forward calls, scored tokens, memory and energy of a group."""
    out: Row = {}
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
    out["energy_j_per_token"] = (_ratio(sum(e for e in energies if e is not None), tokens)
                                 if known else None)
    out["energy_source"] = rows[0].get("energy_source", "unavailable")
    return out


def _law(rows: list[Row]) -> Row:
    """The one-sample law check (:func:`.lawcheck.law_check`) over the group's rows."""
    checked = [r for r in rows if r.get("law_pits") is not None]
    if not checked:
        return {}
    check = law_check(_sum(checked, "law_z_sum"), _sum(checked, "law_v_sum"),
                      [u for r in checked for u in r["law_pits"]])
    return {"law_tokens": check.tokens, "law_z": check.z, "law_ks_pvalue": check.ks_pvalue,
            "law_excess_nll": check.excess_nll, "law_flagged": check.flagged}


def _summarize_group(key: tuple[Any, ...], rows: list[Row], ar: list[Row]) -> Row:
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
        "batch_size": batch_size, "category": category, "peer": is_peer(first),
        "lossless": all(r.get("lossless", True) for r in rows),
        "num_prompts": len({r["prompt_id"] for r in rows}), "repeats": len(repeats),
        "tokens": int(tokens), "seconds": _sum(rows, "seconds"),
    }
    for name in ("block_efficiency", "mean_accepted", "perplexity", "bias_tv_per_token"):
        out[name], out[name + "_std"] = mean_std([p[name] for p in per])
    speeds = _speeds(rows, ar)
    by_repeat = speeds.pop("_speedup_by_repeat")
    out.update(speeds)
    out["tokens_per_s_std"] = mean_std([p["tokens_per_s"] for p in per])[1]
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
    out.update(_costs(rows, tokens))
    out["identical_to_ar"] = _identical(rows, ar)
    out.update(_law(rows))
    return out


def summarize(rows: list[Row]) -> list[Row]:
    """One summary row per method × temperature × γ × batch size × category (and ``all``),
    in the order the groups first appear in ``rows``."""
    groups: dict[tuple[Any, ...], list[Row]] = {}
    for r in rows:
        for key in (group_key(r, ALL), group_key(r)):
            groups.setdefault(key, []).append(r)
    categories = {r["category"] for r in rows}
    ar = _ar_rows(rows)
    out = []
    for key, grows in groups.items():
        if key[4] != ALL and len(categories) == 1:
            continue  # one category: its row would repeat the "all" row
        out.append(_summarize_group(key, grows, ar))
    return out
