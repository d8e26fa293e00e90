"""Lossy verification with over-acceptance ε (Section 4 and Appendix G of
*A Theoretical Perspective for Speculative Decoding Algorithm*, Yin et al., NeurIPS 2024).

NOT lossless for ε > 0. The paper writes p for the draft and q for the target; here, as
everywhere in verispec, p = target and q = draft. Token verification (Algorithm 2 of that
paper, "biased" class) with the acceptance probability raised to

    b(x) = min{1, (p(x) + ε) / q(x)},                       ε ≥ 0,

and, on the first rejection, Y drawn from a residual P chosen one of two ways:

* ``"opt"`` (Decoding-OPT): Theorem 4's Pareto-optimal residual. With
  A(x) = (p(x) − b(x) q(x)) / Σ_y (1 − b(y)) q(y), P* = [A]₊ normalised, which puts no mass
  where A < 0 and at most A(x) where A ≥ 0, so TV(law, p) attains Theorem 4's minimum
  ½ Σ|p − bq| − ½ Σ(1 − b)q and P(reject) + TV = TV(p, q) (Theorem 5, the Pareto line).
* ``"target"`` (Decoding-UNO, the paper's baseline): P := p; strictly above the line as
  soon as rejection is possible and p puts mass where A < 0.

ε = 0 with ``"opt"`` is token verification exactly (same plan, bit for bit). The exact
per-position bias TV(b·q + P(reject)·P, p) is reported in ``VerifyResult.bias_tv``.
"""

from __future__ import annotations

import math
from typing import Literal

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

__all__ = [
    "RESIDUALS",
    "Residual",
    "check_lossy_params",
    "lossy_plan",
    "lossy_plan_with_bias",
    "lossy_verify",
    "reached_bias",
    "step_law",
]

Residual = Literal["opt", "target"]
#: The residual choices: Theorem 4's optimum, or the target (Decoding-UNO).
RESIDUALS: tuple[str, ...] = ("opt", "target")


