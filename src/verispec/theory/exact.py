"""Exact laws by enumeration on toy models (float64), for tests and for teaching.

:func:`speculative_law` enumerates every draft block and every (τ, Y) outcome of a
plan-based verifier, reusing the library's own plan functions (:mod:`verispec.verify`) and
block clamping (:func:`verispec.engine.loop.accept_tokens`), with the engine's budget rule
(γ is cut to ``remaining - 1``). :func:`target_law` is autoregressive sampling from the
target. Lossless methods must make the two equal.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from functools import cache

import torch
from torch import Tensor

from verispec.engine.loop import accept_tokens
from verispec.models.toy import TableLM
from verispec.sampling import Sampling
from verispec.verify import VerifyPlan, plan_law

__all__ = ["Law", "expected_accepted", "speculative_law", "target_law", "tv_distance", "warped"]

Law = dict[tuple[int, ...], float]
PlanFn = Callable[[Tensor, Tensor, Tensor], VerifyPlan]


def warped(model: TableLM, sampling: Sampling) -> Callable[[tuple[int, ...]], Tensor]:
    """Memoised ``context -> warped next-token distribution [V]`` (float64)."""

    @cache
    def dist(context: tuple[int, ...]) -> Tensor:
        return sampling.probs(model.next_probs(context).log(), model.name)

    return dist


def target_law(target: TableLM, prompt: Sequence[int], sampling: Sampling, length: int) -> Law:
    """Law of the first ``length`` tokens (fewer if EOS comes first) sampled from p."""
    p = warped(target, sampling)
    law: Law = {}

    def walk(ctx: tuple[int, ...], out: tuple[int, ...], prob: float) -> None:
        if len(out) == length or (out and out[-1] in target.eos_token_ids):
            law[out] = law.get(out, 0.0) + prob
            return
        dist = p(ctx)
        for y in range(target.vocab_size):
            if dist[y] > 0:
                walk(ctx + (y,), out + (y,), prob * float(dist[y]))

    walk(tuple(prompt), (), 1.0)
    return law


def speculative_law(
    target: TableLM,
    draft: TableLM,
    prompt: Sequence[int],
    *,
    plan_fn: PlanFn,
    gamma: int,
    sampling: Sampling,
    length: int,
    draft_stop: float | None = None,
) -> Law:
    """Exact law of the engine's first ``length`` output tokens with a plan-based verifier.

    ``draft_stop`` mirrors :class:`~verispec.drafters.model.ModelDrafter`'s ``stop_below``:
    the draft ends early, after at least one token, where the draft's unwarped next-token
    distribution has its maximum below the threshold.
    """
    p, q = warped(target, sampling), warped(draft, sampling)
    law: Law = {}

    def blocks(ctx: tuple[int, ...], g: int) -> Iterator[tuple[int, ...]]:
        """Every draft block the drafter can propose with at most g tokens."""
        if draft_stop is None:
            yield from itertools.product(range(target.vocab_size), repeat=g)
            return

        def grow(block: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
            if len(block) == g or (
                block and float(draft.next_probs(ctx + block).max()) < draft_stop
            ):
                yield block
                return
            for x in range(target.vocab_size):
                yield from grow(block + (x,))

        yield from grow(())

    def walk(ctx: tuple[int, ...], out: tuple[int, ...], prob: float) -> None:
        room = length - len(out)
        for block in blocks(ctx, min(gamma, room - 1)):
            g = len(block)
            q_rows = [q(ctx + block[:i]) for i in range(g)]
            block_prob = prob
            for i, x in enumerate(block):
                block_prob *= float(q_rows[i][x])
            if block_prob == 0:
                continue
            p_rows = torch.stack([p(ctx + block[:i]) for i in range(g + 1)])[None]  # [1, g+1, V]
            q_t = torch.stack(q_rows)[None] if g else p_rows.new_zeros((1, 0, target.vocab_size))
            outcome = plan_law(plan_fn(p_rows, q_t, torch.tensor([block], dtype=torch.int64)))[0]
            for tau, y in (outcome > 0).nonzero().tolist():
                new, stop = accept_tokens(list(block[:tau]) + [y], target.eos_token_ids, room)
                step = block_prob * float(outcome[tau, y])
                if stop:
                    key = out + tuple(new)
                    law[key] = law.get(key, 0.0) + step
                else:
                    walk(ctx + tuple(new), out + tuple(new), step)

    walk(tuple(prompt), (), 1.0)
    return law


def expected_accepted(
    target: TableLM,
    draft: TableLM,
    context: Sequence[int],
    *,
    plan_fn: PlanFn,
    gamma: int,
    sampling: Sampling,
) -> tuple[float, Tensor]:
    """E[τ] of one iteration and the exact law of τ ([γ+1]), over drafts and verifier coins."""
    p, q = warped(target, sampling), warped(draft, sampling)
    ctx = tuple(context)
    tau_law = torch.zeros(gamma + 1, dtype=torch.float64)
    for block in itertools.product(range(target.vocab_size), repeat=gamma):
        q_rows = [q(ctx + block[:i]) for i in range(gamma)]
        block_prob = 1.0
        for i, x in enumerate(block):
            block_prob *= float(q_rows[i][x])
        if block_prob == 0:
            continue
        p_rows = torch.stack([p(ctx + block[:i]) for i in range(gamma + 1)])[None]
        outcome = plan_law(plan_fn(p_rows, torch.stack(q_rows)[None],
                                   torch.tensor([block], dtype=torch.int64)))[0]
        tau_law += block_prob * outcome.sum(-1)
    return float((tau_law * torch.arange(gamma + 1)).sum()), tau_law


def tv_distance(a: Law, b: Law) -> float:
    """Total variation distance between two laws over sequences."""
    keys = set(a) | set(b)
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys)
