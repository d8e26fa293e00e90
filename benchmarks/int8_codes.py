"""The int8 target's passes with its activation codes made by verispec's fused kernel
(:mod:`verispec.models.native.codes_kernel`) and by torch operators, side by side in one
process: the two alternate pass by pass (which goes first alternates by round), so a drift of
the host's speed falls on both. Passes: one-token steps of 1, 4 and 8 rows, verification
passes of 8 rows × 5 tokens and 1 row × 9 tokens (each after the first HumanEval prompts),
and the first HumanEval prompt read in one pass.

    python benchmarks/int8_codes.py [--rounds 15] --out int8-codes.json
    python benchmarks/int8_codes.py --table int8-codes.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import results_io
import torch

from verispec.api import encode_prompt, load_pair
from verispec.bench.measure import machine_description
from verispec.bench.suites import load_suite
from verispec.models.base import CausalLM
from verispec.models.native import codes_kernel
from verispec.models.native.linear import Int8Linear
from verispec.models.native.weights import int8_layers

TARGET = "qwen2.5-coder-1.5b-instruct"
PATHS = ("torch operators", "fused kernel")
#: (rows, tokens per row) of the decoding passes; "prompt" reads the first prompt
PASSES: tuple[tuple[int, int], ...] = ((1, 1), (4, 1), (8, 1), (1, 9), (8, 5))
WARMUP = 3


def _use(layers: list[Int8Linear], fused: bool) -> None:
    for layer in layers:
        layer._fused = fused


def _step(target: CausalLM, rows: int, k: int) -> Callable[[], None]:
    """One pass of k tokens on each of ``rows`` rows, rolled back after (lengths fixed)."""
    model = target.spawn()
    model.add_rows([encode_prompt(model, x.text) for x in load_suite("humaneval")[:rows]])
    lengths, tokens = model.lengths, [[100] * k for _ in range(rows)]

    def run() -> None:
        model.extend(tokens, check=False)
        model.rollback(lengths)
    return run


def _read(target: CausalLM) -> tuple[Callable[[], None], int]:
    ids = encode_prompt(target, load_suite("humaneval")[0].text)
    return (lambda: target.spawn().add_rows([ids])), len(ids)


def measure(rounds: int) -> dict[str, Any]:
    target = load_pair(TARGET, None, needs_draft=False).target
    layers = int8_layers(target.net)  # type: ignore[attr-defined]
    if not codes_kernel.available() or not all(x._fused for x in layers):
        raise SystemExit(f"the fused kernel does not run every layer here: "
                         f"{codes_kernel.status()}")
    read, prompt_tokens = _read(target)
    runs = {f"{r} × {k}": _step(target, r, k) for r, k in PASSES}
    runs[f"prompt read ({prompt_tokens} tokens)"] = read
    times: dict[str, dict[str, list[float]]] = {n: {p: [] for p in PATHS} for n in runs}
    for i in range(WARMUP + rounds):
        for name, run in runs.items():
            for fused in ((False, True) if i % 2 == 0 else (True, False)):
                _use(layers, fused)
                start = time.perf_counter()
                run()
                if i >= WARMUP:
                    times[name][PATHS[fused]].append(1e3 * (time.perf_counter() - start))
    _use(layers, True)
    return {"machine": machine_description(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "codes_kernel": codes_kernel.status(),
            "rounds": rounds, "command": f"python benchmarks/int8_codes.py --rounds {rounds}",
            "passes": times}


def table(data: dict[str, Any]) -> str:
    lines = [f"{data['machine']}; torch {data['torch']}, {data['threads']} threads; "
             f"{data['codes_kernel']}; medians of {data['rounds']} rounds", "",
             "| pass (rows × tokens) | " + " | ".join(f"{p} (ms)" for p in PATHS)
             + " | torch / fused: median of the rounds' ratios [min, max] |",
             "|---|---|---|---|"]
    for name, by_path in data["passes"].items():
        slow, fast = (by_path[p] for p in PATHS)
        ratios = [a / b for a, b in zip(slow, fast)]
        lines.append(f"| {name} | {statistics.median(slow):.1f} | {statistics.median(fast):.1f} "
                     f"| {statistics.median(ratios):.3f}× [{min(ratios):.3f}, "
                     f"{max(ratios):.3f}] |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=15, help="passes per path and kind")
    p.add_argument("--out", help="write the times as JSON")
    p.add_argument("--table", help="print the table of a written file")
    args = p.parse_args(argv)
    if args.table:
        print(table(results_io.read(args.table)))
        return 0
    results_io.measure_and_print(args.out, lambda: measure(args.rounds), table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
