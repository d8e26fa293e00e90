"""Offline ``generate_batch`` with γ auto against ``ar`` and fixed γ at one batch size.

The embedded pair (int8 where the CPU allows it), the first 8 HumanEval prompts, every
prompt decoding exactly ``--tokens`` tokens (EOS ignored), seeds 0..7, each configuration
once in this order after one short warm-up call:

    python benchmarks/batch_gamma.py --batch 8 --temperature 0 --tokens 64 --gammas 2,4

Prints tokens per second (all rows' tokens over the call's wall time, prompt reading
included) and the number of batched target passes per configuration, then γ auto over the
best of the others. One run per configuration: no intervals; run it again for the spread.
"""

from __future__ import annotations

import argparse
import time

import torch

from verispec.api import generate_batch, load_pair
from verispec.bench.suites import load_suite
from verispec.models.fetch import DEFAULT_DRAFT, DEFAULT_TARGET

PROMPTS = 8


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--gammas", default="2,4", help="fixed γ values besides auto and ar")
    args = p.parse_args()
    torch.set_num_threads(2)
    pair = load_pair(DEFAULT_TARGET, DEFAULT_DRAFT)
    prompts = [x.text for x in load_suite("humaneval", PROMPTS)]
    configs: list[tuple[str, int | str]] = [("ar", 0), ("block", "auto")]
    configs += [("block", int(g)) for g in args.gammas.split(",") if g]
    generate_batch(pair.target, pair.draft, prompts[:2], method="block", gamma="auto",
                   temperature=args.temperature, max_new_tokens=4, batch_size=2)  # warm-up
    rates: dict[str, float] = {}
    for method, gamma in configs:
        start = time.perf_counter()
        out = generate_batch(pair.target, pair.draft, prompts, method=method, gamma=gamma,
                             temperature=args.temperature, seeds=list(range(PROMPTS)),
                             max_new_tokens=args.tokens, batch_size=args.batch,
                             ignore_eos=True)
        wall = time.perf_counter() - start
        name = "ar" if method == "ar" else f"block γ={gamma}"
        rates[name] = sum(len(r.tokens) for r in out.results) / wall
        print(f"B={args.batch} T={args.temperature:g} {name}: {rates[name]:.2f} tok/s, "
              f"{out.stats.target_passes} target passes", flush=True)
    auto = rates.pop("block γ=auto")
    best = max(rates, key=rates.__getitem__)
    print(f"γ auto / best other ({best}): {auto / rates[best]:.3f}")


if __name__ == "__main__":
    main()
