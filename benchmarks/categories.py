"""Per-category speed-ups of one method over others from a ``verispec bench`` run, end to
end and over the decoding alone, with the prefill's share of the time.

    python benchmarks/categories.py main/results.jsonl --method block --over ar,llamacpp-ar

What it computes, per category (and ``all``) and temperature, from the rows at batch size 1:

* ``METHOD / OTHER``: tokens / seconds (prefill included) of METHOD over OTHER;
* ``METHOD / OTHER, decoding``: the decode rate, ``decode_tokens`` / ``decode_seconds``
  (the tokens generated after the prefill over the time after it, the same work on every
  side; see :mod:`verispec.bench.runner`), of METHOD over OTHER. Rows of older files have
  no such fields: verispec's own rows then use tokens / (seconds − ``prefill_time_s``),
  and peers such as llama.cpp, which recorded no prefill, get –;
* each ratio is paired: rows of the same prompt, temperature and repeat (hence seed); the
  log ratios of a prompt's repeats are averaged first, and the figure is their geometric
  mean over the category's prompts with a 95% Student-t interval over those prompts (the
  bench's own estimator, :mod:`verispec.bench.metrics`);
* a method must have run at one γ per temperature (rows are matched by method label);
* ``prefill share, OTHER / METHOD``: the arithmetic mean over rows of ``prefill_seconds``
  (older verispec rows: ``prefill_time_s``) / seconds, for the first OTHER and for METHOD
  (– without prefill times). What a prefill covers differs by side (``prefill_covers``).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verispec.bench.metrics import (
    Metric,
    decode_throughput,
    paired_ratio,
    prefill_seconds,
    throughput,
)

Row = dict[str, Any]


def _paired(mine: list[Row], theirs: list[Row], metric: Metric) -> str:
    ratio = paired_ratio(mine, theirs, metric)
    if ratio.ratio is None:
        return "–"
    ci = ratio.ci95
    return f"{ratio.ratio:.2f}× [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else f"{ratio.ratio:.2f}×"


def _prefill_share(rows: list[Row]) -> str:
    shares = [p / r["seconds"] for r in rows
              if (p := prefill_seconds(r)) is not None and r.get("seconds")]
    return f"{100 * sum(shares) / len(shares):.0f}%" if shares else "–"


def table(rows: list[Row], method: str, over: Sequence[str]) -> str:
    """The markdown table: one line per category (and all) and temperature."""
    rows = [r for r in rows if r.get("batch_size", 1) == 1]
    for name in (method, *over):
        gammas = {(r["temperature"], r["gamma"]) for r in rows if r["method"] == name}
        if len(gammas) > len({t for t, _ in gammas}):
            raise ValueError(f"{name} ran at several γ at one temperature; the table pairs "
                             "one config per method")
    categories: dict[str, set[str]] = {}
    for r in rows:
        categories.setdefault(r["category"], set()).add(r["prompt_id"])
    categories["all"] = {p for ids in categories.values() for p in ids}
    head = ["category (prompts)", "T"]
    for o in over:
        head += [f"{method} / {o}", f"{method} / {o}, decoding"]
    head += [f"prefill share, {over[0]} / {method}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for temperature in sorted({r["temperature"] for r in rows}):
        for category, prompts in categories.items():
            chosen = [r for r in rows if r["temperature"] == temperature
                      and r["prompt_id"] in prompts]
            by_method: dict[str, list[Row]] = {}
            for r in chosen:
                by_method.setdefault(r["method"], []).append(r)
            mine = by_method.get(method, [])
            cells = [f"{category} ({len(prompts)})", f"{temperature:g}"]
            for o in over:
                theirs = by_method.get(o, [])
                cells += [_paired(mine, theirs, throughput),
                          _paired(mine, theirs, decode_throughput)]
            share = [_prefill_share(by_method.get(m, [])) for m in (over[0], method)]
            cells.append(" / ".join(share))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("results", type=Path, help="a bench run's results.jsonl")
    parser.add_argument("--method", default="block")
    parser.add_argument("--over", default="ar,llamacpp-ar",
                        help="comma-separated methods to divide by (the first gives the "
                             "prefill share)")
    args = parser.parse_args(argv)
    rows = [json.loads(line) for line in args.results.read_text().splitlines() if line.strip()]
    print(table(rows, args.method, args.over.split(",")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
