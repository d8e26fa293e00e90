"""Per-category speed-ups of one method over others from a ``verispec bench`` run, as run
and over the decoding alone, with the prefill's share of the time.

    python benchmarks/categories.py main/results.jsonl --method block --over ar,llamacpp-ar

"As run" is tokens / seconds (prefill included), "decoding" is tokens / (seconds − prefill
seconds): everything after the target has read the prompt, so a draft's own reading of the
prompt counts as decoding. llama.cpp reports no prefill time, so its rows have no decoding
figure. Ratios are paired per prompt (same prompt, temperature and seed), geometric means
with 95% Student-t intervals over prompts (the bench's own ``paired_ratio_ci``).
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from verispec.bench.metrics import paired_ratio_ci

Row = dict[str, Any]


def _speed(row: Row) -> float:
    return row["tokens"] / row["seconds"]


def _decoding(row: Row) -> float | None:
    prefill = row.get("prefill_time_s")
    if prefill is None or row["method"].startswith("llamacpp"):
        return None
    return row["tokens"] / (row["seconds"] - prefill)


def _paired(runs: dict[tuple[str, float], dict[str, Row]], method: str, over: str,
            temperature: float, prompts: set[str], metric: Callable[[Row], float | None],
            ) -> str:
    logs = []
    for (prompt, t), by_method in runs.items():
        if t != temperature or prompt not in prompts or method not in by_method \
                or over not in by_method:
            continue
        a, b = metric(by_method[method]), metric(by_method[over])
        if a is not None and b is not None:
            logs.append(math.log(a / b))
    mean, ci = paired_ratio_ci(logs)
    if mean is None:
        return "–"
    return f"{mean:.2f}× [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else f"{mean:.2f}×"


def _prefill_share(rows: list[Row]) -> str:
    shares = [r["prefill_time_s"] / r["seconds"] for r in rows
              if r.get("prefill_time_s") is not None]
    return f"{100 * sum(shares) / len(shares):.0f}%" if shares else "–"


def table(rows: list[Row], method: str, over: Sequence[str]) -> str:
    """The markdown table: one line per category (and all) and temperature."""
    runs: dict[tuple[str, float], dict[str, Row]] = defaultdict(dict)
    categories: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        runs[(r["prompt_id"], r["temperature"])][r["method"]] = r
        categories[r["category"]].add(r["prompt_id"])
    categories["all"] = {p for ids in categories.values() for p in ids}
    head = ["category (prompts)", "T"]
    for o in over:
        head += [f"{method} / {o}"] + ([f"{method} / {o}, decoding"]
                                       if not o.startswith("llamacpp") else [])
    head += [f"prefill share, {over[0]} / {method}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for temperature in sorted({t for _, t in runs}):
        for category, prompts in categories.items():
            cells = [f"{category} ({len(prompts)})", f"{temperature:g}"]
            for o in over:
                cells.append(_paired(runs, method, o, temperature, prompts, _speed))
                if not o.startswith("llamacpp"):
                    cells.append(_paired(runs, method, o, temperature, prompts, _decoding))
            share = [_prefill_share([r for r in rows if r["method"] == m
                                     and r["temperature"] == temperature
                                     and r["prompt_id"] in prompts]) for m in (over[0], method)]
            cells.append(" / ".join(share))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
