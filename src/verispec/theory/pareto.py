"""The rejection / distribution-bias trade-off of one verification step (Section 4,
Theorems 4–5 of *A Theoretical Perspective for Speculative Decoding Algorithm*, Yin et al.,
NeurIPS 2024), in verispec's letters.

The paper writes p for the draft and q for the target; here p = target and q = draft.
A biased single-step algorithm accepts X ~ q with probability b(x) and otherwise emits
Y ~ P, so its output law is b·q + P(reject)·P with P(reject) = Σ_x (1 − b(x)) q(x).

* Theorem 4: for a fixed b, min_P TV(b·q + P(reject)·P, p) = ½ Σ|p − bq| − ½ Σ(1 − b)q,
  attained exactly by the P with P = 0 where A < 0 and 0 ≤ P ≤ A where A ≥ 0, where
  A = (p − bq) / Σ(1 − b)q (:func:`theorem4_a`, :func:`in_optimal_set`).
* Theorem 5: if b ≥ min{1, p/q} everywhere, P(reject) + min_P TV = TV(p, q): the Pareto
  front is the straight line from (0, TV(p, q)) to (TV(p, q), 0) (:func:`pareto_line`).

:func:`step_law` (the exact law of the lossy verifier's step, shared with
:mod:`verispec.verify.lossy`) is re-exported here. All functions work on [..., V] tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor

from verispec.checks import TOLERANCE
from verispec.verify.lossy import step_law

__all__ = [
    "in_optimal_set",
    "lossy_acceptance",
    "optimal_bias",
    "pareto_line",
    "rejection_prob",
    "step_law",
    "theorem4_a",
    "tv",
]


def tv(a: Tensor, b: Tensor) -> Tensor:
    """Total variation ½ Σ|a − b| over the last axis: [..., V] × [..., V] -> [...]."""
    return 0.5 * (a - b).abs().sum(dim=-1)


def lossy_acceptance(p: Tensor, q: Tensor, epsilon: float) -> Tensor:
    """b(x) = min{1, (p(x) + ε) / q(x)} [..., V]; 1 where q(x) = 0 (never drafted)."""
    safe_q = torch.where(q > 0, q, torch.ones_like(q))
    return torch.where(q > 0, torch.clamp((p + epsilon) / safe_q, max=1.0), torch.ones_like(q))


def rejection_prob(q: Tensor, b: Tensor) -> Tensor:
    """P(reject) = Σ_x (1 − b(x)) q(x): [...]."""
    return ((1 - b) * q).sum(dim=-1)


def theorem4_a(p: Tensor, q: Tensor, b: Tensor) -> Tensor:
    """A(x) = (p(x) − b(x) q(x)) / Σ_y (1 − b(y)) q(y) [..., V]; NaN rows where Σ(1 − b)q = 0.

    A sums to 1 but may be negative; it is a distribution iff b ≤ min{1, p/q} (lossless).
    """
    mass = rejection_prob(q, b).unsqueeze(-1)  # [..., 1]
    ok = mass > 0
    return torch.where(ok, (p - b * q) / torch.where(ok, mass, torch.ones_like(mass)), torch.nan)


def in_optimal_set(resid: Tensor, a: Tensor, atol: float = TOLERANCE) -> Tensor:
    """Theorem 4's optimal set: P = 0 where A < 0 and 0 ≤ P ≤ A where A ≥ 0. [...] bool."""
    neg = a < 0
    zero_on_neg = torch.where(neg, resid.abs() <= atol, True)
    bounded = torch.where(neg, True, (resid >= -atol) & (resid <= a + atol))
    return (zero_on_neg & bounded).all(dim=-1)


def optimal_bias(p: Tensor, q: Tensor, b: Tensor) -> Tensor:
    """Theorem 4's optimum min_P TV(b·q + P(reject)·P, p) = ½Σ|p − bq| − ½Σ(1 − b)q: [...]."""
    return 0.5 * (p - b * q).abs().sum(dim=-1) - 0.5 * rejection_prob(q, b)


def pareto_line(p: Tensor, q: Tensor, p_reject: Tensor) -> Tensor:
    """Theorem 5's front: the least bias reachable at a given P(reject) ∈ [0, TV(p, q)],
    TV(p, q) − P(reject) (for acceptances b ≥ min{1, p/q}). [...]."""
    return tv(p, q) - p_reject
