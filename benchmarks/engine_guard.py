"""The engine's overhead against an older verispec checkout, side by side in one run.

Both sides run the same transformers float32 models (the embedded pair) through their own
engine: ``ar``, ``token`` and ``block`` on single prompts, and ``block`` on a batch of four
prompts. Each side is a long-lived worker process (both packages are named ``verispec``)
that loads its models once; the two workers take turns unit by unit (one prompt of one
method, or one batch), the side that goes first alternating, so a slow minute of a shared
machine hits both sides of a pair. Reported per configuration: the median tokens per
second of each side and the geometric mean of the paired ratios (current / baseline) with
a 95% Student-t interval over the prompts (``paired.py``: each prompt's rounds are
averaged in logs first, so rounds add no units). The batch is one unit whatever the number
of rounds: it has no interval over prompts, and the range of its per-round ratios is shown
instead.

    python benchmarks/engine_guard.py --baseline /path/to/older/checkout [--rounds 3] \
        [--out guard.json]
    python benchmarks/engine_guard.py --table guard.json   # the table again, from the file

``--out`` keeps every unit's tokens and seconds on both sides with the order they ran in,
the arguments, the machine, torch in each worker and both checkouts' commits
(``results_io.py``); ``--table`` prints the table from that file without running anything.

The older checkout must be a verispec whose API has ``generate(..., verifier=, dtype=)``
(before the precision knob); the current one is the checkout this file is in.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import results_io
from paired import format_interval, geomean_interval

HERE = Path(__file__).resolve().parents[1]
METHODS = ("ar", "token", "block")
BATCH = 4
PROMPTS = (
    "def quicksort(items):\n    \"\"\"Sort a list with quicksort.\"\"\"\n",
    "import json\n\ndef load_config(path):\n    \"\"\"Read a JSON config file.\"\"\"\n",
    "class Stack:\n    \"\"\"A last-in first-out stack.\"\"\"\n\n    def __init__(self):\n",
    "def is_prime(n: int) -> bool:\n    \"\"\"Return True if n is prime.\"\"\"\n",
)


def _serve(side: str, tokens: int, gamma: int, temperature: float) -> None:
    """Worker loop: load the pair once, then time each unit named on stdin."""
    import torch

    torch.manual_seed(0)
    api: Any = __import__("verispec.api", fromlist=["generate"])
    if side == "current":
        from verispec.models.loading import load_transformers

        target = load_transformers("qwen2.5-coder-1.5b-instruct", precision="float32")
        draft = load_transformers("qwen2.5-coder-0.5b-instruct", precision="float32")
        name = "method"
    else:
        from verispec.models.loading import load_model

        target = load_model("qwen2.5-coder-1.5b-instruct", dtype="float32")
        draft = load_model("qwen2.5-coder-0.5b-instruct", dtype="float32")
        name = "verifier"
    ids = [target.tokenizer.encode(p) for p in PROMPTS]
    api.generate(target, draft, ids[0], **{name: "block"}, gamma=gamma, max_new_tokens=8,
                 temperature=temperature)  # warm-up
    print(json.dumps({"ready": side, "torch": results_io.torch_info()}), flush=True)
    for line in sys.stdin:
        unit = json.loads(line)
        start = time.perf_counter()
        if unit["method"] == "batch":
            batch = api.generate_batch(target, draft, ids[:BATCH], **{name: "block"},
                                       gamma=gamma, temperature=temperature,
                                       seeds=list(range(BATCH)), max_new_tokens=tokens,
                                       batch_size=BATCH)
            made = sum(len(r.tokens) for r in batch.results)
        else:
            i, method = unit["prompt"], unit["method"]
            result = api.generate(target, draft, ids[i], **{name: method},
                                  gamma=None if method == "ar" else gamma,
                                  temperature=temperature, seed=i, max_new_tokens=tokens)
            made = len(result.tokens)
        print(json.dumps({"tokens": made, "seconds": time.perf_counter() - start}), flush=True)


def _start(side: str, src: Path,
           args: argparse.Namespace) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """A worker of ``side`` with its models loaded, and its ready line."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, __file__, "--worker", side, "--tokens", str(args.tokens),
           "--gamma", str(args.gamma), "--temperature", str(args.temperature)]
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    return proc, _read(proc, side)


