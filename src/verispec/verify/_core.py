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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

import torch
from torch import Tensor

from verispec.sampling import Randomness, choose_rows, sample_from

__all__ = [
    "Verifier",
    "VerifyPlan",
    "VerifyResult",
    "check_verifier_inputs",
    "draw",
    "draw_rows",
    "normalise_or",
    "plan_law",
    "residual_from_weights",
    "restrict",
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


ResidualAt = Callable[[Tensor], Tensor]  # τ [B] int64 -> [B, V]: Y's law given τ, per row


class VerifyPlan:
    """Everything random about one verification, made explicit.

    Attributes:
        accept_probs: [B, γ] h_i, the probability that the uniform η_i accepts position i.
        residuals: [B, γ+1, V] distribution of Y given τ = i (row γ is the bonus distribution),
            built on first use: a draw needs only :meth:`residual` at the τ it drew, the exact
            law all of them.
        rule: ``"first_reject"`` (τ = number of leading acceptances; token verification) or
            ``"last_accept"`` (τ = largest accepted i, 0 if none; block verification).
        lengths: [B] int64 γ_b, the real draft length of each row of a ragged batch (None:
            every row has γ). Entries of ``accept_probs`` beyond γ_b are 0 and
            ``residuals[b, γ_b]`` is the bonus distribution (see :func:`restrict`).

    A plan is made from all the residuals ([B, γ+1, V]) or from ``residual_at``, the function
    giving each row's residual at one position (τ [B] -> [B, V]); either way the draw and the
    exact law read the same numbers.
    """

    def __init__(self, accept_probs: Tensor, residuals: Tensor | None, rule: Rule,
                 lengths: Tensor | None = None, *, residual_at: ResidualAt | None = None,
                 ) -> None:
        if (residuals is None) == (residual_at is None):
            raise ValueError("a plan takes exactly one of residuals and residual_at")
        self.accept_probs = accept_probs
        self.rule = rule
        self.lengths = lengths
        self._residuals = residuals
        self._residual_at = residual_at

    def residual(self, tau: Tensor) -> Tensor:
        """[B, V]: row b's distribution of Y given τ = tau[b] (tau [B] int64)."""
        if self._residual_at is not None:
            return self._residual_at(tau)
        rows = torch.arange(tau.shape[0], device=tau.device)
        return self._residuals[rows, tau]  # type: ignore[index]

    @property
    def residuals(self) -> Tensor:
        """[B, γ+1, V], every position's residual (from :meth:`residual` when lazy)."""
        if self._residuals is None:
            b, gamma = self.accept_probs.shape
            dev = self.accept_probs.device
            self._residuals = torch.stack(
                [self.residual(torch.full((b,), i, dtype=torch.int64, device=dev))
                 for i in range(gamma + 1)], dim=1)
        return self._residuals


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


def residual_from_weights(target_probs: Tensor,
                          weights_at: Callable[[Tensor, Tensor], Tensor]) -> ResidualAt:
    """The ``residual_at`` of a plan whose residual at τ < γ is a normalised weight vector
    and at τ = γ the bonus p_γ (token and block verification).

    Args:
        target_probs: [B, γ+1, V] p.
        weights_at: (rows [B], positions [B] in [0, γ)) -> [B, V] non-negative weights; a
            zero-mass row falls back to p at that position (:func:`normalise_or`).
    """
    b, g1 = target_probs.shape[:2]
    gamma = g1 - 1
    rows = torch.arange(b, device=target_probs.device)

    def residual_at(tau: Tensor) -> Tensor:  # [B] -> [B, V]
        p = target_probs[rows, tau]  # [B, V]
        if gamma == 0:
            return p
        w = weights_at(rows, tau.clamp(max=gamma - 1))  # [B, V]
        return torch.where((tau == gamma)[:, None], p, normalise_or(w, p))

    return residual_at


def draw(plan: VerifyPlan, generator: torch.Generator) -> VerifyResult:
    """Sample (τ, Y) for every row of a plan with uniforms from one ``generator``."""
    h = plan.accept_probs  # [B, γ]
    eta = torch.rand(h.shape, generator=generator, dtype=h.dtype, device=h.device)
    tau = _tau(eta < h, plan.rule)  # P(eta_i < h_i) = h_i exactly for eta in [0, 1)
    return VerifyResult(num_accepted=tau, next_token=sample_from(plan.residual(tau), generator))


def restrict(plan: VerifyPlan, target_probs: Tensor, lengths: Tensor | None,
             last_accept: Tensor | None = None) -> VerifyPlan:
    """The plan of a ragged batch: row b keeps only its first γ_b = ``lengths[b]`` draft tokens.

    A plan computed on padded blocks is right for positions < γ_b of row b, because every
    h_i and residual depends only on the draft prefix up to i — except where the last
    position is special: the bonus distribution ``residuals[b, γ_b]`` is p at position γ_b,
    and a verifier whose h_γ has its own formula (block verification's h_γ = p_γ) passes
    ``last_accept`` [B, γ+1], whose entry γ_b becomes h_{γ_b}. Acceptances beyond γ_b are 0.

    Args:
        plan: accept_probs [B, γ], residuals [B, γ+1, V].
        target_probs: [B, γ+1, V] p.
        lengths: [B] int64 in [0, γ], or None (nothing to restrict).
    """
    if lengths is None:
        return plan
    b, gamma = plan.accept_probs.shape
    dev = plan.accept_probs.device
    g = lengths.to(device=dev, dtype=torch.int64)[:, None]  # [B, 1]
    pos = torch.arange(1, gamma + 1, device=dev)[None]  # [1, γ]: h[:, i-1] is h_i
    h = torch.where(pos <= g, plan.accept_probs, torch.zeros_like(plan.accept_probs))
    if last_accept is not None and gamma > 0:
        last = last_accept.gather(1, g).expand(b, gamma)  # [B, γ]
        h = torch.where(pos == g, last, h)
    bonus = target_probs[torch.arange(b, device=dev), g[:, 0]]  # [B, V]

    def residual_at(tau: Tensor) -> Tensor:  # [B] -> [B, V]
        return torch.where((tau == g[:, 0])[:, None], bonus, plan.residual(tau))

    return VerifyPlan(h, None, plan.rule, g[:, 0], residual_at=residual_at)


def draw_rows(plan: VerifyPlan, randoms: Sequence[Randomness]) -> VerifyResult:
    """Sample (τ, Y) for every row, row b's coins and Y from its own :class:`Randomness`.

    Row b draws exactly γ_b coins (``plan.lengths``) and then one Y, in that order — the
    same calls a batch of one makes, so a row's outcome does not depend on its batch.
    """
    h = plan.accept_probs  # [B, γ]
    b, gamma = h.shape
    if len(randoms) != b:
        raise ValueError(f"{len(randoms)} random sources for {b} rows")
    lengths = [gamma] * b if plan.lengths is None else plan.lengths.tolist()
    accepted = torch.zeros((b, gamma), dtype=torch.bool, device=h.device)
    for row, (rand, g) in enumerate(zip(randoms, lengths, strict=True)):
        if g:
            accepted[row, :g] = rand.coins(h[row, :g])
    tau = _tau(accepted, plan.rule)
    residual = plan.residual(tau)  # [B, V]
    y = torch.cat(choose_rows(randoms, list(residual.split(1))))  # [B]
    return VerifyResult(num_accepted=tau, next_token=y)


def _tau(accepted: Tensor, rule: Rule) -> Tensor:
    """τ [B] from the coins [B, γ] under ``rule``."""
    b, gamma = accepted.shape
    if rule == "first_reject":
        return accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)
    idx = torch.arange(0, gamma + 1, device=accepted.device).expand(b, gamma + 1)
    first = torch.ones((b, 1), dtype=torch.bool, device=accepted.device)  # τ = 0 always reachable
    hit = torch.cat([first, accepted], dim=1)  # [B, γ+1]
    return torch.where(hit, idx, torch.zeros_like(idx)).amax(dim=1)


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
