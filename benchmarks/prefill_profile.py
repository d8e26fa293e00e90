"""Where the int8 target's prompt reading spends its time: the first N HumanEval prompts,
each read in its own one-row pass as the server reads arriving prompts, timed and then
profiled (``torch.profiler``, operators by self CPU time).

    python benchmarks/prefill_profile.py [--prompts 8] [--rows 14]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from torch.profiler import ProfilerActivity, profile

from verispec.api import encode_prompt, load_pair
from verispec.bench.measure import machine_description
from verispec.bench.suites import load_suite
from verispec.models.base import CausalLM

TARGET = "qwen2.5-coder-1.5b-instruct"
WARMUP = 2


def read_all(target: CausalLM, prompts: Sequence[list[int]]) -> None:
    """Each prompt read by a fresh copy of the target (one exact single-row prefill)."""
    for ids in prompts:
        target.spawn().add_rows([ids])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=8, help="the first N HumanEval prompts")
    p.add_argument("--rows", type=int, default=14, help="operators shown")
    args = p.parse_args(argv)
    target = load_pair(TARGET, None, needs_draft=False).target
    prompts = [encode_prompt(target, x.text) for x in load_suite("humaneval")[:args.prompts]]
    read_all(target, prompts[:WARMUP])
    start = time.perf_counter()
    read_all(target, prompts)
    seconds = time.perf_counter() - start
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        read_all(target, prompts)
    tokens = sum(len(ids) for ids in prompts)
    print(f"{machine_description()}\n{len(prompts)} prompts, {tokens} tokens, read in "
          f"{seconds:.3f} s ({1e3 * seconds / tokens:.2f} ms per token)\n")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
