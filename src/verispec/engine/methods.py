"""Methods: how one iteration's draft is verified, plus any state kept across iterations.

A :class:`Method` is what the engine calls between scoring and accepting. Single-draft
lossless verifiers (token, block) are thin wrappers around the pure functions of
:mod:`verispec.verify`; methods with cross-iteration state (greedy block verification's
modified target) or several drafts (multi-draft) implement the same two calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor

from verispec.drafters.base import Draft
from verispec.sampling import Sampling
from verispec.verify import Verifier, VerifyResult

__all__ = ["Method", "SingleDraftMethod"]


class Method(ABC):
    """One verification method as the engine sees it.

    Attributes:
        name: registry name.
        lossless: True if the output distribution equals the target's exactly.
        num_drafts: M, drafts per iteration (1 for single-draft methods).
        needs_next_probs: the draft must also return q after its last token.
        drafter_kind: ``"sample"`` (any sampling drafter) or ``"beam"`` (MJSD).
    """

    name: str = ""
    lossless: bool = True
    num_drafts: int = 1
    needs_next_probs: bool = False
    drafter_kind: str = "sample"

    def reset(self) -> None:
        """Forget cross-iteration state; called at the start of each request."""

    def adjust_sampling(self, sampling: Sampling) -> Sampling:
        """The warp this method samples with (MJSD substitutes the paper's top-20/top-p 0.9)."""
        return sampling

    @abstractmethod
    def verify(self, target_probs: Tensor, draft: Draft, generator: torch.Generator) -> VerifyResult:
        """Decide τ and Y.

        Args:
            target_probs: [M, γ+1, V] warped p along each draft.
            draft: the proposal (tokens [M, γ], probs [M, γ, V], ...).
        Returns:
            VerifyResult with num_accepted [1], next_token [1]; multi-draft methods put the
            index of the kept draft in ``extras["branch"]``.
        """


class SingleDraftMethod(Method):
    """Wraps a stateless verifier ``f(target_probs, draft_probs, draft_tokens, generator)``."""

    def __init__(self, name: str, verifier: Verifier, *, lossless: bool = True) -> None:
        self.name = name
        self.verifier = verifier
        self.lossless = lossless

    def verify(self, target_probs: Tensor, draft: Draft, generator: torch.Generator) -> VerifyResult:
        return self.verifier(
            target_probs, draft.probs.to(target_probs.dtype), draft.tokens, generator
        )
