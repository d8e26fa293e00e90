"""PEARL's schedule (Algorithm 2 of *Parallel Speculative Decoding with Adaptive Draft Length*,
Liu et al.) as a state machine.

The algorithm alternates between two modes; every *phase* runs the draft model and the
target model at the same time (in the concurrent engine) and ends with one verification:

* **pre-verify** (mode ``"pre"``): the draft samples X_1..X_γ after the committed context
  while the target computes p(· | context) in parallel; X_1 alone is then verified. Accepted:
  X_1 is committed and X_2..X_γ become the *window* awaiting verification (mode ``"post"``).
  Rejected: Y ~ norm(max(0, p - q_1)) is committed and X_2..X_γ are dropped (mode ``"pre"``).
* **post-verify** (mode ``"post"``, window W = W_1..W_k unverified): the target scores W in
  one forward, giving p after the context and after each W_i, while the draft keeps drafting
  X'_1..X'_γ after context + W. The block W_1..W_k, X'_1 is verified with the chosen verifier
  (token or block verification), *without* a bonus token: if all of it is accepted it is
  committed and X'_2..X'_γ become the next window (mode ``"post"``); otherwise W^τ, Y is
  committed and the mode switches back to ``"pre"``.

Ablations (Table 3 of the paper): without pre-verify the target idles while the draft
drafts a fresh window (a ``"draft-only"`` phase) and post-verify then checks all of it;
without post-verify the draft idles while the target verifies the window and a bonus token
is sampled from the last row, as in ordinary speculative decoding (a ``"verify-only"``
phase). Without both, the schedule *is* sequential speculative decoding.

Why it is lossless: every verification checks a block of tokens drafted autoregressively
from q after the committed context, with a lossless verifier; dropping the bonus token on
full acceptance only replaces one exact target sample by the continuation of the same
process from the longer context, which has the target law by induction. The exact
enumeration in :mod:`verispec.methods.pearl.reference` proves it on toy models.

Randomness: every random number comes from the request's ``torch.Generator``, drawn by the
coordinator in a fixed order per phase — γ uniforms for the draft's tokens (inverse-CDF
sampling in the draft side, see :func:`sample_with_uniform`), then k+1 uniforms for the
verification of a k-token block (k acceptance coins, one for Y). Concurrency therefore
cannot change the output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from verispec.verify import VerifyPlan, block_plan, token_plan

__all__ = [
    "PLANS",
    "Decide",
    "PearlConfig",
    "PearlState",
    "Phase",
    "PhaseKind",
    "Resolution",
    "decide_with_uniforms",
    "draft_uniforms",
    "next_phase",
    "resolve",
    "sample_with_uniform",
    "verification_uniforms",
]

PhaseKind = Literal["pre-verify", "draft-only", "post-verify", "verify-only"]
PlanFn = Callable[[Tensor, Tensor, Tensor], VerifyPlan]
#: verifier name -> plan function (the verifier applied to every verified block).
PLANS: dict[str, PlanFn] = {"token": token_plan, "block": block_plan}


@dataclass(frozen=True)
class PearlConfig:
    """What a PEARL run does.

    Attributes:
        gamma: window size γ >= 1 (draft tokens per drafting step).
        verifier: ``"token"`` or ``"block"`` — how each verified block is checked.
        pre_verify: run the target during drafting (False: the Table 3 ablation).
        post_verify: keep drafting during verification (False: the Table 3 ablation).
    """

    gamma: int
    verifier: str = "block"
    pre_verify: bool = True
    post_verify: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.gamma, bool) or not isinstance(self.gamma, int) or self.gamma < 1:
            raise ValueError(f"PEARL's window gamma must be an integer >= 1, got {self.gamma!r}")
        if self.verifier not in PLANS:
            raise ValueError(f"PEARL's verifier must be one of {', '.join(PLANS)}, "
                             f"got {self.verifier!r}")
        for name in ("pre_verify", "post_verify"):
            if type(getattr(self, name)) is not bool:
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")

    @property
    def plan_fn(self) -> PlanFn:
        return PLANS[self.verifier]


@dataclass
class PearlState:
    """The schedule's state between phases.

    Attributes:
        context: committed tokens (prompt + output so far).
        mode: ``"pre"`` (the next phase drafts after ``context``) or ``"post"`` (``window``
            awaits verification).
        window: unverified draft tokens that follow ``context`` (mode ``"post"`` only).
        window_q: [V] float64 each: the q every window token was drawn from.
    """

    context: list[int]
    mode: Literal["pre", "post"] = "pre"
    window: list[int] = field(default_factory=list)
    window_q: list[Tensor] = field(default_factory=list)


@dataclass(frozen=True)
class Phase:
    """The work of one phase.

    Attributes:
        kind: which of the four phase types this is.
        draft_context: the draft samples γ tokens after this sequence (None: draft idles).
        target_sequence: the target returns p after each of the last ``target_rows``
            tokens of this sequence (None: target idles).
        target_rows: number of p rows wanted.
    """

    kind: PhaseKind
    draft_context: list[int] | None
    target_sequence: list[int] | None
    target_rows: int


@dataclass
class Resolution:
    """Outcome of a phase.

    Attributes:
        commit: tokens committed by this phase (before EOS/budget clamping); token j was
            verified with target row j.
        verified: size k of the verified block (0: no verification this phase).
        accepted: τ, accepted draft tokens of the block.
        rejected: the block had a rejection (the drafting phase of Theorem 2 ends).
        state: the state for the next phase.
    """

    commit: list[int]
    verified: int
    accepted: int
    rejected: bool
    state: PearlState


#: ``decide(plan, bonus) -> (τ, Y or None)`` for a one-row plan (Y is None when the whole
#: block is accepted and no bonus token is wanted).
Decide = Callable[[VerifyPlan, bool], "tuple[int, int | None]"]


def next_phase(cfg: PearlConfig, state: PearlState) -> Phase:
    """The phase that follows ``state`` (pure; no randomness)."""
    ctx = state.context
    if state.mode == "pre":
        if cfg.pre_verify:
            return Phase("pre-verify", list(ctx), list(ctx), 1)
        return Phase("draft-only", list(ctx), None, 0)
    seq = ctx + state.window
    rows = len(state.window) + 1
    if cfg.post_verify:
        return Phase("post-verify", seq, seq, rows)
    return Phase("verify-only", None, seq, rows)


def resolve(
    cfg: PearlConfig,
    state: PearlState,
    phase: Phase,
    draft_tokens: Sequence[int],
    draft_q: Sequence[Tensor],
    target_p: Tensor | None,
    decide: Decide,
) -> Resolution:
    """Verify the phase's block and move to the next state.

    Args:
        draft_tokens: the γ tokens the draft sampled this phase (empty if it idled).
        draft_q: [V] float64 each, the q every one of them was drawn from.
        target_p: [target_rows, V] float64 p rows (None if the target idled).
        decide: the verification's random decision (see :func:`decide_with_uniforms`).
    """
    ctx = state.context
    if phase.kind == "draft-only":
        nxt = PearlState(ctx, "post", list(draft_tokens), list(draft_q))
        return Resolution([], 0, 0, False, nxt)
    assert target_p is not None
    if phase.kind == "pre-verify":
        block, q_rows, bonus = [draft_tokens[0]], [draft_q[0]], False
    elif phase.kind == "post-verify":
        block = state.window + [draft_tokens[0]]
        q_rows, bonus = state.window_q + [draft_q[0]], False
    else:  # verify-only
        block, q_rows, bonus = list(state.window), list(state.window_q), True
    k = len(block)
    p_rows = target_p[: k + 1] if bonus else torch.cat([target_p[:k], target_p[k - 1 : k]])
    plan = cfg.plan_fn(
        p_rows.unsqueeze(0),  # [1, k+1, V]; without a bonus the last row is a never-used copy
        torch.stack(q_rows).unsqueeze(0) if q_rows else p_rows.new_empty((1, 0, p_rows.shape[-1])),
        torch.tensor([block], dtype=torch.int64),  # [1, k]
    )
    tau, y = decide(plan, bonus)
    if y is None:  # the whole block is accepted and no bonus is drawn: keep drafting
        commit = list(block)
        nxt = PearlState(ctx + commit, "post", list(draft_tokens[1:]), list(draft_q[1:]))
        return Resolution(commit, k, tau, False, nxt)
    commit = list(block[:tau]) + [y]
    return Resolution(commit, k, tau, tau < k, PearlState(ctx + commit, "pre"))


def sample_with_uniform(probs: Tensor, u: float) -> int:
    """Inverse-CDF sampling: the token i with cdf[i-1] <= u·total < cdf[i].

    A token of probability zero is never returned. Deterministic given ``u``, so the draft
    worker samples exactly what the sequential reference samples.

    Args:
        probs: [V] non-negative weights.
        u: a uniform number in [0, 1).
    """
    cdf = torch.cumsum(probs.to(torch.float64), dim=0)  # [V]
    value = torch.tensor([u * float(cdf[-1])], dtype=torch.float64)
    i = int(torch.searchsorted(cdf, value, right=True)[0])
    if i >= cdf.shape[0] or float(probs[i]) <= 0:  # u·total rounded up to the total
        i = int((probs > 0).nonzero()[-1, 0])
    return i


def draft_uniforms(generator: torch.Generator, n: int) -> Tensor:
    """[n] float64 uniforms for the draft's n tokens of one phase."""
    return torch.rand(n, generator=generator, dtype=torch.float64)


