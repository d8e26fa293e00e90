"""Multi-draft speculative decoding as an engine method (``--verifier multidraft``).

Algorithm 4 ("Batch Speculative Sampling") of theoretical-perspective-speculative-decoding.txt,
verified by :func:`verispec.verify.multidraft.multidraft_verify`. Lossless (Theorem 3).

Each iteration the drafter samples M i.i.d. drafts of γ tokens from the shared context; the
engine forks the target and scores all M rows in one batched pass, so the target processes
M·(γ+1) token positions per iteration instead of γ+1 (``Stats.target_tokens_scored``). That
extra compute is the price a fair comparison must charge (block-verification.txt, Appendix
D.1): under query batching it is not free.
"""

from __future__ import annotations

import operator

import torch
from torch import Tensor

from verispec.drafters.base import Draft
from verispec.engine.methods import Method
from verispec.methods import MethodInfo, register
from verispec.verify import VerifyResult
from verispec.verify.multidraft import multidraft_verify

__all__ = ["MultiDraftMethod"]


class MultiDraftMethod(Method):
    """Depth-first verification of M i.i.d. drafts (Algorithm 4; lossless by Theorem 3).

    With M = 1 it is exactly token verification (Algorithm 1 of block-verification.txt).

    Args:
        num_drafts: M ≥ 1, drafts per iteration.
    """

    name = "multidraft"
    lossless = True

    def __init__(self, num_drafts: int = 2) -> None:
        try:
            m = operator.index(num_drafts)  # int-like only: no floats, strings or bools
        except TypeError:
            m = None
        if m is None or isinstance(num_drafts, bool):
            raise ValueError(f"num_drafts must be an integer >= 1, got {num_drafts!r}")
        if m < 1:
            raise ValueError(f"num_drafts must be >= 1, got {m}")
        self.num_drafts = m

    def verify(
        self, target_probs: Tensor, draft: Draft, generator: torch.Generator
    ) -> VerifyResult:
        """Verify the M drafts of one iteration.

        Args:
            target_probs: [M, γ+1, V] p along each draft (row count 1 when γ = 0).
            draft: tokens [M, γ], probs [M, γ, V].
        Returns:
            num_accepted [1], next_token [1], extras["branch"] [1].
        """
        rows = int(draft.tokens.shape[0])
        if draft.gamma > 0 and rows != self.num_drafts:
            raise ValueError(f"{self.name}: expected {self.num_drafts} drafts, got {rows}")
        if target_probs.shape[0] != rows:
            raise ValueError(
                f"{self.name}: target_probs has {target_probs.shape[0]} rows for {rows} drafts"
            )
        return multidraft_verify(
            target_probs[None],  # [1, M, γ+1, V]
            draft.probs.to(target_probs.dtype)[None],  # [1, M, γ, V]
            draft.tokens[None],  # [1, M, γ]
            generator,
        )


register(MethodInfo(
    "multidraft", True,
    "multi-draft speculative decoding (Algorithm 4 of Yin et al. 2024): M i.i.d. drafts "
    "(--num-drafts, default 2) verified depth-first; lossless, costs M·(γ+1) target tokens",
    MultiDraftMethod,
))
