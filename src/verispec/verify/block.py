"""Block verification (Algorithm 2 of *Block Verification Accelerates Speculative Decoding*,
Sun et al., ICLR 2025).

Lossless (Theorem 1) and optimal among valid verifiers in the expected number of tokens
per iteration (Theorem 2). With p_0 = 1 and p_i = min{1, p_{i-1} p(X_i)/q(X_i)}:

* h_i = S_i / (S_i + 1 - p_i) for i < γ, where S_i = Σ_x max{p_i p(x | X^i) - q(x | X^i), 0};
  h_γ = p_γ (equation 5);
* τ is the *largest* accepted i (0 if none) — every position is examined, no break;
* Y ~ max{p_τ p(· | X^τ) - q(· | X^τ), 0} normalised if τ < γ (equation 4), else p(· | X^γ).
"""

from __future__ import annotations

import torch
from torch import Tensor

from verispec.verify._core import (
    VerifyPlan,
    VerifyResult,
    check_verifier_inputs,
    draw,
    residual_from_weights,
    restrict,
    token_prob,
)

__all__ = ["block_plan", "block_verify"]


def block_plan(target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, *,
               lengths: Tensor | None = None) -> VerifyPlan:
    """Acceptance probabilities and residuals of block verification.

    Args:
        target_probs: [B, γ+1, V] p.
        draft_probs: [B, γ, V] q.
        draft_tokens: [B, γ] int64.
        lengths: [B] int64 γ_b ≤ γ for a ragged batch (row b's h_{γ_b} is then p_{γ_b}).
    """
    check_verifier_inputs(target_probs, draft_probs, draft_tokens)
    b, gamma = draft_tokens.shape
    ratio = token_prob(target_probs, draft_tokens) / token_prob(draft_probs, draft_tokens)
    one = torch.ones((b, 1), dtype=target_probs.dtype, device=target_probs.device)
    path = [one]  # path[i]: [B, 1], p_i
    for i in range(gamma):  # a loop over positions only; rows stay vectorised
        path.append(torch.clamp(path[-1] * ratio[:, i : i + 1], max=1.0))
    p_path = torch.cat(path, dim=1)  # [B, γ+1]
    p_head = target_probs[:, :-1]  # [B, γ, V]
    weights = (p_head * p_path[:, :-1, None]).sub_(draft_probs).clamp_min_(0)  # [B, γ, V]
    mass = weights.sum(dim=-1)  # [B, γ], S_i
    denom = mass + 1 - p_path[:, :-1]
    h_inner = torch.where(denom > 0, mass / torch.where(denom > 0, denom, 1.0), 0.0)  # [B, γ]
    # h_0 is never used (τ = 0 needs no acceptance); shift to h_1..h_{γ-1} and append h_γ.
    h = torch.cat([h_inner[:, 1:], p_path[:, 1:][:, -1:]], dim=1)  # [B, γ] (empty if γ = 0)
    residual_at = residual_from_weights(target_probs, lambda rows, i: weights[rows, i])
    return restrict(VerifyPlan(h, None, "last_accept", residual_at=residual_at),
                    target_probs, lengths, last_accept=p_path)


def block_verify(
    target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, generator: torch.Generator
) -> VerifyResult:
    """Block verification. Shapes as in :func:`block_plan`; returns τ [B] and Y [B]."""
    return draw(block_plan(target_probs, draft_probs, draft_tokens), generator)
