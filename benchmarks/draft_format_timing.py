"""How ``--precision auto`` should time the draft's formats: the draft's layers in int8 and
weight-only int4, one row, timed two ways (every layer with weights of its own, streamed as a
step reads them; and one layer per shape timed again and again from the cache, times its
count), beside the whole draft's one-token step in each format after a 200-token context
(median of 7). Rounds alternate the two ways so that a slower minute touches both.

    python benchmarks/draft_format_timing.py [--rounds 3] [--out timing.json]
    python benchmarks/draft_format_timing.py --table timing.json   # the table again
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from verispec.bench.measure import machine_description
from verispec.models.fetch import DEFAULT_DRAFT, model_path
from verispec.models.native import load_native
from verispec.models.native.linear import default_kernel, draft_layer_times
from verispec.models.timing import pass_costs

FORMATS = ("int8", "int4")
WAYS = ("layers, streamed", "layers, one per shape from the cache", "whole draft step")


def table(rounds: list[dict[str, dict[str, float]]]) -> str:
    lines = ["| round | timing | int8 (ms) | int4 (ms) | faster |", "|---|---|---|---|---|"]
    for i, r in enumerate(rounds, 1):
        for way in WAYS:
            ms = r[way]
            faster = min(FORMATS, key=lambda f: ms[f])
            lines.append(f"| {i} | {way} | {ms['int8']:.1f} | {ms['int4']:.1f} | {faster} |")
    return "\n".join(lines)


def _step_ms(fmt: str) -> float:
    # as drafts load: no run-time rotations
    model = load_native(model_path(DEFAULT_DRAFT, "hf"), fmt, online_rotations=False)
    return pass_costs(model, context=200, ks=(1,), reps=7)[1] * 1e3


def measure(rounds: int) -> list[dict[str, dict[str, float]]]:
    torch.set_num_threads(2)
    kernel = default_kernel()
    out = []
    for _ in range(rounds):
        streamed = draft_layer_times(kernel, streamed=True)
        cached = draft_layer_times(kernel, streamed=False)
        out.append({WAYS[0]: {f: streamed[f] * 1e3 for f in FORMATS},
                    WAYS[1]: {f: cached[f] * 1e3 for f in FORMATS},
                    WAYS[2]: {f: _step_ms(f) for f in FORMATS}})
        print("\n".join(table(out).splitlines()[-len(WAYS):]), flush=True)  # this round
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="write the rounds and the machine to this JSON file")
    ap.add_argument("--table", help="print the table of a JSON file written by --out")
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(Path(args.table).read_text())["rounds"]))
        return
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    rounds = measure(args.rounds)
    print(table(rounds))
    if args.out:
        record: dict[str, Any] = {
            "command": "python benchmarks/draft_format_timing.py " + " ".join(sys.argv[1:]),
            "machine": machine_description(), "kernel": str(default_kernel()), "rounds": rounds}
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
