"""Deliberately wrong verifiers: the negative controls of the exactness tests."""

from __future__ import annotations

from torch import Tensor

from verispec.engine.protocols import SingleDraftMethod
from verispec.verify import VerifyPlan, token_plan

__all__ = ["TargetResidual"]


class TargetResidual(SingleDraftMethod):
    """Token acceptance, but Y ~ p after a rejection instead of the residual (p − q)+: a
    biased verifier every exactness test must catch."""

    def __init__(self) -> None:
        def plan(p: Tensor, q: Tensor, x: Tensor, lengths: Tensor | None = None) -> VerifyPlan:
            good = token_plan(p, q, x, lengths=lengths)  # p [B, γ+1, V], q [B, γ, V], x [B, γ]
            return VerifyPlan(good.accept_probs, p, good.rule, good.lengths)

        super().__init__("token", plan)
