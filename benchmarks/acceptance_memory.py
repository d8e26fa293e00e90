"""How far back a request's own blocks predict its next one: γ auto's memory, measured.

Decodes the first ``--prompts`` HumanEval prompts alone at a fixed γ (block verification,
``--tokens`` tokens each with EOS ignored, seeds 8r + i in round r), keeps every request's
blocks in order (γ drafted, τ accepted), and asks of each full block (γ drafted): how well
did the estimate γ auto would have held just before it predict its tokens (τ + 1)? The
estimate is :class:`~verispec.engine.gamma.AcceptanceCounts` of the request's earlier
blocks, each weighing ``decay`` less per later block, with the pair's rates as the prior at
``PRIOR_WEIGHT`` positions; the pair's rates are the run's own pooled first and later
positions (what a pair's history holds once it has served such requests). Prints the mean
squared error of each decay relative to the prior alone (1: the request's blocks add
nothing; below 1: they help), so that ``ROW_DECAY`` is a measured choice:

    python benchmarks/acceptance_memory.py --temperature 1 --gamma 4 --rounds 3 \\
        --out docs/reports/acceptance-memory-t1-g4-epyc-zen4.json

``--report FILE`` evaluates a kept run again (nothing is decoded).
"""

from __future__ import annotations

import argparse
import json

import torch

from verispec.api import generate_batch, load_pair
from verispec.bench.measure import machine_description
from verispec.bench.suites import load_suite
from verispec.engine import gamma as gamma_module
from verispec.engine.costs import Acceptance
from verispec.engine.gamma import PRIOR_WEIGHT, ROW_DECAY, AcceptanceCounts
from verispec.models.fetch import DEFAULT_DRAFT, DEFAULT_TARGET

DECAYS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4)

Blocks = list[tuple[int, int]]  # one request's (drafted, accepted), in order


def decode(args: argparse.Namespace) -> list[Blocks]:
    """Every request's blocks, read from the fixed-γ policy as the engine reports them."""
    torch.set_num_threads(2)
    pair = load_pair(DEFAULT_TARGET, DEFAULT_DRAFT)
    prompts = [x.text for x in load_suite("humaneval", args.prompts)]
    current: Blocks = []
    report = gamma_module.FixedGamma.observe

    def observe(policy: gamma_module.FixedGamma, drafted: int, accepted: int) -> None:
        current.append((drafted, accepted))
        report(policy, drafted, accepted)

    gamma_module.FixedGamma.observe = observe  # type: ignore[method-assign]
    requests = []
    try:
        for r in range(args.rounds):
            for i, prompt in enumerate(prompts):
                current.clear()
                generate_batch(pair.target, pair.draft, [prompt], method="block",
                               gamma=args.gamma, temperature=args.temperature,
                               seeds=[len(prompts) * r + i], max_new_tokens=args.tokens,
                               batch_size=1, ignore_eos=True)
                requests.append(list(current))
                print(f"round {r + 1}, prompt {i + 1}: {len(current)} blocks", flush=True)
    finally:
        gamma_module.FixedGamma.observe = report  # type: ignore[method-assign]
    return requests


def pooled(requests: list[Blocks]) -> Acceptance:
    counts = AcceptanceCounts()
    for blocks in requests:
        for drafted, accepted in blocks:
            counts.observe(drafted, accepted)
    return Acceptance(counts.first_accepted / counts.first_tested,
                      counts.rest_accepted / counts.rest_tested)


def errors(requests: list[Blocks], gamma: int, prior: Acceptance,
           decay: float | None) -> tuple[float, int]:
    """Summed squared error of the predicted tokens of every full block, and their number;
    ``decay`` None: the prior alone."""
    total, n = 0.0, 0
    for blocks in requests:
        seen = AcceptanceCounts()
        for drafted, accepted in blocks:
            if drafted == gamma:
                guess = prior if decay is None else seen.estimate(prior, PRIOR_WEIGHT)
                total += (guess.tokens(gamma) - (accepted + 1)) ** 2
                n += 1
            seen.observe_recent(drafted, accepted, 1.0 if decay is None else decay)
    return total, n


def summarize(record: dict) -> None:
    requests = [[tuple(b) for b in blocks] for blocks in record["requests"]]
    gamma, prior = record["config"]["gamma"], pooled(requests)
    base, n = errors(requests, gamma, prior, None)
    print(f"T={record['config']['temperature']:g}, γ {gamma}: {len(requests)} requests, {n} "
          f"full blocks; pair's rates {prior.first:.3f} first, {prior.rest:.3f} later; "
          f"{record['machine']}")
    print(f"mean squared error of the prior alone: {base / n:.3f} tokens²")
    for decay in DECAYS:
        mark = " (ROW_DECAY)" if decay == ROW_DECAY else ""
        print(f"decay {decay:.1f}{mark}: {errors(requests, gamma, prior, decay)[0] / base:.3f}"
              " × the prior's")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--out", default="", help="keep the blocks and the machine as JSON here")
    p.add_argument("--report", default="", help="evaluate a JSON written by --out")
    args = p.parse_args()
    if args.report:
        with open(args.report) as f:
            summarize(json.load(f))
        return
    if args.gamma < 1 or args.rounds < 1 or args.prompts < 1:
        p.error("--gamma, --rounds and --prompts must be >= 1")
    config = {k: v for k, v in vars(args).items() if k not in ("out", "report")}
    record = {"config": config, "machine": machine_description(),
              "command": "python benchmarks/acceptance_memory.py " + " ".join(
                  f"--{k} {v}" for k, v in config.items()),
              "requests": decode(args)}
    summarize(record)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
