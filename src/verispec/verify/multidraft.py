"""Multi-draft ("batch") speculative verification: Algorithm 4 of
*A Theoretical Perspective for Speculative Decoding Algorithm* (Yin et al., NeurIPS 2024,
Section 3.2, Theorem 3).

Lossless (Theorem 3, first part; proof in Appendix D, Theorem 9): the emitted tokens follow
the target p exactly, provided the M drafts are i.i.d. from q given the shared context.

The paper writes p for the draft and q for the target; here p = target and q = draft as
everywhere in verispec. In our letters, with X^m_1..X^m_γ the tokens of draft m, q_0 the
draft distribution at the shared position 0 and r^1 = p(· | context):

* for m = 1..M: accept X^m_1 with probability a_m = min{1, r^m(X^m_1) / q_0(X^m_1)};
  - accepted: verify X^m_2..X^m_γ with token verification against p along draft m
    (rejection at position t ≥ 2: Y ~ [p_t - q_t]_+ normalised; all γ accepted: the bonus
    Y ~ p at position γ of draft m), keep draft m and stop;
  - rejected: r^{m+1} = [r^m - q_0]_+ normalised (Algorithm 4, line 19), try draft m+1;
* all M first tokens rejected: τ = 0 and Y ~ r^{M+1} (line 28; the residual is the one
  defined by the proof of Theorem 9, not subtracted a second time).

The verification is depth-first: once a first token is accepted, the other drafts are never
looked at. Like the single-draft verifiers it is split into a deterministic plan
(:class:`MultiDraftPlan`) and a draw; :func:`branch_plan` turns the plan, for a chosen branch,
into an ordinary :class:`~verispec.verify._core.VerifyPlan`, so the sampler
(:func:`multidraft_draw`) and the exact law (:func:`multidraft_law`) share
:func:`~verispec.verify._core.draw` / :func:`~verispec.verify._core.plan_law`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from verispec.verify._core import (
    VerifyPlan,
    VerifyResult,
    check_verifier_inputs,
    draw,
    draw_rows,
    normalise_or,
    plan_law,
)
from verispec.sampling import Randomness
from verispec.verify.token import token_plan

__all__ = [
    "MultiDraftPlan",
    "branch_plan",
    "multidraft_draw",
    "multidraft_draw_rows",
    "multidraft_law",
    "multidraft_plan",
    "multidraft_verify",
]


@dataclass
class MultiDraftPlan:
    """Everything random about one multi-draft verification, made explicit.

    Attributes:
        first_accept: [B, M] a_m = min{1, r^m(X^m_1) / q_0(X^m_1)}, the probability of
            accepting draft m's first token once drafts 1..m-1 have been rejected
            (all 0 when γ = 0: there is no draft token to accept).
        residuals: [B, M+1, V] r^1..r^{M+1}; r^1 = p at position 0, and Y ~ r^{M+1} when
            every first token is rejected (all equal to p at position 0 when γ = 0).
        tail: token-verification plan of positions 2..γ of every draft, rows flattened as
            b·M + m: accept_probs [B·M, γ-1], residuals [B·M, γ, V] (row γ-1 is the bonus
            distribution p at position γ of draft m). None when γ = 0.
        lengths: [B] int64 γ_b of a ragged batch, or None.
    """

    first_accept: Tensor
    residuals: Tensor
    tail: VerifyPlan | None
    lengths: Tensor | None = None

    @property
    def num_drafts(self) -> int:
        return int(self.first_accept.shape[1])


def _check(target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor) -> None:
    if target_probs.dim() != 4 or draft_probs.dim() != 4 or draft_tokens.dim() != 3:
        raise ValueError(
            "expected target_probs [B, M, γ+1, V], draft_probs [B, M, γ, V], draft_tokens "
            f"[B, M, γ]; got {tuple(target_probs.shape)}, {tuple(draft_probs.shape)}, "
            f"{tuple(draft_tokens.shape)}"
        )
    if target_probs.shape[1] < 1:
        raise ValueError(f"the number of drafts M must be >= 1, got {target_probs.shape[1]}")
    b, m = target_probs.shape[:2]
    if draft_probs.shape[:2] != (b, m) or draft_tokens.shape[:2] != (b, m):
        raise ValueError(
            f"batch/draft dimensions differ: target_probs {tuple(target_probs.shape[:2])}, "
            f"draft_probs {tuple(draft_probs.shape[:2])}, "
            f"draft_tokens {tuple(draft_tokens.shape[:2])}"
        )
    check_verifier_inputs(target_probs.flatten(0, 1), draft_probs.flatten(0, 1),
                          draft_tokens.flatten(0, 1))


def multidraft_plan(
    target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, *,
    lengths: Tensor | None = None,
) -> MultiDraftPlan:
    """First-token acceptance probabilities, residual chain and tail plans of Algorithm 4.

    Args:
        target_probs: [B, M, γ+1, V] p along each draft; position 0 is shared by all drafts
            (the values of draft 0 are used).
        draft_probs: [B, M, γ, V] q along each draft, exactly as sampled from; position 0 is
            shared (draft 0's row is used).
        draft_tokens: [B, M, γ] int64; X^1_1..X^M_1 must be i.i.d. from q_0.
        lengths: [B] int64 γ_b ≤ γ for a ragged batch (a row with γ_b = 0 has no draft: its
            first-token acceptances are 0 and Y ~ p).
    """
    _check(target_probs, draft_probs, draft_tokens)
    b, m, g1, v = target_probs.shape
    p0 = target_probs[:, 0, 0]  # [B, V]
    if g1 == 1:  # γ = 0: no draft token to accept, Y ~ p
        return MultiDraftPlan(p0.new_zeros((b, m)), p0[:, None].expand(b, m + 1, v), None)
    q0 = draft_probs[:, 0, 0]  # [B, V]
    x1 = draft_tokens[:, :, 0]  # [B, M] first tokens
    q_x1 = q0.gather(1, x1)  # [B, M]
    residuals = [p0]  # residuals[k]: [B, V], r^{k+1}
    accept = []
    for j in range(m):  # loop over drafts only; rows stay vectorised
        r = residuals[-1]
        accept.append(torch.clamp(r.gather(1, x1[:, j : j + 1]) / q_x1[:, j : j + 1], max=1.0))
        residuals.append(normalise_or((r - q0).clamp_min(0), r))
    tail_lengths = None if lengths is None else (lengths - 1).clamp_min(0).repeat_interleave(m)
    tail = token_plan(
        target_probs[:, :, 1:].flatten(0, 1),  # [B·M, γ, V]
        draft_probs[:, :, 1:].flatten(0, 1),  # [B·M, γ-1, V]
        draft_tokens[:, :, 1:].flatten(0, 1),  # [B·M, γ-1]
        lengths=tail_lengths,
    )
    first, chain = torch.cat(accept, dim=1), torch.stack(residuals, dim=1)  # [B, M], [B, M+1, V]
    if lengths is not None:  # rows without a draft: nothing to accept, Y ~ p
        none = (lengths == 0).to(first.device)
        first = torch.where(none[:, None], torch.zeros_like(first), first)
        chain = torch.where(none[:, None, None], p0[:, None], chain)
    return MultiDraftPlan(first, chain, tail, lengths)


def branch_plan(plan: MultiDraftPlan, branch: Tensor, accepted: Tensor) -> VerifyPlan:
    """The single-draft plan that remains once the first-token stage is decided.

    Args:
        plan: the multi-draft plan.
        branch: [B] int64, the draft whose first token was accepted (ignored where not).
        accepted: [B] bool, whether any first token was accepted.
    Returns:
        A ``first_reject`` :class:`VerifyPlan` with accept_probs [B, γ] (column 0 is 1 or 0:
        the already decided first token) and residuals [B, γ+1, V] (row 0 is r^{M+1}).
    """
    final = plan.residuals[:, -1:]  # [B, 1, V] r^{M+1}
    if plan.tail is None:
        return VerifyPlan(plan.first_accept[:, :0], final, "first_reject")  # [B, 0], [B, 1, V]
    b, m = plan.first_accept.shape
    rows = torch.arange(b, device=branch.device) * m + branch  # [B] rows of the tail plan
    h = torch.cat([accepted.to(final.dtype)[:, None], plan.tail.accept_probs[rows]], dim=1)
    residuals = torch.cat([final, plan.tail.residuals[rows]], dim=1)  # [B, γ+1, V]
    return VerifyPlan(h, residuals, "first_reject", plan.lengths)


def multidraft_draw(plan: MultiDraftPlan, generator: torch.Generator) -> VerifyResult:
    """Sample (branch, τ, Y) for every row of a plan; extras["branch"] is 0 when τ = 0."""
    a = plan.first_accept  # [B, M]
    eta = torch.rand(a.shape, generator=generator, dtype=a.dtype, device=a.device)
    hit = eta < a  # [B, M]; independent, so the first hit is draft m w.p. Π_{j<m}(1-a_j)·a_m
    accepted = hit.any(dim=1)  # [B]
    branch = torch.where(accepted, hit.to(torch.int64).argmax(dim=1), 0)  # [B] first hit
    result = draw(branch_plan(plan, branch, accepted), generator)
    result.extras["branch"] = branch
    return result


def multidraft_draw_rows(plan: MultiDraftPlan, randoms: Sequence[Randomness]) -> VerifyResult:
    """:func:`multidraft_draw` with row b's decisions from its own :class:`Randomness`: its
    M first-token coins (none when γ_b = 0), then the branch's coins, then Y."""
    a = plan.first_accept  # [B, M]
    b, m = a.shape
    lengths = [None] * b if plan.lengths is None else plan.lengths.tolist()
    hit = torch.zeros((b, m), dtype=torch.bool, device=a.device)
    for row, (rand, g) in enumerate(zip(randoms, lengths, strict=True)):
        if g != 0 and plan.tail is not None:
            hit[row] = rand.coins(a[row])
    accepted = hit.any(dim=1)  # [B]
    branch = torch.where(accepted, hit.to(torch.int64).argmax(dim=1), 0)  # [B] first hit
    result = draw_rows(branch_plan(plan, branch, accepted), randoms)
    result.extras["branch"] = branch
    return result


def multidraft_law(plan: MultiDraftPlan) -> Tensor:
    """Exact law of (branch, τ, Y): [B, M, γ+1, V], entry [b, m, t, y] = P(branch = m, τ = t,
    Y = y). τ = 0 is reported with branch 0, so entries [b, m ≥ 1, 0, :] are zero."""
    a = plan.first_accept  # [B, M]
    b, m = a.shape
    g1 = 1 if plan.tail is None else plan.tail.residuals.shape[1] + 1
    law = a.new_zeros((b, m, g1, plan.residuals.shape[-1]))
    reach = torch.ones(b, dtype=a.dtype, device=a.device)  # P(drafts 1..j all rejected)
    for j in range(m):
        branch = torch.full((b,), j, dtype=torch.int64, device=a.device)
        accepted = torch.ones(b, dtype=torch.bool, device=a.device)
        given = plan_law(branch_plan(plan, branch, accepted))  # [B, γ+1, V] given branch j
        law[:, j] += (reach * a[:, j])[:, None, None] * given
        reach = reach * (1 - a[:, j])
    zero = torch.zeros(b, dtype=torch.int64, device=a.device)
    none = plan_law(branch_plan(plan, zero, zero.bool()))  # [B, γ+1, V], all mass at τ = 0
    law[:, 0] += reach[:, None, None] * none
    return law


def multidraft_verify(
    target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, generator: torch.Generator
) -> VerifyResult:
    """Multi-draft verification (Algorithm 4; lossless by Theorem 3).

    Args:
        target_probs: [B, M, γ+1, V]; draft_probs: [B, M, γ, V]; draft_tokens: [B, M, γ].
    Returns:
        num_accepted [B], next_token [B] and extras["branch"] [B] (index of the draft whose
        tokens X^branch_1..X^branch_τ are kept; 0 if τ = 0).
    """
    return multidraft_draw(multidraft_plan(target_probs, draft_probs, draft_tokens), generator)
