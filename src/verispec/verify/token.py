"""Token verification (Algorithm 1 of *Block Verification Accelerates Speculative Decoding*,
Sun et al., ICLR 2025; after Leviathan et al. 2023).

Lossless. Draft token X_i is accepted with probability min{1, p(X_i)/q(X_i)}; the first
rejection stops the scan and Y is drawn from the residual [p - q]_+ at that position.
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

__all__ = ["token_plan", "token_verify"]


def token_plan(target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, *,
               lengths: Tensor | None = None) -> VerifyPlan:
    """Acceptance probabilities and residuals of token verification.

    Args:
        target_probs: [B, γ+1, V] p.
        draft_probs: [B, γ, V] q.
        draft_tokens: [B, γ] int64.
        lengths: [B] int64 γ_b ≤ γ for a ragged batch (see :func:`~verispec.verify.restrict`).
    """
    check_verifier_inputs(target_probs, draft_probs, draft_tokens)
    p_x = token_prob(target_probs, draft_tokens)  # [B, γ]
    q_x = token_prob(draft_probs, draft_tokens)  # [B, γ]
    h = torch.clamp(p_x / q_x, max=1.0)  # [B, γ]
    residual_at = residual_from_weights(  # [p_i - q_i]_+ at a rejected position i
        target_probs, lambda rows, i: (target_probs[rows, i] - draft_probs[rows, i]).clamp_min_(0))
    return restrict(VerifyPlan(h, None, "first_reject", residual_at=residual_at),
                    target_probs, lengths)


def token_verify(
    target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, generator: torch.Generator
) -> VerifyResult:
    """Token verification. Shapes as in :func:`token_plan`; returns τ [B] and Y [B]."""
    return draw(token_plan(target_probs, draft_probs, draft_tokens), generator)
