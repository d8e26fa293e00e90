"""The exact output law of the engine itself, by replaying every random decision.

The engine takes all of a request's random decisions through its
:class:`~verispec.sampling.Randomness`: independent coins (acceptance tests) and draws from
a categorical distribution (draft tokens, the next token Y). :class:`ReplayRandomness`
answers them from a script instead of a generator, and records every decision point with
the probability of each outcome. :func:`engine_law` runs the real engine once per path of
the decision tree — depth first, each run following a recorded prefix and then the first
outcome at every new point — so every path is visited exactly once, with its exact
probability (a product of the very float64 probabilities the engine computed).

This checks the engine's code, not a model of it: drafting, scoring, ragged batches,
verification, acceptance, rollback and budget clamping all run as in production. Keep the
toy models small: the number of runs is the number of paths.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from verispec.sampling import Randomness

__all__ = ["ReplayRandomness", "Script", "engine_law"]

#: Joint law of the rows' outputs: (tokens of row 0, tokens of row 1, ...) -> probability.
JointLaw = dict[tuple[tuple[int, ...], ...], float]


@dataclass
class Script:
    """The decisions of one run: those to replay, then the first outcome of each new point.

    Attributes:
        prefix: outcome indices to take at the first decision points.
        points: every decision point met, as its outcomes' probabilities (in order).
        taken: the outcome index taken at each point.
        prob: the probability of the path so far.
    """

    prefix: list[int]
    points: list[list[float]] = field(default_factory=list)
    taken: list[int] = field(default_factory=list)
    prob: float = 1.0

    def decide(self, probs: Sequence[float]) -> int:
        """Take the scripted (or first) outcome among ``probs`` (positive entries only)."""
        k = len(self.points)
        index = self.prefix[k] if k < len(self.prefix) else 0
        self.points.append(list(probs))
        self.taken.append(index)
        self.prob *= probs[index]
        return index


class ReplayRandomness(Randomness):
    """A :class:`Randomness` whose decisions come from a shared :class:`Script`."""

    def __init__(self, script: Script) -> None:
        super().__init__(torch.Generator())
        self.script = script

    def coins(self, accept_probs: Tensor) -> Tensor:
        out = []
        for h in accept_probs.tolist():
            if h >= 1.0 or h <= 0.0:
                out.append(h >= 1.0)  # a sure outcome is no decision
                continue
            out.append(self.script.decide([h, 1.0 - h]) == 0)
        return torch.tensor(out, dtype=torch.bool, device=accept_probs.device)

    def choose(self, probs: Tensor) -> Tensor:
        picks = []
        for row in probs.to(torch.float64):
            support = (row > 0).nonzero().flatten()
            weights = row[support] / row[support].sum()
            picks.append(int(support[self.script.decide(weights.tolist())]))
        return torch.tensor(picks, dtype=torch.int64, device=probs.device)


def engine_law(run: Callable[[Sequence[Randomness]], Sequence[Sequence[int]]], rows: int,
               replayed: Sequence[int] | None = None, max_runs: int = 200_000) -> JointLaw:
    """The exact joint law of the outputs of ``run``, which decodes ``rows`` requests with
    the given sources of randomness (one per request) and returns their tokens.

    ``replayed``: the rows whose decisions are enumerated (default: all). The others draw
    from generators seeded afresh for every run, so they take the same decisions in every
    run, and the law is the replayed rows' law given those fixed outcomes — which is their
    plain law when rows do not influence each other, as the engine promises."""
    law: JointLaw = {}
    stack: list[list[int]] = [[]]
    runs = 0
    chosen = set(range(rows) if replayed is None else replayed)
    while stack:
        runs += 1
        if runs > max_runs:
            raise ValueError(f"more than {max_runs} paths: use smaller toy models")
        script = Script(stack.pop())
        outputs = run([ReplayRandomness(script) if i in chosen
                       else Randomness(torch.Generator().manual_seed(1_000_003 * (i + 1)))
                       for i in range(rows)])
        key = tuple(tuple(int(t) for t in out) for out in outputs)
        law[key] = law.get(key, 0.0) + script.prob
        for k in range(len(script.prefix), len(script.points)):
            for alt in range(1, len(script.points[k])):
                stack.append(script.taken[:k] + [alt])
    return law


def marginal(law: JointLaw, row: int) -> dict[tuple[int, ...], float]:
    """The law of one row's output."""
    out: dict[tuple[int, ...], float] = {}
    for key, p in law.items():
        out[key[row]] = out.get(key[row], 0.0) + p
    return out
