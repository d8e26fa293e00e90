"""Draft lengths chosen for a whole batch (``--gamma auto`` with more than one active row).

One-row costs say whether speculation pays for a request alone; in a batch the target pass
it lengthens is already R rows wide, and on a machine whose pass time grows with R × k the
extra tokens cost what plain decoding of other rows would have cost. Each iteration the
batch policy chooses every ``auto`` row's γ_b to maximise the batch's expected tokens per
second under the measured :class:`~verispec.engine.costs.BatchCosts`:

    rate(γ_1..γ_R) = Σ_b E[tokens](α_b, γ_b) / (max_b γ_b · t_draft(R) + t_target(R, max_b γ_b + 1))

with α_b each row's own estimate (its :class:`~verispec.engine.gamma.AutoGamma`: its
acceptances and the pair's prior) and E[tokens] the i.i.d. model's (1 − α^{γ+1}) / (1 − α).

**Search.** The engine pads every row's block to the longest, so the cost depends on the
γs only through g = max_b γ_b (and the rows a multi-draft request forks while it drafts);
at a given g every row's E[tokens] grows with γ_b, so the best allocation with maximum g
gives each row min(max(g, floor_b), cap_b). Trying every g from 0 to the largest cap (at
most ``max_gamma`` + 1 evaluations) therefore finds the exact optimum of the model for
single-draft rows; ties go to the shorter g. Rows with a fixed γ keep it (their blocks
count in g and their tokens, at the prior acceptance, in the numerator).

The choice depends only on the past (the rows' observed acceptances and the costs timed at
start-up), never on the current draft, so every lossless method stays lossless. A batch of
one row, or one whose ``auto`` rows have no measured batch grid (or different ones), is
given the per-request choice of :meth:`AutoGamma.choose`, exactly as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from verispec.engine.costs import BatchCosts
from verispec.engine.gamma import PRIOR_ALPHA, AutoGamma, GammaPolicy, expected_tokens
from verispec.engine.request import Row

__all__ = ["RowDemand", "batch_choice", "choose_gammas"]


@dataclass(frozen=True)
class RowDemand:
    """What the batch policy knows of one row.

    Attributes:
        alpha: the row's estimated acceptance rate.
        floor: the shortest draft it may be given.
        cap: the longest (its ``max_gamma``, the room left, 0 while it may not draft).
        forks: cache rows it occupies while drafting (M for M drafts, else 1).
        fixed: its γ is not the policy's to choose (it drafts ``cap`` tokens).
    """

    alpha: float
    floor: int
    cap: int
    forks: int = 1
    fixed: bool = False

    def gamma(self, g: int) -> int:
        """The row's γ when the batch's longest draft is g."""
        if self.fixed:
            return self.cap
        return min(max(g, self.floor), self.cap)


def batch_rate(demands: Sequence[RowDemand], costs: BatchCosts, g: int) -> float:
    """Expected tokens per second of the batch when its longest draft is g."""
    gammas = [d.gamma(g) for d in demands]
    rows = sum(d.forks if gamma > 0 else 1 for d, gamma in zip(demands, gammas, strict=True))
    tokens = sum(expected_tokens(d.alpha, gamma) for d, gamma in zip(demands, gammas, strict=True))
    return tokens / costs.iteration(rows, max(gammas, default=0))


def batch_choice(demands: Sequence[RowDemand], costs: BatchCosts) -> list[int]:
    """Every row's γ: the longest draft g in [0, max cap] of highest :func:`batch_rate`
    (ties: the shorter), each row at :meth:`RowDemand.gamma` of it."""
    top = max((d.cap for d in demands), default=0)
    rates = [batch_rate(demands, costs, g) for g in range(top + 1)]
    best = max(range(top + 1), key=lambda g: (rates[g], -g))
    return [d.gamma(best) for d in demands]


def _shared_costs(policies: Sequence[GammaPolicy]) -> BatchCosts | None:
    """The batch grid every ``auto`` row shares (None: none, or several)."""
    grids = {id(p.costs.batch): p.costs.batch for p in policies if isinstance(p, AutoGamma)}
    if len(grids) != 1:
        return None
    return next(iter(grids.values()))


def choose_gammas(rows: Sequence[Row], caps: Sequence[int]) -> list[int]:
    """γ for every active row of an iteration; ``caps[b]`` is the longest draft row b has
    room for. One row, or no shared batch grid: each policy's own :meth:`choose`."""
    policies: list[GammaPolicy] = [r.request.gamma for r in rows]  # type: ignore[misc]
    costs = _shared_costs(policies) if len(rows) > 1 else None
    if costs is None:
        return [min(p.choose(), cap) for p, cap in zip(policies, caps, strict=True)]
    demands = []
    for row, policy, cap in zip(rows, policies, caps, strict=True):
        forks = row.num_drafts
        if isinstance(policy, AutoGamma):
            floor, top = policy.batch_bounds()
            top = max(min(top, cap), 0)
            demands.append(RowDemand(policy.alpha, min(floor, top), top, forks))
        else:
            demands.append(RowDemand(PRIOR_ALPHA, 0, max(min(policy.choose(), cap), 0), forks,
                                     fixed=True))
    return batch_choice(demands, costs)