def verification_uniforms(generator: torch.Generator, k: int) -> Tensor:
    """[k+1] float64 uniforms for verifying a k-token block (k coins, then one for Y)."""
    return torch.rand(k + 1, generator=generator, dtype=torch.float64)


def decide_with_uniforms(plan: VerifyPlan, bonus: bool, u: Tensor) -> tuple[int, int | None]:
    """τ and Y of a one-row plan from k+1 uniforms (P(coin i accepts) = h_i exactly).

    Args:
        plan: accept_probs [1, k], residuals [1, k+1, V], rule.
        bonus: draw Y from the last residual row when the whole block is accepted.
        u: [k+1] float64 uniforms.
    """
    h = plan.accept_probs[0].to(torch.float64)  # [k]
    k = int(h.shape[0])
    accepted = (u[:k] < h).tolist()
    if plan.rule == "first_reject":
        tau = next((i for i, a in enumerate(accepted) if not a), k)
    else:  # last_accept: the largest accepted index, 0 if none
        tau = max((i + 1 for i, a in enumerate(accepted) if a), default=0)
    if tau == k and not bonus:
        return tau, None
    at = torch.tensor([tau], dtype=torch.int64, device=h.device)
    return tau, sample_with_uniform(plan.residual(at)[0], float(u[k]))
