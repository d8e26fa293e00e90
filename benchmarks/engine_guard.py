"""The engine's overhead against an older verispec checkout, side by side in one run.

Both sides run the same transformers float32 models (the embedded pair) through their own
engine: ``ar``, ``token`` and ``block`` on single prompts, and ``block`` on a batch of four
prompts. Each side runs in its own process (both packages are named ``verispec``); the
sides alternate round by round, so slow phases of the machine hit both. Reported: median
tokens per second of each side, and their ratio.

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

HERE = Path(__file__).resolve().parents[1]
METHODS = ("ar", "token", "block")
BATCH = 4
PROMPTS = (
    "def quicksort(items):\n    \"\"\"Sort a list with quicksort.\"\"\"\n",
    "import json\n\ndef load_config(path):\n    \"\"\"Read a JSON config file.\"\"\"\n",
    "class Stack:\n    \"\"\"A last-in first-out stack.\"\"\"\n\n    def __init__(self):\n",
    "def is_prime(n: int) -> bool:\n    \"\"\"Return True if n is prime.\"\"\"\n",
)


def _worker(side: str, tokens: int, gamma: int, temperature: float) -> dict[str, float]:
    """Tokens per second of each configuration on this side (run inside its process)."""
    import torch

    torch.manual_seed(0)
    api = __import__("verispec.api", fromlist=["generate"])
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
    out: dict[str, float] = {}
    api.generate(target, draft, ids[0], **{name: "block"}, gamma=gamma, max_new_tokens=8,
                 temperature=temperature)  # warm-up
    for method in METHODS:
        made, spent = 0, 0.0
        for i, prompt in enumerate(ids):
            start = time.perf_counter()
            result = api.generate(target, draft, prompt, **{name: method},
                                  gamma=None if method == "ar" else gamma,
                                  temperature=temperature, seed=i, max_new_tokens=tokens)
            spent += time.perf_counter() - start
            made += len(result.tokens)
        out[method] = made / spent
    start = time.perf_counter()
    batch = api.generate_batch(target, draft, ids[:BATCH], **{name: "block"}, gamma=gamma,
                               temperature=temperature, seeds=list(range(BATCH)),
                               max_new_tokens=tokens, batch_size=BATCH)
    out[f"block B={BATCH}"] = sum(len(r.tokens) for r in batch.results) / (
        time.perf_counter() - start)
    return out


def _run_side(side: str, src: Path, args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [sys.executable, __file__, "--worker", side, "--tokens", str(args.tokens),
           "--gamma", str(args.gamma), "--temperature", str(args.temperature)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{side} side failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


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
        print(json.dumps(_worker(args.worker, args.tokens, args.gamma, args.temperature)))
        return
    if args.baseline is None:
        p.error("--baseline is required")
    sides = {"baseline": args.baseline.resolve() / "src", "current": HERE / "src"}
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in sides}
    for r in range(args.rounds):
        for side in (("baseline", "current") if r % 2 == 0 else ("current", "baseline")):
            runs[side].append(_run_side(side, sides[side], args))
            print(f"round {r + 1} {side}: " + ", ".join(
                f"{k} {v:.2f}" for k, v in runs[side][-1].items()), file=sys.stderr, flush=True)
    print("| configuration | baseline tok/s | current tok/s | current / baseline |\n"
          "|---|---|---|---|")
    for key in runs["current"][0]:
        base = statistics.median(x[key] for x in runs["baseline"])
        cur = statistics.median(x[key] for x in runs["current"])
        print(f"| {key} | {base:.2f} | {cur:.2f} | {cur / base:.3f} |")


if __name__ == "__main__":
    main()
