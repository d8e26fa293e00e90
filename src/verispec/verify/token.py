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
    normalise_or,
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
    p_head = target_probs[:, :-1]  # [B, γ, V]
    residual = normalise_or((p_head - draft_probs).clamp_min(0), p_head)  # [B, γ, V]
    residuals = torch.cat([residual, target_probs[:, -1:]], dim=1)  # [B, γ+1, V]
    return restrict(VerifyPlan(accept_probs=h, residuals=residuals, rule="first_reject"),
                    target_probs, lengths)


def token_verify(
    target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, generator: torch.Generator
) -> VerifyResult:
    """Token verification. Shapes as in :func:`token_plan`; returns τ [B] and Y [B]."""
    return draw(token_plan(target_probs, draft_probs, draft_tokens), generator)
