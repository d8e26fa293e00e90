"""MJSD verification (Algorithm 1 of *Multi-Token Joint Speculative Decoding for Accelerating
Large Language Model Inference*, Qin et al.).

NOT lossless: the output does not follow the target distribution; MJSD trades exactness
for joint likelihood (its quality is measured as perplexity under the target).

With the joint target probability p(x_1..x_j) = Π_{i≤j} p(x_i | x_<i) along the draft and
the drafter's joint probability q(x_1..x_j) (beam search), prefix j *passes* if
min(1, p(x_1..x_j) / q(x_1..x_j)) > threshold. τ is the **longest** passing prefix (0 if
none; a failing prefix does not stop the scan — lines 7–13 of Algorithm 1), and the next
token Y is drawn from the target at position τ+1 (lines 15–16). At temperature 0 p is
one-hot, so Y is the target's argmax.

Consequences: threshold 1 never accepts (min(1, ·) > 1 is impossible), giving one target
token per iteration; threshold 0 accepts every prefix of positive joint target probability.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from verispec.sampling import sample_from
from verispec.verify._core import VerifyResult, token_prob

__all__ = ["check_threshold", "mjsd_accepted", "mjsd_verify"]


def check_threshold(threshold: float) -> float:
    """Return ``threshold`` as a float, or raise ValueError unless it lies in [0, 1]."""
    try:
        value = float(threshold)
    except (TypeError, ValueError):
        raise ValueError(f"threshold must be a number in [0, 1], got {threshold!r}") from None
    if isinstance(threshold, bool) or not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"threshold must lie in [0, 1], got {threshold!r}")
    return value


def mjsd_accepted(
    target_probs: Tensor, draft_joint: Tensor, draft_tokens: Tensor, threshold: float, *,
    lengths: Tensor | None = None,
) -> Tensor:
    """τ per row, deterministic.

    Args:
        target_probs: [B, γ+1, V] warped p along the draft.
        draft_joint: [B, γ] q(x_1..x_j) of the draft's prefixes.
        draft_tokens: [B, γ] int64.
        lengths: [B] int64 γ_b ≤ γ for a ragged batch (prefixes beyond γ_b never pass).
    Returns:
        [B] int64, the largest j with min(1, p(x_1..x_j) / q(x_1..x_j)) > threshold, else 0.
    """
    threshold = check_threshold(threshold)
    if target_probs.dim() != 3 or draft_tokens.dim() != 2 or draft_joint.shape != draft_tokens.shape:
        raise ValueError(
            "expected target_probs [B, γ+1, V], draft_joint [B, γ], draft_tokens [B, γ]; got "
            f"{tuple(target_probs.shape)}, {tuple(draft_joint.shape)}, {tuple(draft_tokens.shape)}"
        )
    b, gamma = draft_tokens.shape
    if target_probs.shape[:2] != (b, gamma + 1):
        raise ValueError(f"target_probs {tuple(target_probs.shape)} needs shape [{b}, {gamma + 1}, V]")
    if draft_tokens.dtype != torch.int64:
        raise TypeError(f"draft_tokens must be int64, got {draft_tokens.dtype}")
    p_x = token_prob(target_probs, draft_tokens).to(torch.float64)  # [B, γ]
    p_joint = torch.cumprod(p_x, dim=1)  # [B, γ] p(x_1..x_j)
    q_joint = draft_joint.to(device=p_joint.device, dtype=torch.float64)  # [B, γ]
    ratio = torch.clamp(p_joint / q_joint, max=1.0)  # [B, γ]; NaN only if p = q = 0
    passes = ratio > threshold  # [B, γ]; NaN compares False
    idx = torch.arange(1, gamma + 1, device=p_joint.device).expand(b, gamma)  # [B, γ]
    if lengths is not None:
        passes &= idx <= lengths.to(p_joint.device)[:, None]
    zero = torch.zeros((b, 1), dtype=torch.int64, device=p_joint.device)
    return torch.cat([zero, torch.where(passes, idx, 0)], dim=1).amax(dim=1)  # [B]


def mjsd_verify(
    target_probs: Tensor,
    draft_joint: Tensor,
    draft_tokens: Tensor,
    generator: torch.Generator,
    *,
    threshold: float,
) -> VerifyResult:
    """MJSD verification (Algorithm 1). NOT lossless. Shapes as in :func:`mjsd_accepted`.

    Returns τ [B] and Y [B] ~ target_probs[:, τ]. ``bias_tv`` [B] is the exact distance of
    this step from the target given the context: each accepted draft token is a
    deterministic choice (beam search), whose TV distance from p(· | prefix) is
    1 - p(x_i | prefix); Y is drawn from p itself (distance 0). So bias_tv = Σ_{i≤τ} (1 - p(x_i)).
    """
    tau = mjsd_accepted(target_probs, draft_joint, draft_tokens, threshold)  # [B]
    b, gamma = draft_tokens.shape
    rows = torch.arange(b, device=target_probs.device)
    y = sample_from(target_probs[rows, tau.to(target_probs.device)], generator)  # [B]
    p_x = token_prob(target_probs, draft_tokens).to(torch.float64)  # [B, γ]
    kept = torch.arange(gamma, device=p_x.device)[None] < tau.to(p_x.device)[:, None]  # [B, γ]
    bias = torch.where(kept, 1.0 - p_x, 0.0).sum(dim=1)  # [B]
    return VerifyResult(num_accepted=tau, next_token=y, bias_tv=bias)
