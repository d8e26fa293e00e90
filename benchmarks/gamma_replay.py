"""γ auto against fixed γ without timing noise: greedy `block` replayed on the draft's matches.

At T = 0 a lossless method emits the target's greedy tokens, and a drafted token is kept
exactly when the draft's greedy guess after the same prefix equals the target's token. So the
greedy outputs of ``ar`` in a bench results file and one teacher-forced pass of the draft
over each of them give, per position, whether the draft's guess matches (``match[i]``). An
iteration starting at position i that drafts γ tokens keeps the run of matches from i, at
most γ, plus the target's own token; it costs γ draft steps and a target pass over γ + 1
tokens (the pass costs timed here, or given). Every policy below is replayed on the same
match sequences, prompt after prompt, with the pair's history carried along as the engine
carries it: γ auto once from no history (the first process of a pair) and once from the
history an earlier run over the same prompts recorded (as a later process reads it from
disk); the replay leaves out the engine's own time per iteration.

    python benchmarks/gamma_replay.py RESULTS.jsonl [--costs 99.7,118.7,143.3,193.4,37.8]

Prints the share of matching positions, then per policy (fixed γ and ``AutoGamma``) the
speed over ``ar``: the geometric mean over prompts of each prompt's ratio, as the bench
states its ratios.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from verispec.bench.suites import encode, load_suite
from verispec.engine.gamma import AutoGamma, FixedGamma, GammaPolicy, PairHistory, PassCosts
from verispec.models.base import CausalLM
from verispec.models.fetch import DEFAULT_DRAFT, DEFAULT_TARGET, model_path
from verispec.models.native import load_native
from verispec.models.timing import interleaved_costs, prefill_cost

KS = (1, 2, 4, 9)
FIXED = (2, 3, 4, 5, 6, 8)


def greedy_outputs(results: str) -> dict[str, list[int]]:
    """prompt id -> the tokens ``ar`` emitted at T = 0 in a bench results file."""
    rows = [json.loads(line) for line in open(results)]
    out = {r["prompt_id"]: r["output"] for r in rows
           if r["method"] == "ar" and r["temperature"] == 0.0}
    if not out:
        raise SystemExit(f"{results}: no `ar` rows at T = 0")
    return out


def draft_matches(outputs: dict[str, list[int]], draft: CausalLM,
                  tokenizer: Any) -> dict[str, tuple[int, list[bool]]]:
    """prompt id -> (prompt tokens, whether the draft's greedy guess equals each output token)."""
    prompts = {p.id: p for p in load_suite("humaneval")}
    found = {}
    for pid, output in outputs.items():
        ids = encode(prompts[pid], tokenizer)
        row = draft.spawn()
        row.add_rows([ids[:-1]])
        logits = row.extend([[ids[-1]] + output[:-1]])  # [1, n, V]: position j guesses output[j]
        guess = logits[0].argmax(-1).tolist()
        found[pid] = (len(ids), [g == t for g, t in zip(guess, output, strict=True)])
    return found


def replay(match: Sequence[bool], prompt: int, policy: GammaPolicy, costs: PassCosts) -> float:
    """Seconds to emit ``len(match)`` tokens under ``policy`` (model passes only)."""
    n, pos, seconds, read = len(match), 0, 0.0, False
    policy.start(prompt, n)
    while pos < n:
        gamma = min(policy.choose(), n - pos - 1)
        if gamma > 0 and not read:  # the draft reads the context at its first draft
            seconds += costs.draft_prefill * (prompt + pos)
            read = True
        kept = 0
        while kept < gamma and match[pos + kept]:
            kept += 1
        seconds += costs.iteration(gamma)
        policy.observe(gamma, kept)
        pos += kept + 1
    return seconds


def speedup(matches: dict[str, tuple[int, list[bool]]], costs: PassCosts,
            make: Callable[[PairHistory], GammaPolicy],
            history: PairHistory | None = None) -> float:
    """Geometric mean over prompts of (time of ``ar``) / (time of the policy); ``history``:
    the pair's acceptance the first prompt starts from (default: none, a new process)."""
    history = history or PairHistory()
    logs = [math.log(replay(m, p, FixedGamma(0), costs) / replay(m, p, make(history), costs))
            for p, m in matches.values()]
    return math.exp(sum(logs) / len(logs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a `verispec bench` results.jsonl with `ar` at T = 0")
    ap.add_argument("--costs", help="target ms at k = 1,2,4,9 and draft ms, e.g. "
                    "99.7,118.7,143.3,193.4,37.8 (default: timed here, context 200, median of 7)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    from transformers import AutoTokenizer

    draft = load_native(model_path(DEFAULT_DRAFT, "hf"), "int8", online_rotations=False)
    if args.costs:
        *target_s, draft_s = (float(x) / 1e3 for x in args.costs.split(","))
        target = dict(zip(KS, target_s, strict=True))
    else:
        twin = load_native(model_path(DEFAULT_TARGET, "hf"), "int8", online_rotations=True)
        target, timed = interleaved_costs([(twin, KS), (draft, (1,))], context=200, reps=7)
        draft_s = timed[1]
        del twin
    costs = PassCosts(target, draft_s, prefill_cost(draft, 200) / 200)
    tokenizer = AutoTokenizer.from_pretrained(model_path(DEFAULT_TARGET, "hf"))
    matches = draft_matches(greedy_outputs(args.results), draft, tokenizer)
    share = sum(sum(m) for _, m in matches.values()) / sum(len(m) for _, m in matches.values())
    print(f"{len(matches)} prompts, {share:.1%} of the positions match; costs: {costs.describe()}")
    for gamma in FIXED:
        fixed = speedup(matches, costs, lambda h, g=gamma: FixedGamma(g))
        print(f"fixed γ {gamma}: {fixed:.3f}× ar")
    auto = speedup(matches, costs, lambda h: AutoGamma(costs, history=h))
    print(f"γ auto, the first process of the pair: {auto:.3f}× ar")
    earlier = PairHistory()  # what one earlier run over the same prompts recorded
    speedup(matches, costs, lambda h: AutoGamma(costs, history=h), earlier)
    again = speedup(matches, costs, lambda h: AutoGamma(costs, history=h), earlier)
    print(f"γ auto, from the acceptance recorded by an earlier run: {again:.3f}× ar")


if __name__ == "__main__":
    main()
