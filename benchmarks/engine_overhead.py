"""The engine's own cost per iteration: everything outside the model passes.

Stand-in models with the embedded pair's vocabulary (151,936 ids) whose passes cost
almost nothing (fixed float32 logits, a target and a draft law that differ) run
``generate_batch`` with B rows; the stand-ins time their own passes, and the rest of the
wall time, divided by the batched target passes, is the engine's overhead per iteration:
drafting bookkeeping, gathering p and q, verification, sampling, row admission and
retirement.

    python benchmarks/engine_overhead.py [--batch 8] [--method block] [--gamma 4]
    python benchmarks/engine_overhead.py --baseline /path/to/older/checkout --rounds 5
    python benchmarks/engine_overhead.py --baseline ... --same-allocator

With ``--baseline`` each round runs the older checkout and this one in turn (fresh
processes, the one going first alternating) and the table pairs them round by round.
The engine sets glibc's malloc to reuse freed blocks (:mod:`verispec.engine.memory`); an
older engine may not, so ``--same-allocator`` gives both processes those settings through
``GLIBC_TUNABLES``, separating the allocator's share of a difference from the code's.
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

HERE = Path(__file__).resolve()
VOCAB = 151_936  # the embedded pair's vocabulary


def _measure(args: argparse.Namespace) -> dict[str, float]:
    import torch

    from verispec.api import generate_batch
    from verispec.models.toy import TableLM

    class FixedLM(TableLM):
        """Every position has the same float32 logits; passes are timed."""

        def __init__(self, seed: int) -> None:
            super().__init__(VOCAB, name=f"fixed-{seed}")
            g = torch.Generator().manual_seed(seed)
            self.logits = torch.randn(VOCAB, generator=g) * 3  # [V]
            self.pass_s = 0.0

        def _add_rows(self, prefixes: list[list[int]]) -> None:
            start = time.perf_counter()
            super()._add_rows(prefixes)
            self.pass_s += time.perf_counter() - start

        def _extend(self, tokens: list[list[int]], num_logits: int) -> torch.Tensor:
            start = time.perf_counter()
            for row, new in zip(self._rows, tokens, strict=True):
                row.extend(new)
            out = self.logits.expand(len(tokens), num_logits, VOCAB)  # [R, n, V]
            self.pass_s += time.perf_counter() - start
            return out

    torch.set_num_threads(2)
    target, draft = FixedLM(1), FixedLM(2)
    draft.logits = 0.7 * target.logits + 0.3 * draft.logits  # a draft close to the target
    prompts = [[(7 * i + j) % 1000 for j in range(16)] for i in range(args.batch)]
    kw = {"method": args.method, "gamma": args.gamma, "temperature": args.temperature,
          "max_new_tokens": args.tokens, "batch_size": args.batch, "ignore_eos": True}
    generate_batch(target, draft, prompts[:2], **{**kw, "max_new_tokens": 4})  # warm up
    target.pass_s = draft.pass_s = 0.0
    start = time.perf_counter()
    out = generate_batch(target, draft, prompts, **kw)
    wall = time.perf_counter() - start
    passes = out.stats.target_passes
    return {"wall_s": wall, "model_s": target.pass_s + draft.pass_s, "passes": passes,
            "overhead_ms": (wall - target.pass_s - draft.pass_s) / passes * 1e3,
            "tokens": sum(len(r.tokens) for r in out.results)}


def _run(checkout: Path | None, argv: list[str], same_allocator: bool) -> dict[str, float]:
    env = dict(os.environ)
    if same_allocator:
        from verispec.engine.memory import MMAP_THRESHOLD, TRIM_THRESHOLD

        env["GLIBC_TUNABLES"] = (f"glibc.malloc.mmap_threshold={MMAP_THRESHOLD}:"
                                 f"glibc.malloc.trim_threshold={TRIM_THRESHOLD}")
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout / "src")
    done = subprocess.run([sys.executable, str(HERE), "--json", *argv], env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--method", default="block")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--baseline", type=Path, default=None,
                   help="an older verispec checkout to pair with this one")
    p.add_argument("--same-allocator", action="store_true",
                   help="give both sides the engine's malloc settings through GLIBC_TUNABLES")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.json:
        print(json.dumps(_measure(args)))
        return
    argv = [f"--batch={args.batch}", f"--method={args.method}", f"--gamma={args.gamma}",
            f"--temperature={args.temperature}", f"--tokens={args.tokens}"]
    sides: dict[str, Path | None] = {"this": HERE.parents[1]}
    if args.baseline is not None:
        sides = {"baseline": args.baseline.resolve(), **sides}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for name in order:
            runs[name].append(_run(sides[name], argv, args.same_allocator))
    print(f"B = {args.batch}, {args.method}, γ = {args.gamma}, T = {args.temperature:g}, "
          f"{args.tokens} tokens per row, {args.rounds} rounds"
          + (", both sides with the engine's malloc settings" if args.same_allocator else ""))
    print("| engine | overhead per iteration, ms (median) | rounds | target passes |")
    print("|---|---|---|---|")
    for name, rs in runs.items():
        ms = [x["overhead_ms"] for x in rs]
        print(f"| {name} | {statistics.median(ms):.1f} | {', '.join(f'{m:.1f}' for m in ms)} "
              f"| {int(rs[0]['passes'])} |")
    if args.baseline is not None:
        ratios = [b["overhead_ms"] / a["overhead_ms"]
                  for a, b in zip(runs["baseline"], runs["this"], strict=True)]
        print(f"\nthis / baseline per round: {', '.join(f'{x:.2f}' for x in ratios)} "
              f"(median {statistics.median(ratios):.2f})")


if __name__ == "__main__":
    main()
