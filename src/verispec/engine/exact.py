"""Exact laws by enumeration on toy models (float64): the one walk every law is built on.

A method's law is a *step law*: from a context (and the method's state, if it keeps one),
every way one iteration can end — the tokens it emits (after EOS and budget clamping, as
the engine does), whether generation stops, and the probability — with the state that
follows. :func:`walk` composes step laws into the law of the first ``length`` output tokens.
Every law of the library (the target's own, every verifier's, greedy block verification's
with its modification state, multi-draft, MJSD, the audit's estimates) is a step function
handed to :func:`walk`; the methods declare theirs where they live.

Lossless methods must give :func:`target_law`; the tests and ``verispec audit`` check it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import cache
from typing import Any

import torch
from torch import Tensor

from verispec.engine.request import accept_tokens
from verispec.models.toy import TableLM
from verispec.sampling import Sampling
from verispec.verify import VerifyPlan, plan_law

__all__ = [
    "Block",
    "Law",
    "Outcome",
    "PlanFn",
    "Step",
    "clamp",
    "draft_blocks",
    "expected_accepted",
    "first_step_tokens",
    "plan_step",
    "speculative_law",
    "target_law",
    "tv_distance",
    "walk",
    "warped",
]

Law = dict[tuple[int, ...], float]
PlanFn = Callable[..., VerifyPlan]
#: One way an iteration ends: (emitted tokens, generation stops, probability, next state).
Outcome = tuple[tuple[int, ...], bool, float, Any]
#: ``step(context, room, state)`` -> every outcome of one iteration.
Step = Callable[[tuple[int, ...], int, Any], Iterable[Outcome]]
#: A draft block, its q-probability, p along it [g+1, V] and q along it [g, V].
Block = tuple[tuple[int, ...], float, Tensor, Tensor]


def walk(prompt: Sequence[int], length: int, step: Step, state: Any = None) -> Law:
    """The law of the first ``length`` output tokens of a process given by its step law."""
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    law: Law = {}

    def go(ctx: tuple[int, ...], out: tuple[int, ...], prob: float, st: Any) -> None:
        for new, stop, w, nxt in step(ctx, length - len(out), st):
            if w <= 0:
                continue
            if stop or len(out) + len(new) >= length:
                law[out + new] = law.get(out + new, 0.0) + prob * w
            else:
                go(ctx + new, out + new, prob * w, nxt)

    go(tuple(int(t) for t in prompt), (), 1.0, state)
    return law


def clamp(block: Sequence[int], eos: frozenset[int], room: int) -> tuple[tuple[int, ...], bool]:
    """The engine's EOS / budget clamping of an iteration's tokens."""
    new, stop = accept_tokens(list(block), eos, room)
    return tuple(new), bool(stop)


def warped(model: TableLM, sampling: Sampling) -> Callable[[tuple[int, ...]], Tensor]:
    """Memoised ``context -> warped next-token distribution [V]`` (float64)."""

    @cache
    def dist(context: tuple[int, ...]) -> Tensor:
        return sampling.probs(model.next_probs(context).log(), model.name)

    return dist


def target_law(target: TableLM, prompt: Sequence[int], sampling: Sampling, length: int) -> Law:
    """Law of the first ``length`` tokens (fewer if EOS comes first) sampled from p."""
    p = warped(target, sampling)

    def step(ctx: tuple[int, ...], room: int, state: Any) -> Iterable[Outcome]:
        dist = p(ctx)
        for y in (dist > 0).nonzero().flatten().tolist():
            new, stop = clamp([y], target.eos_token_ids, room)
            yield new, stop, float(dist[y]), None

    return walk(prompt, length, step)


def draft_blocks(target: TableLM, draft: TableLM, ctx: tuple[int, ...], g: int,
                 sampling: Sampling, draft_stop: float | None = None) -> list[Block]:
    """Every draft block of at most g tokens the model drafter can propose after ``ctx``,
    with q-probability > 0. ``draft_stop`` mirrors the drafter's early stop: a block ends
    after at least one token where the draft's unwarped next-token maximum is below it."""
    p, q = warped(target, sampling), warped(draft, sampling)
    vocab = target.vocab_size

    def grow(block: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
        stops = draft_stop is not None and block and \
            float(draft.next_probs(ctx + block).max()) < draft_stop
        if len(block) == g or stops:
            yield block
            return
        for x in range(vocab):
            yield from grow(block + (x,))

    out: list[Block] = []
    for block in grow(()):
        k = len(block)
        q_rows = [q(ctx + block[:i]) for i in range(k)]
        prob = math.prod(float(q_rows[i][x]) for i, x in enumerate(block))
        if prob > 0:
            p_rows = torch.stack([p(ctx + block[:i]) for i in range(k + 1)])  # [k+1, V]
            q_t = torch.stack(q_rows) if k else p_rows.new_zeros((0, vocab))  # [k, V]
            out.append((block, prob, p_rows, q_t))
    return out


def plan_step(target: TableLM, draft: TableLM, plan_fn: PlanFn, gamma: int, sampling: Sampling,
              draft_stop: float | None = None) -> Step:
    """The step law of a plan-based verifier with the model drafter (γ cut to room − 1)."""

    def step(ctx: tuple[int, ...], room: int, state: Any) -> Iterable[Outcome]:
        for block, prob, p_rows, q_rows in draft_blocks(
                target, draft, ctx, min(gamma, room - 1), sampling, draft_stop):
            tokens = torch.tensor([block], dtype=torch.int64).reshape(1, len(block))
            outcome = plan_law(plan_fn(p_rows[None], q_rows[None], tokens))[0]  # [g+1, V]
            for tau, y in (outcome > 0).nonzero().tolist():
                new, stop = clamp(list(block[:tau]) + [y], target.eos_token_ids, room)
                yield new, stop, prob * float(outcome[tau, y]), None

    return step


def speculative_law(target: TableLM, draft: TableLM, prompt: Sequence[int], *, plan_fn: PlanFn,
                    gamma: int, sampling: Sampling, length: int,
                    draft_stop: float | None = None) -> Law:
    """Exact law of the engine's first ``length`` output tokens with a plan-based verifier."""
    return walk(prompt, length, plan_step(target, draft, plan_fn, gamma, sampling, draft_stop))


def expected_accepted(target: TableLM, draft: TableLM, context: Sequence[int], *,
                      plan_fn: PlanFn, gamma: int, sampling: Sampling) -> tuple[float, Tensor]:
    """E[τ] of one iteration and the exact law of τ ([γ+1]), over drafts and verifier coins."""
    tau_law = torch.zeros(gamma + 1, dtype=torch.float64)
    for block, prob, p_rows, q_rows in draft_blocks(target, draft, tuple(context), gamma,
                                                    sampling):
        tokens = torch.tensor([block], dtype=torch.int64).reshape(1, gamma)
        tau_law += prob * plan_law(plan_fn(p_rows[None], q_rows[None], tokens))[0].sum(-1)
    return float((tau_law * torch.arange(gamma + 1)).sum()), tau_law


def first_step_tokens(step: Step, prompt: Sequence[int], length: int, state: Any = None) -> float:
    """Expected number of tokens the first iteration emits."""
    return sum(len(new) * w for new, _, w, _ in step(tuple(prompt), length, state))


def tv_distance(a: Law, b: Law) -> float:
    """Total variation distance between two laws over sequences."""
    keys = set(a) | set(b)
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys)
