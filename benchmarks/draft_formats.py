"""The int8 draft against the weight-only int4 draft, side by side in one run.

The target is the int8 model in both cases (so ``ar`` and the output law are unchanged);
only the draft's weight format differs. Per prompt and temperature the two drafts run one
after the other (the one going first alternating), ``block`` with γ chosen by measurement.
Reported: the drafts' step costs (one pass of k tokens after a 200-token context, median of
7), and per temperature the tokens per second of each draft, their paired ratio (geometric
mean over prompts with a 95% Student-t interval over prompts, ``paired.py``) and the tokens
per target call.

    python benchmarks/draft_formats.py [--num-prompts 10] [--max-new-tokens 128]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from paired import format_interval

from verispec.api import generate
from verispec.bench.suites import encode, load_suite
from verispec.models.loading import load_model
from verispec.models.timing import pass_costs

PAIR = ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")
FORMATS = ("int8", "int4")
KS = (1, 2, 4)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-prompts", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperatures", default="0,1")
    args = p.parse_args()
    torch.set_num_threads(2)
    target = load_model(PAIR[0], precision="int8")
    drafts = {f: load_model(PAIR[1], precision=f, role="draft") for f in FORMATS}
    print("| draft | " + " | ".join(f"k = {k} (ms)" for k in KS) + " |\n|---|"
          + "---|" * len(KS))
    for f, d in drafts.items():
        ms = pass_costs(d, context=200, ks=KS, reps=7)
        print(f"| {f} | " + " | ".join(f"{ms[k] * 1e3:.1f}" for k in KS) + " |", flush=True)
    prompts = load_suite("humaneval", args.num_prompts)
    print("\n| T | int8 draft tok/s | int4 draft tok/s | int4 / int8 (paired, 95% interval) "
          "| tokens per target call, int8 / int4 |\n|---|---|---|---|---|")
    flip = 0
    for temperature in (float(t) for t in args.temperatures.split(",")):
        speed: dict[str, list[float]] = {f: [] for f in FORMATS}
        made: dict[str, int] = dict.fromkeys(FORMATS, 0)
        calls: dict[str, int] = dict.fromkeys(FORMATS, 0)
        for i, prompt in enumerate(prompts):
            ids = encode(prompt, target.tokenizer)
            for f in (FORMATS if flip % 2 == 0 else FORMATS[::-1]):
                start = time.perf_counter()
                r = generate(target, drafts[f], ids, method="block", gamma="auto",
                             temperature=temperature, seed=i,
                             max_new_tokens=args.max_new_tokens)
                speed[f].append(len(r.tokens) / (time.perf_counter() - start))
                made[f] += len(r.tokens)
                calls[f] += r.stats.target_calls
            flip += 1
        ratio = format_interval([(str(i), b / a) for i, (a, b)
                                 in enumerate(zip(speed["int8"], speed["int4"], strict=True))])
        print(f"| {temperature:g} | {statistics.median(speed['int8']):.2f} | "
              f"{statistics.median(speed['int4']):.2f} | {ratio} | "
              f"{made['int8'] / calls['int8']:.2f} / {made['int4'] / calls['int4']:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