def _read(proc: subprocess.Popen[str], side: str) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"the {side} worker stopped (exit {proc.wait()})")
    out: dict[str, Any] = json.loads(line)
    return out


def _time(proc: subprocess.Popen[str], side: str, unit: dict[str, Any]) -> dict[str, Any]:
    """One unit on one side: its tokens and seconds."""
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(unit) + "\n")
    proc.stdin.flush()
    return _read(proc, side)


def _pairs(procs: dict[str, subprocess.Popen[str]], rounds: int) -> list[dict[str, Any]]:
    """Every unit of every round on both sides, the side going first alternating."""
    units = [{"method": m, "prompt": i} for m in METHODS for i in range(len(PROMPTS))]
    units.append({"method": "batch"})
    done: list[dict[str, Any]] = []
    flip = 0
    for r in range(rounds):
        for unit in units:
            order = ["baseline", "current"] if flip % 2 == 0 else ["current", "baseline"]
            flip += 1
            key = f"block B={BATCH}" if unit["method"] == "batch" else unit["method"]
            prompt = "batch" if unit["method"] == "batch" else str(unit["prompt"])
            entry: dict[str, Any] = {"round": r, "config": key, "prompt": prompt,
                                     "order": order}
            for side in order:
                entry[side] = _time(procs[side], side, unit)
            done.append(entry)
        print(f"round {r + 1} of {rounds} done", file=sys.stderr, flush=True)
    return done


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Both workers through every round: the record ``--out`` keeps and the table is
    computed from."""
    srcs = {"baseline": args.baseline.resolve() / "src", "current": HERE / "src"}
    started = {side: _start(side, src, args) for side, src in srcs.items()}
    procs = {side: proc for side, (proc, _) in started.items()}
    units = _pairs(procs, args.rounds)
    for proc in procs.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    rec = results_io.record(__file__, args, started["current"][1]["torch"], args.baseline)
    rec["baseline"]["torch"] = started["baseline"][1]["torch"]
    rec.update({"methods": list(METHODS), "batch": BATCH, "prompts": list(PROMPTS),
                "units": units})
    return rec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", type=Path, help="an older verispec checkout (its src/ is used)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--out", help="write every unit's measurements and the machine as JSON")
    p.add_argument("--table", help="print the table of a JSON file written by --out (no run)")
    p.add_argument("--worker", choices=["current", "baseline"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.table:
        print(table(results_io.read(args.table)))
        return
    if args.worker:
        _serve(args.worker, args.tokens, args.gamma, args.temperature)
        return
    if args.baseline is None:
        p.error("--baseline is required")
    results_io.measure_and_print(args.out, lambda: measure(args), table)


def table(rec: dict[str, Any]) -> str:
    """The table of a record (a run's, or one read back from ``--out``'s file)."""
    speeds: dict[str, dict[str, list[tuple[str, float]]]] = {"baseline": {}, "current": {}}
    for unit in rec["units"]:
        for side, by_config in speeds.items():
            speed = unit[side]["tokens"] / unit[side]["seconds"]
            by_config.setdefault(unit["config"], []).append((unit["prompt"], speed))
    lines = ["| configuration | baseline tok/s | current tok/s | current / baseline "
             "(paired, 95% interval over prompts) |", "|---|---|---|---|"]
    for key, base in speeds["baseline"].items():
        cur = speeds["current"][key]
        pairs = [(p, c / b) for (p, c), (_, b) in zip(cur, base, strict=True)]
        cell = format_interval(pairs)
        if len({p for p, _ in pairs}) == 1:
            mean = geomean_interval(pairs)[0]
            ratios = [r for _, r in pairs]
            cell = f"{mean:.3f} (one batch; rounds {min(ratios):.3f} to {max(ratios):.3f})"
        lines.append(f"| {key} | {statistics.median(s for _, s in base):.2f} | "
                     f"{statistics.median(s for _, s in cur):.2f} | {cell} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
