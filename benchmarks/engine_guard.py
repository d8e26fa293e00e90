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

    python benchmarks/engine_guard.py --baseline /path/to/older/checkout [--rounds 3]

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
    print(json.dumps({"ready": side}), flush=True)
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


def _start(side: str, src: Path, args: argparse.Namespace) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, __file__, "--worker", side, "--tokens", str(args.tokens),
           "--gamma", str(args.gamma), "--temperature", str(args.temperature)]
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    _read(proc, side)
    return proc


def _read(proc: subprocess.Popen[str], side: str) -> dict[str, Any]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise SystemExit(f"the {side} worker stopped (exit {proc.wait()})")
    return json.loads(line)


def _time(proc: subprocess.Popen[str], side: str, unit: dict[str, Any]) -> float:
    """Tokens per second of one unit on one side."""
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(unit) + "\n")
    proc.stdin.flush()
    done = _read(proc, side)
    return done["tokens"] / done["seconds"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", type=Path, help="an older verispec checkout (its src/ is used)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--worker", choices=["current", "baseline"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        _serve(args.worker, args.tokens, args.gamma, args.temperature)
        return
    if args.baseline is None:
        p.error("--baseline is required")
    srcs = {"baseline": args.baseline.resolve() / "src", "current": HERE / "src"}
    procs = {side: _start(side, src, args) for side, src in srcs.items()}
    units = [{"method": m, "prompt": i} for m in METHODS for i in range(len(PROMPTS))]
    units.append({"method": "batch"})
    speeds: dict[str, dict[str, list[tuple[str, float]]]] = {s: {} for s in procs}
    flip = 0
    for r in range(args.rounds):
        for unit in units:
            key = f"block B={BATCH}" if unit["method"] == "batch" else unit["method"]
            order = ("baseline", "current") if flip % 2 == 0 else ("current", "baseline")
            flip += 1
            prompt = "batch" if unit["method"] == "batch" else str(unit["prompt"])
            for side in order:
                speed = _time(procs[side], side, unit)
                speeds[side].setdefault(key, []).append((prompt, speed))
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr, flush=True)
    for proc in procs.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    _print_table(speeds)


def _print_table(speeds: dict[str, dict[str, list[tuple[str, float]]]]) -> None:
    print("| configuration | baseline tok/s | current tok/s | current / baseline "
          "(paired, 95% interval over prompts) |\n|---|---|---|---|")
    for key, base in speeds["baseline"].items():
        cur = speeds["current"][key]
        pairs = [(p, c / b) for (p, c), (_, b) in zip(cur, base, strict=True)]
        cell = format_interval(pairs)
        if len({p for p, _ in pairs}) == 1:
            mean = geomean_interval(pairs)[0]
            ratios = [r for _, r in pairs]
            cell = f"{mean:.3f} (one batch; rounds {min(ratios):.3f} to {max(ratios):.3f})"
        print(f"| {key} | {statistics.median(s for _, s in base):.2f} | "
              f"{statistics.median(s for _, s in cur):.2f} | {cell} |")


if __name__ == "__main__":
    main()
