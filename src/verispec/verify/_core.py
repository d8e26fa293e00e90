"""The vocabulary and the shared machinery of all verifiers.

Words, used the same way in every verifier, the engine and the statistics:

* **draft tokens** X_1..X_γ: proposed by the drafter, drawn from q (draft, ``Ms``).
* **accepted**: τ = ``num_accepted`` ∈ [0, γ] is the length of the prefix X_1..X_τ kept.
* **next token** Y: one more token that every iteration emits. If τ < γ it is a
  **recovered** (correction) token drawn from a residual distribution at position τ+1;
  if τ = γ it is the **bonus** token drawn from the target p at position γ+1.
* p = target (``Mb``), q = draft (``Ms``). Position i (0-based) of ``target_probs`` is the
  target's distribution of the token that follows the context and X_1..X_i.

A verifier in the single-draft family is split into a deterministic *plan* and a generic
*draw*. The plan holds, for every row, acceptance probabilities h_1..h_γ, the rule that
turns independent uniforms η_i into τ, and the residual distribution of Y for every τ. The
draw uses the request's ``torch.Generator``. Keeping the plan separate lets
:mod:`verispec.theory` compute the exact law of (τ, Y) from the very same code that
produces the samples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch
from torch import Tensor

from verispec.sampling import sample_from

__all__ = [
    "Verifier",
    "VerifyPlan",
    "VerifyResult",
    "check_verifier_inputs",
    "draw",
    "normalise_or",
    "plan_law",
    "token_prob",
]

Rule = Literal["first_reject", "last_accept"]


@dataclass
class VerifyResult:
    """Outcome of verifying a batch of draft blocks.

    Attributes:
        num_accepted: [B] int64, τ per row.
        next_token: [B] int64, Y per row (recovered if τ < γ, bonus if τ = γ).
        bias_tv: [B] float64 or None. For lossy verifiers, the sum over the verified
            positions of the exact TV distance between the emitted token's distribution and
            p (zero for lossless verifiers, which leave it None).
        extras: method specific tensors (for example the chosen draft of a multi-draft step).
    """

    num_accepted: Tensor
    next_token: Tensor
    bias_tv: Tensor | None = None
    extras: dict[str, Tensor] = field(default_factory=dict)


@dataclass
class VerifyPlan:
    """Everything random about one verification, made explicit.

    Attributes:
        accept_probs: [B, γ] h_i, the probability that the uniform η_i accepts position i.
        residuals: [B, γ+1, V] distribution of Y given τ = i (row γ is the bonus distribution).
        rule: ``"first_reject"`` (τ = number of leading acceptances; token verification) or
            ``"last_accept"`` (τ = largest accepted i, 0 if none; block verification).
    """

    accept_probs: Tensor
    residuals: Tensor
    rule: Rule


class Verifier(Protocol):
    """A verification function over tensors; no model inside.

    Args:
        target_probs: [B, γ+1, V] p at positions 0..γ.
        draft_probs: [B, γ, V] q at positions 0..γ-1, exactly as sampled from.
        draft_tokens: [B, γ] int64.
        generator: the request's random source; the only randomness used.
    """

    def __call__(
        self,
        target_probs: Tensor,
        draft_probs: Tensor,
        draft_tokens: Tensor,
        generator: torch.Generator,
    ) -> VerifyResult: ...


def check_verifier_inputs(target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor) -> None:
    """Shape and dtype checks shared by all verifiers (cheap; no data-dependent syncs)."""
    if target_probs.dim() != 3 or draft_probs.dim() != 3 or draft_tokens.dim() != 2:
        raise ValueError(
            "expected target_probs [B, γ+1, V], draft_probs [B, γ, V], draft_tokens [B, γ]; got "
            f"{tuple(target_probs.shape)}, {tuple(draft_probs.shape)}, {tuple(draft_tokens.shape)}"
        )
    b, g1, v = target_probs.shape
    if draft_probs.shape != (b, g1 - 1, v) or draft_tokens.shape != (b, g1 - 1):
        raise ValueError(
            f"shape mismatch: target_probs {tuple(target_probs.shape)} needs draft_probs "
            f"{(b, g1 - 1, v)} and draft_tokens {(b, g1 - 1)}; got {tuple(draft_probs.shape)} "
            f"and {tuple(draft_tokens.shape)}"
        )
    if draft_tokens.dtype != torch.int64:
        raise TypeError(f"draft_tokens must be int64, got {draft_tokens.dtype}")
    if target_probs.dtype != draft_probs.dtype:
        raise TypeError(
            f"target_probs ({target_probs.dtype}) and draft_probs ({draft_probs.dtype}) differ"
        )


def token_prob(probs: Tensor, tokens: Tensor) -> Tensor:
    """probs[b, i, tokens[b, i]].  probs: [B, γ(+1), V]; tokens: [B, γ] -> [B, γ]."""
    return probs[:, : tokens.shape[1]].gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def normalise_or(weights: Tensor, fallback: Tensor) -> Tensor:
    """Normalise non-negative ``weights`` [..., V]; rows with zero mass take ``fallback``.

    A zero-mass residual only arises on events of probability zero in exact arithmetic
    (for example p = q at the rejected position, where rejection is impossible), so the
    fallback never changes the output law; it keeps float rounding from producing NaN.
    """
    total = weights.sum(dim=-1, keepdim=True)
    ok = total > 0
    return torch.where(ok, weights / torch.where(ok, total, torch.ones_like(total)), fallback)


def draw(plan: VerifyPlan, generator: torch.Generator) -> VerifyResult:
    """Sample (τ, Y) for every row of a plan with uniforms from ``generator``."""
    h = plan.accept_probs  # [B, γ]
    b, gamma = h.shape
    eta = torch.rand((b, gamma), generator=generator, dtype=h.dtype, device=h.device)
    accepted = eta < h  # [B, γ] bool; P(accepted_i) = h_i exactly for eta in [0, 1)
    if plan.rule == "first_reject":
        tau = accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)  # [B]
    else:
        idx = torch.arange(0, gamma + 1, device=h.device).expand(b, gamma + 1)
        first = torch.ones((b, 1), dtype=torch.bool, device=h.device)  # τ = 0 needs no acceptance
        hit = torch.cat([first, accepted], dim=1)  # [B, γ+1]
        tau = torch.where(hit, idx, torch.zeros_like(idx)).amax(dim=1)  # [B]
    residual = plan.residuals[torch.arange(b, device=h.device), tau]  # [B, V]
    return VerifyResult(num_accepted=tau, next_token=sample_from(residual, generator))


def plan_law(plan: VerifyPlan) -> Tensor:
    """Exact joint law of (τ, Y): [B, γ+1, V] with entry [b, i, y] = P(τ = i, Y = y)."""
    h = plan.accept_probs  # [B, γ]
    b = h.shape[0]
    one = torch.ones((b, 1), dtype=h.dtype, device=h.device)
    if plan.rule == "first_reject":
        # P(τ = i) = h_1 ... h_i (1 - h_{i+1}), with h_{γ+1} := 0.
        reach = torch.cat([one, torch.cumprod(h, dim=1)], dim=1)  # [B, γ+1]
        stop = torch.cat([1 - h, one], dim=1)  # [B, γ+1]
        p_tau = reach * stop
    else:
        # P(τ = i) = h_i (1 - h_{i+1}) ... (1 - h_γ), with h_0 := 1.
        rej_after = torch.flip(torch.cumprod(torch.flip(1 - h, [1]), dim=1), [1])  # [B, γ]
        none_after = torch.cat([rej_after, one], dim=1)  # [B, γ+1]: column i = Π_{j>i} (1-h_j)
        p_tau = torch.cat([one, h], dim=1) * none_after  # [B, γ+1]
    return p_tau.unsqueeze(-1) * plan.residuals
