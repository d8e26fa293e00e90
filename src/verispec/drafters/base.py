"""The drafter interface: ``propose`` a block, then get ``feedback`` on what was kept."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Draft", "Drafter"]


@dataclass
class Draft:
    """A proposed block (or M alternative blocks).

    Attributes:
        tokens: [M, γ] int64 draft tokens (M = 1 unless several drafts were asked for).
        probs: [M, γ, V] q, the exact distribution each token was drawn from (one-hot for
            deterministic drafters).
        next_probs: [M, V] q after the whole block, only when asked for (``with_next=True``).
        joint: [M, γ] the draft model's joint probability q(x_1..x_j) of each prefix, for
            drafters that rank blocks by likelihood (beam search); else None.
    """

    tokens: Tensor
    probs: Tensor
    next_probs: Tensor | None = None
    joint: Tensor | None = None

    @property
    def gamma(self) -> int:
        return int(self.tokens.shape[1])


class Drafter(ABC):
    """Proposes draft blocks for one request at a time."""

    #: True when q is one-hot by construction (n-gram, beam search).
    deterministic: bool = False

    @property
    def forward_calls(self) -> int:
        """Draft-model forward passes so far (0 for model-free drafters)."""
        return 0

    def begin(self, prompt: Sequence[int]) -> None:
        """Start a new request whose context is ``prompt``."""

    @abstractmethod
    def propose(
        self,
        context: Sequence[int],
        gamma: int,
        generator: torch.Generator,
        *,
        num_drafts: int = 1,
        with_next: bool = False,
    ) -> Draft:
        """Draft up to ``gamma`` tokens after ``context`` (a drafter may return fewer)."""

    @abstractmethod
    def feedback(self, context: Sequence[int], num_accepted: int, branch: int = 0) -> None:
        """``context`` now ends with the accepted draft tokens and the next token; the kept
        tokens came from draft ``branch``."""
