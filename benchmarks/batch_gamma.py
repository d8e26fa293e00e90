"""Offline ``generate_batch`` with γ auto against ``ar`` and fixed γ at one batch size.

The embedded pair (int8 where the CPU allows it), the first 8 HumanEval prompts, every
prompt decoding exactly ``--tokens`` tokens (EOS ignored), each configuration in
``--repeats`` rounds (round r starts its rotation of the configurations at the r-th, so no
configuration always runs first) after one short warm-up call at the same batch size (which
times γ auto's pass-cost grid for it, once per machine). Round r samples with seeds
8r..8r+7 (``--seeds per-round``, the default) or every round with seeds 0..7 (``--seeds
fixed``). At T > 0 a configuration's throughput depends on the text it samples, and
different γ sample different texts from the same seeds: with fixed seeds every round of a
fixed-γ configuration times the same texts again while γ auto, whose choices follow the
measured times, samples new ones; fresh seeds per round make every configuration's rounds
samples of its texts alike (at T = 0 the texts do not depend on the seeds):

    python benchmarks/batch_gamma.py --batch 8 --temperature 0 --tokens 64 --gammas 2,4 --repeats 3

Prints tokens per second (all rows' tokens over the call's wall time, prompt reading
included) and the number of batched target passes per configuration and round, the median
per configuration (with where its seconds went: the target's prompt reading, the draft's
steps with its own readings of the prompts, the target's passes, verification), and γ auto
over the best of the others in the same round (geometric mean over the rounds, and each
round's ratio), and γ auto's tokens per second over all rounds against the best other's
(every configuration decodes the same tokens per round: all rows' tokens over all the
rounds' seconds); ``--out FILE`` keeps the rounds and the machine as JSON, ``--report FILE``
prints the same summary from such a file.

At B = 1 it also prices every iteration at the start-up grid's time for its γ (the pass
costs γ auto plans with, read from verispec's cache) and prints each configuration's tokens
per grid-priced second over all rounds: the host's speed swings, the engine's own time and
the prompt readings left out, what remains is how many tokens each configuration's choices
of γ delivered for the passes they cost.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from verispec.api import generate_batch, load_pair
from verispec.bench.measure import machine_description
from verispec.bench.suites import load_suite
from verispec.engine.costs import PassCosts
from verispec.engine.stats import Stats
from verispec.models.fetch import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.plan import pair_costs

PROMPTS = 8


def run(args: argparse.Namespace) -> dict:
    """Every configuration in ``args.repeats`` rotated rounds: the record ``--out`` keeps."""
    torch.set_num_threads(2)
    pair = load_pair(DEFAULT_TARGET, DEFAULT_DRAFT)
    prompts = [x.text for x in load_suite("humaneval", PROMPTS)]
    configs: list[tuple[str, int | str]] = [("ar", 0), ("block", "auto")]
    configs += [("block", int(g)) for g in args.gammas.split(",") if g]
    # warm-up at the timed batch size: γ auto's pass-cost grid for it (timed once per machine
    # and kept on disk) is measured here, not inside the first timed call
    generate_batch(pair.target, pair.draft, prompts[:args.batch], method="block", gamma="auto",
                   temperature=args.temperature, max_new_tokens=4, batch_size=args.batch)
    costs = pair_costs(pair.target, pair.draft, 1) if args.batch == 1 else None  # γ auto's
    rounds: list[dict[str, dict[str, float]]] = []
    seeds = [[PROMPTS * (r if args.seeds == "per-round" else 0) + i for i in range(PROMPTS)]
             for r in range(args.repeats)]
    for r in range(args.repeats):
        cells: dict[str, dict[str, float]] = {}
        for method, gamma in configs[r % len(configs):] + configs[:r % len(configs)]:
            start = time.perf_counter()
            out = generate_batch(pair.target, pair.draft, prompts, method=method, gamma=gamma,
                                 temperature=args.temperature, seeds=seeds[r],
                                 max_new_tokens=args.tokens, batch_size=args.batch,
                                 ignore_eos=True)
            wall = time.perf_counter() - start
            name = "ar" if method == "ar" else f"block γ={gamma}"
            stats = out.stats
            phases = {"prefill": stats.prefill_time_s, "draft": stats.draft_time_s,
                      "target": stats.target_time_s, "verify": stats.verify_time_s}
            cells[name] = {"tokens_per_s": sum(len(res.tokens) for res in out.results) / wall,
                           "target_passes": stats.target_passes, "wall_s": wall,
                           "phases_s": phases}
            if costs is not None:
                cells[name]["grid_priced_s"] = grid_priced_seconds(stats, costs)
            print(f"round {r + 1} B={args.batch} T={args.temperature:g} {name}: "
                  f"{cells[name]['tokens_per_s']:.2f} tok/s, "
                  f"{out.stats.target_passes} target passes", flush=True)
        rounds.append(cells)
    return {"config": {k: v for k, v in vars(args).items() if k not in ("out", "report")},
            "prompts": PROMPTS, "machine": machine_description(),
            "command": "python benchmarks/batch_gamma.py " + " ".join(
                f"--{k} {v}" for k, v in vars(args).items() if k not in ("out", "report")),
            "seeds": seeds, "rounds": rounds}


def grid_priced_seconds(stats: Stats, costs: PassCosts) -> float:
    """The seconds a single-row run's decoding iterations cost at the start-up grid's
    prices (:meth:`PassCosts.iteration` of each iteration's γ, from the run's counts of
    iterations that drafted at least i tokens): its throughput with the host's speed
    swings, the engine's own time and the prompt readings left out, so that configurations
    compare by the tokens their choices of γ deliver per priced second."""
    at_least = [stats.iterations, *stats.drafted_by_position, 0]  # iterations drafting ≥ i
    return sum((at_least[d] - at_least[d + 1]) * costs.iteration(d)
               for d in range(len(at_least) - 1))


def summarize(record: dict) -> None:
    """The medians per configuration and γ auto over the best other in the same round."""
    rounds = record["rounds"]
    ratios = []
    for cells in rounds:
        others = [c["tokens_per_s"] for k, c in cells.items() if k != "block γ=auto"]
        ratios.append(cells["block γ=auto"]["tokens_per_s"] / max(others))
    config = record["config"]
    print(f"B={config['batch']} T={config['temperature']:g}, {config['tokens']} tokens, "
          f"{len(rounds)} rounds; {record['machine']}")
    if record.get("note"):  # how a run differed from what its command says
        print(record["note"])
    for name in rounds[0]:
        rates = [x[name]["tokens_per_s"] for x in rounds]
        passes = sorted({x[name]["target_passes"] for x in rounds})
        print(f"{name}: median {statistics.median(rates):.2f} tok/s (rounds "
              + ", ".join(f"{x:.2f}" for x in rates) + f"), target passes {passes}")
        if all("phases_s" in x[name] for x in rounds):  # records from before lack them
            split = {k: statistics.median(x[name]["phases_s"][k] for x in rounds)
                     for k in rounds[0][name]["phases_s"]}
            wall = statistics.median(x[name]["wall_s"] for x in rounds)
            print("  seconds (medians): wall %.2f, " % wall + ", ".join(
                f"{k} {v:.2f}" for k, v in split.items()))
    if all("grid_priced_s" in c for x in rounds for c in x.values()):
        priced = {name: sum(x[name]["tokens_per_s"] * x[name]["wall_s"] for x in rounds)
                  / sum(x[name]["grid_priced_s"] for x in rounds) for name in rounds[0]}
        best = max((k for k in priced if k != "block γ=auto"), key=priced.__getitem__)
        print("tokens per grid-priced second, all rounds (the host's speed left "
              "out): " + ", ".join(f"{k} {v:.2f}" for k, v in priced.items())
              + f"; γ auto / {best} = {priced['block γ=auto'] / priced[best]:.3f}")
    print(f"γ auto / best other in the same round: geometric mean "
          f"{statistics.geometric_mean(ratios):.3f} (rounds: "
          + ", ".join(f"{x:.3f}" for x in ratios) + ")")
    pooled = {name: sum(x[name]["tokens_per_s"] * x[name]["wall_s"] for x in rounds)
              / sum(x[name]["wall_s"] for x in rounds)
              for name in rounds[0] if all("wall_s" in x[name] for x in rounds)}
    if "block γ=auto" in pooled and len(pooled) > 1:
        best = max((k for k in pooled if k != "block γ=auto"), key=pooled.__getitem__)
        print(f"over all rounds ({'seeds per round' if _fresh_seeds(record) else 'seeds 0..7'}"
              f"): γ auto {pooled['block γ=auto']:.2f} tok/s / {best} {pooled[best]:.2f} = "
              f"{pooled['block γ=auto'] / pooled[best]:.3f}")


def _fresh_seeds(record: dict) -> bool:
    """Whether the rounds sampled with different seeds (records from before kept none)."""
    seeds = record.get("seeds") or [[]]
    return any(s != seeds[0] for s in seeds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--gammas", default="2,4", help="fixed γ values besides auto and ar")
    p.add_argument("--repeats", type=int, default=1,
                   help="rounds of every configuration (round r starts at the r-th)")
    p.add_argument("--seeds", choices=("per-round", "fixed"), default="per-round",
                   help="round r samples with seeds 8r..8r+7, or every round with 0..7")
    p.add_argument("--out", default="", help="write the rounds as JSON here")
    p.add_argument("--report", default="",
                   help="print the summary of a JSON written by --out (nothing is run)")
    args = p.parse_args()
    if args.report:
        with open(args.report) as f:
            summarize(json.load(f))
        return
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    record = run(args)
    summarize(record)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