def check_lossy_params(epsilon: float, residual: str) -> None:
    """Raise ValueError unless ε is a finite real ≥ 0 and ``residual`` is "opt" or "target"."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
        # ValueError, not TypeError: every invalid parameter raises ValueError in verispec.
        raise ValueError(f"epsilon must be a real number >= 0, got {epsilon!r}")  # noqa: TRY004
    if not math.isfinite(epsilon) or epsilon < 0:
        raise ValueError(
            f"epsilon must be finite and >= 0, got {epsilon!r} (ε >= 1 already accepts every "
            "draft token)"
        )
    if residual not in RESIDUALS:
        raise ValueError(f"residual must be one of {RESIDUALS}, got {residual!r}")


def _step_parts(p: Tensor, q: Tensor, epsilon: float, residual: str) -> tuple[Tensor, Tensor, Tensor]:
    """The pieces of one lossy step at every position.

    Args:
        p: [..., V] target; q: [..., V] draft.
    Returns:
        kept [..., V] = b(x) q(x) = min{q(x), p(x) + ε} (exact identity, no division);
        p_reject [...] = Σ_x (1 − b(x)) q(x);
        resid [..., V] = the residual distribution P.
    """
    kept = torch.minimum(q, p + epsilon)  # [..., V]; equals q exactly where b = 1
    p_reject = (q - kept).sum(dim=-1)  # [...]; exactly 0 when nothing can be rejected
    if residual == "target":
        return kept, p_reject, p
    # Theorem 4: A = (p − bq) / Σ(1 − b)q and P* = [A]₊ / Σ[A]₊. The denominator of A is one
    # positive number per row, so [A]₊ normalised is [p − bq]₊ normalised; normalising the
    # latter saves a rounding step and makes ε = 0 identical to token verification, since
    # [p − min{q, p}]₊ = [p − q]₊. When Σ(1 − b)q = 0 rejection is impossible and P is
    # irrelevant; normalise_or falls back to p if [p − bq]₊ has no mass.
    resid = normalise_or((p - kept).clamp_min(0), p)  # [..., V]
    return kept, p_reject, resid


def step_law(p: Tensor, q: Tensor, epsilon: float, residual: Residual) -> tuple[Tensor, Tensor]:
    """Exact law of the token emitted at one reached position, and P(reject) there.

    Args:
        p: [..., V] target; q: [..., V] draft (the law X was drawn from).
        epsilon: ε ≥ 0; residual: "opt" or "target".
    Returns:
        out [..., V] = b·q + P(reject)·P, and p_reject [...] = Σ(1 − b)q.
    """
    check_lossy_params(epsilon, residual)
    kept, p_reject, resid = _step_parts(p, q, epsilon, residual)
    return kept + p_reject.unsqueeze(-1) * resid, p_reject


def _plan(
    target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, epsilon: float, residual: str,
    lengths: Tensor | None = None,
) -> tuple[VerifyPlan, Tensor]:
    """The plan and the per-position bias TV(step law, p): [B, γ]."""
    check_verifier_inputs(target_probs, draft_probs, draft_tokens)
    check_lossy_params(epsilon, residual)
    p_x = token_prob(target_probs, draft_tokens)  # [B, γ]
    q_x = token_prob(draft_probs, draft_tokens)  # [B, γ]; > 0 for a token drawn from q
    h = torch.clamp((p_x + epsilon) / q_x, max=1.0)  # [B, γ], b(X_i)
    p_head = target_probs[:, :-1]  # [B, γ, V]
    kept, p_reject, resid = _step_parts(p_head, draft_probs, epsilon, residual)
    residuals = torch.cat([resid, target_probs[:, -1:]], dim=1)  # [B, γ+1, V]; bonus = p
    out = kept + p_reject.unsqueeze(-1) * resid  # [B, γ, V]
    tv = 0.5 * (out - p_head).abs().sum(dim=-1)  # [B, γ]
    plan = restrict(VerifyPlan(accept_probs=h, residuals=residuals, rule="first_reject"),
                    target_probs, lengths)
    return plan, tv


def lossy_plan(
    target_probs: Tensor,
    draft_probs: Tensor,
    draft_tokens: Tensor,
    *,
    epsilon: float,
    residual: Residual,
    lengths: Tensor | None = None,
) -> VerifyPlan:
    """Acceptance probabilities b(X_i) and residuals of lossy verification (not lossless).

    Args:
        target_probs: [B, γ+1, V] p.
        draft_probs: [B, γ, V] q.
        draft_tokens: [B, γ] int64.
        epsilon: over-acceptance ε ≥ 0.
        residual: "opt" (Theorem 4, Decoding-OPT) or "target" (Decoding-UNO).
    """
    return _plan(target_probs, draft_probs, draft_tokens, epsilon, residual, lengths)[0]


def lossy_verify(
    target_probs: Tensor,
    draft_probs: Tensor,
    draft_tokens: Tensor,
    generator: torch.Generator,
    *,
    epsilon: float,
    residual: Residual,
) -> VerifyResult:
    """Lossy verification (NOT lossless for ε > 0). Shapes as in :func:`lossy_plan`.

    Returns τ [B], Y [B] and ``bias_tv`` [B]: the sum of TV(step law, p) over the verified
    positions 1..τ+1 if τ < γ, 1..γ if τ = γ (the bonus token is drawn from p exactly).
    """
    plan, tv = lossy_plan_with_bias(target_probs, draft_probs, draft_tokens, epsilon=epsilon,
                                    residual=residual)
    result = draw(plan, generator)
    result.bias_tv = reached_bias(tv, result.num_accepted, None)
    return result


def lossy_plan_with_bias(
    target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, *, epsilon: float,
    residual: Residual, lengths: Tensor | None = None,
) -> tuple[VerifyPlan, Tensor]:
    """:func:`lossy_plan` and the per-position bias TV(step law, p) [B, γ]."""
    return _plan(target_probs, draft_probs, draft_tokens, epsilon, residual, lengths)


def reached_bias(tv: Tensor, tau: Tensor, lengths: Tensor | None) -> Tensor:
    """Σ of ``tv`` [B, γ] over the positions a step verified: 1..τ+1, capped at γ_b → [B]."""
    gamma = tv.shape[1]
    pos = torch.arange(gamma, device=tv.device)[None, :]  # 0-based position i verifies X_{i+1}
    reached = pos <= tau.to(tv.device)[:, None]  # [B, γ]
    if lengths is not None:
        reached &= pos < lengths.to(tv.device)[:, None]
    return torch.where(reached, tv, torch.zeros_like(tv)).sum(dim=1)
