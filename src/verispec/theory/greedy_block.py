"""Exact laws of greedy block verification (Appendix C of block-verification.txt) on toy models.

:func:`greedy_block_law` enumerates Algorithm 6 — every draft block, every (τ, Y) outcome,
and the distribution-modification state carried from one iteration to the next — reusing
the library's own pure functions (:func:`~verispec.verify.greedy_block.greedy_block_plan`,
:func:`~verispec.verify.greedy_block.modified_targets`,
:func:`~verispec.verify.greedy_block.advance_modifications`) and the engine's clamping
(:func:`verispec.engine.loop.accept_tokens`) with its budget rule γ_t = min(γ, remaining − 1).
With ``modify=False`` it is the law of the biased Algorithm 4 alone.

:func:`coupling_bound` is Σ_ℓ Σ_{x^ℓ} min{q(x^ℓ), p(x^ℓ)}: by Lemma 9 it is E[τ] of one
greedy block iteration, and by Lemma 10 no coupling of the two block laws does better.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from verispec.engine.loop import accept_tokens
from verispec.models.toy import TableLM
from verispec.sampling import Sampling
from verispec.theory.exact import Law, warped
from verispec.verify import plan_law
from verispec.verify.greedy_block import (
    Modifications,
    advance_modifications,
    greedy_block_plan,
    modified_targets,
)

__all__ = ["coupling_bound", "greedy_block_law"]


def _check(gamma: int, length: int | None = None) -> None:
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    if length is not None and length < 1:
        raise ValueError(f"length must be >= 1, got {length}")


def greedy_block_law(
    target: TableLM,
    draft: TableLM,
    prompt: Sequence[int],
    *,
    gamma: int,
    sampling: Sampling,
    length: int,
    modify: bool = True,
) -> Law:
    """Exact law of the first ``length`` output tokens of Algorithm 6 (``modify=True``,
    lossless) or of Algorithm 4 iterated without modification (``modify=False``, biased)."""
    _check(gamma, length)
    p, q = warped(target, sampling), warped(draft, sampling)
    vocab = target.vocab_size
    law: Law = {}

    def walk(ctx: tuple[int, ...], out: tuple[int, ...], prob: float, mods: Modifications) -> None:
        room = length - len(out)
        g = min(gamma, room - 1)
        for block in itertools.product(range(vocab), repeat=g):
            q_rows = [q(ctx + block[:i]) for i in range(g + 1)]  # q at positions 0..g
            block_prob = prob
            for i, x in enumerate(block):
                block_prob *= float(q_rows[i][x])
            if block_prob == 0:
                continue
            p_rows = torch.stack([p(ctx + block[:i]) for i in range(g + 1)])[None]  # [1, g+1, V]
            q_ext = torch.stack(q_rows)[None]  # [1, g+1, V]
            tokens = torch.tensor([block], dtype=torch.int64).reshape(1, g)
            layers = modified_targets(p_rows, q_ext, tokens, mods) if modify else p_rows[None]
            outcome = plan_law(greedy_block_plan(layers[-1], q_ext[:, :g], tokens))[0]
            for tau, y in (outcome > 0).nonzero().tolist():
                new, stop = accept_tokens(list(block[:tau]) + [y], target.eos_token_ids, room)
                step = block_prob * float(outcome[tau, y])
                if stop:
                    key = out + tuple(new)
                    law[key] = law.get(key, 0.0) + step
                    continue
                nxt = mods
                if modify:
                    nxt = advance_modifications(mods, layers, q_ext, tokens,
                                                torch.tensor([tau]), torch.tensor([y]))
                walk(ctx + tuple(new), out + tuple(new), step, nxt)

    walk(tuple(prompt), (), 1.0, Modifications.none(1))
    return law


def coupling_bound(
    target: TableLM, draft: TableLM, context: Sequence[int], *, gamma: int, sampling: Sampling
) -> float:
    """Σ_{ℓ=1..γ} Σ_{x^ℓ} min{q(x^ℓ | c), p(x^ℓ | c)} over joint block probabilities.

    Lemma 10's upper bound on E[τ] for any verifier that couples a q-block with a p-block
    (block verification included), attained by greedy block verification (Lemma 9).
    """
    _check(gamma)
    p, q = warped(target, sampling), warped(draft, sampling)
    total = 0.0
    frontier: list[tuple[tuple[int, ...], float, float]] = [((), 1.0, 1.0)]  # (x^ℓ, p, q)
    for _ in range(gamma):
        nxt = []
        for path, pj, qj in frontier:
            p_row, q_row = p(tuple(context) + path), q(tuple(context) + path)
            for x in range(target.vocab_size):
                pj2, qj2 = pj * float(p_row[x]), qj * float(q_row[x])
                if min(pj2, qj2) > 0:
                    total += min(pj2, qj2)
                    nxt.append((path + (x,), pj2, qj2))
        frontier = nxt
    return total
