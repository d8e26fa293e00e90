"""The drafter interface: ``propose`` blocks for some rows, then get ``feedback`` on what
was kept. A single prompt is a batch of one, exactly like in the engine.

A drafter sees the engine's rows through :class:`DraftRow`: each has an id, its context
(prompt and output so far), its own :class:`~verispec.sampling.Randomness`, its warp, how
many i.i.d. drafts it wants and whether it verifies by plain matching (temperature 0 with a
method for which that is exact; then q is not needed and not built).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from verispec.sampling import Randomness, Sampling

__all__ = ["Draft", "DraftRow", "Drafter"]


@dataclass
class Draft:
    """The block(s) proposed for one row.

    Attributes:
        tokens: [M, γ] int64 draft tokens (M = 1 unless several drafts were asked for).
        probs: [M, γ, V] q, the exact distribution each token was drawn from (one-hot for
            deterministic drafters); None for a row that verifies by matching.
        next_probs: [M, V] q after the whole block, only when asked for (``with_next``).
        joint: [M, γ] the drafter's joint probability q(x_1..x_j) of each prefix, for
            drafters that rank blocks by likelihood (beam search); else None.
    """

    tokens: Tensor
    probs: Tensor | None = None
    next_probs: Tensor | None = None
    joint: Tensor | None = None

    @property
    def gamma(self) -> int:
        return int(self.tokens.shape[1])


class DraftRow(Protocol):
    """What a drafter knows of one request."""

    id: int
    context: list[int]
    random: Randomness
    sampling: Sampling
    num_drafts: int
    with_next: bool
    matching: bool


class Drafter(ABC):
    """Proposes draft blocks for the rows assigned to it."""

    #: Seconds spent reading requests' contexts (a model drafter's prefills) so far.
    reading_time_s: float = 0.0

    @property
    def forward_calls(self) -> int:
        """Draft-model forward passes so far (0 for model-free drafters)."""
        return 0

    def row_calls(self, row_id: int) -> int:
        """Draft-model forward passes that included request ``row_id`` (prefill included)."""
        return 0

    @property
    def max_length(self) -> int | None:
        """Context window of the draft model (None: no limit of its own)."""
        return None

    @property
    def cost_key(self) -> Hashable:
        """Equal for drafters whose steps cost alike (a model drafter: the draft's weights),
        so that γ auto prices one drafter's steps by another's; this drafter alone by
        default."""
        return id(self)

    def admit(self, rows: Sequence[DraftRow]) -> None:
        """New requests join (a model drafter reads their context at their first draft)."""

    def release(self, rows: Sequence[DraftRow]) -> None:
        """These requests are finished; forget them."""

    @abstractmethod
    def propose(self, rows: Sequence[DraftRow], gammas: Sequence[int]) -> list[Draft]:
        """Draft up to ``gammas[b]`` tokens after ``rows[b].context`` (a drafter may return
        fewer; γ_b = 0 gives an empty draft)."""

    @abstractmethod
    def feedback(self, rows: Sequence[DraftRow], accepted: Sequence[int],
                 branches: Sequence[int]) -> None:
        """Each row's context now ends with its accepted draft tokens and the next token;
        the kept tokens came from draft ``branches[b]``. Only rows that were proposed to."""
