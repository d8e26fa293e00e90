"""Exact laws of greedy block verification (Appendix C of *Block Verification Accelerates
Speculative Decoding*, Sun et al., ICLR 2025) on toy models.

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

from collections.abc import Sequence

from verispec.engine.exact import Law, warped
from verispec.methods.greedy_block import GREEDY_BLOCK, GreedyBlockMethod
from verispec.models.toy import TableLM
from verispec.sampling import Sampling

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
    method = GreedyBlockMethod(modify=modify)
    return GREEDY_BLOCK.law(method, target, draft, prompt, gamma=gamma,  # type: ignore[misc]
                            sampling=sampling, length=length)[0]


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
