"""Exact laws and Theorem 3's closed forms for multi-draft (batch) speculative decoding.

Algorithm 4 / Theorem 3 of *A Theoretical Perspective for Speculative Decoding Algorithm*
(Yin et al., NeurIPS 2024), translated to p = target, q = draft (the paper uses the
opposite letters).

* :func:`multidraft_speculative_law` enumerates every tuple of M i.i.d. drafts and every
  (branch, τ, Y) outcome of :func:`verispec.verify.multidraft.multidraft_law`, with the
  engine's budget rule and :func:`verispec.engine.loop.accept_tokens`; lossless means it
  equals :func:`verispec.theory.exact.target_law`.
* :func:`single_token_rejection` is the exact P(τ = 0) of one iteration, from the library's
  own plan; :func:`theorem3_rejection` is the paper's formula Π_{m=1}^M TV(r^m, q) with
  r^1 = p, r^{m+1} = [r^m - q]_+ normalised, and the batch improvement is
  BI = TV(p, q) - Π_m TV(r^m, q).
* Closed forms of the paper's two examples: Bernoulli (draft Ber(u), target Ber(v), u ≥ v:
  BI = (u - v)(1 - u^{M-1})) and uniform (draft uniform on V tokens, target uniform on a
  subset of V' tokens, r = V / V': BI = (1 - 1/r) - (1 - 1/r)^M).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor

from verispec.checks import check_positive
from verispec.engine.exact import Law, walk
from verispec.methods.multidraft import multidraft_step
from verispec.models.toy import TableLM
from verispec.sampling import Sampling
from verispec.verify._core import normalise_or
from verispec.verify.multidraft import multidraft_law, multidraft_plan

__all__ = [
    "batch_improvement",
    "bernoulli_batch_improvement",
    "bernoulli_rejection",
    "multidraft_speculative_law",
    "single_token_rejection",
    "theorem3_rejection",
    "uniform_batch_improvement",
    "uniform_rejection",
]


def _num_drafts(num_drafts: int) -> int:
    return check_positive("the number of drafts M", num_drafts)


def multidraft_speculative_law(
    target: TableLM,
    draft: TableLM,
    prompt: Sequence[int],
    *,
    num_drafts: int,
    gamma: int,
    sampling: Sampling,
    length: int,
) -> Law:
    """Exact law of the engine's first ``length`` output tokens with ``multidraft``.

    Enumerates V^{γM} draft tuples per iteration: keep V, γ, M and ``length`` tiny.
    """
    return walk(prompt, length, multidraft_step(target, draft, num_drafts, gamma, sampling))


def single_token_rejection(p: Tensor, q: Tensor, num_drafts: int) -> float:
    """Exact P(τ = 0) of one multi-draft iteration (the first token is rejected by all M
    drafts), for context-independent target p [V] and draft q [V], enumerating the V^M
    first-token tuples through the library's plan (γ = 1)."""
    m = _num_drafts(num_drafts)
    p, q = p.to(torch.float64), q.to(torch.float64)
    v = int(p.shape[0])
    tuples = torch.tensor(list(itertools.product(range(v), repeat=m)), dtype=torch.int64)  # [C, M]
    weight = q[tuples].prod(-1)  # [C]
    c = int(tuples.shape[0])
    plan = multidraft_plan(p.expand(c, m, 2, v), q.expand(c, m, 1, v), tuples[:, :, None])
    law = multidraft_law(plan)  # [C, M, 2, V]
    return float((weight * law[:, 0, 0].sum(-1)).sum())


def theorem3_rejection(p: Tensor, q: Tensor, num_drafts: int) -> float:
    """Theorem 3's single-token rejection Π_{m=1}^M TV(r^m, q), r^1 = p,
    r^{m+1} = [r^m - q]_+ normalised (p = target [V], q = draft [V])."""
    m = _num_drafts(num_drafts)
    r, q = p.to(torch.float64), q.to(torch.float64)
    total = 1.0
    for _ in range(m):
        total *= 0.5 * float((r - q).abs().sum())
        r = normalise_or((r - q).clamp_min(0), r)
    return total


def batch_improvement(p: Tensor, q: Tensor, num_drafts: int) -> float:
    """BI(p, q) = TV(p, q) - Π_{m=1}^M TV(r^m, q) (Theorem 3, single token)."""
    tv = 0.5 * float((p.to(torch.float64) - q.to(torch.float64)).abs().sum())
    return tv - theorem3_rejection(p, q, num_drafts)


def _bernoulli(u: float, v: float) -> None:
    if not (0.0 <= v <= u <= 1.0):
        raise ValueError(
            f"the Bernoulli example needs 0 <= v <= u <= 1 (draft Ber(u), target Ber(v)); got "
            f"u={u}, v={v} (swap the labels 0 and 1 for u < v)"
        )


def bernoulli_batch_improvement(u: float, v: float, num_drafts: int) -> float:
    """BI for draft q = Ber(u), target p = Ber(v), u ≥ v: |u - v|·(1 - u^{M-1})."""
    m = _num_drafts(num_drafts)
    _bernoulli(u, v)
    return (u - v) * (1.0 - u ** (m - 1))


def bernoulli_rejection(u: float, v: float, num_drafts: int) -> float:
    """P(reject) = |u - v| - BI = |u - v|·u^{M-1} for draft Ber(u), target Ber(v), u ≥ v."""
    return (u - v) - bernoulli_batch_improvement(u, v, num_drafts)


def _ratio(r: float) -> None:
    if not r >= 1.0:
        raise ValueError(f"the uniform example needs r = V / V' >= 1, got {r}")


def uniform_batch_improvement(r: float, num_drafts: int) -> float:
    """BI for draft uniform on V tokens, target uniform on V' of them, r = V / V':
    (1 - 1/r) - (1 - 1/r)^M."""
    m = _num_drafts(num_drafts)
    _ratio(r)
    return (1.0 - 1.0 / r) - (1.0 - 1.0 / r) ** m


def uniform_rejection(r: float, num_drafts: int) -> float:
    """P(reject) = TV - BI = (1 - 1/r)^M for the uniform example."""
    return (1.0 - 1.0 / r) - uniform_batch_improvement(r, num_drafts)
