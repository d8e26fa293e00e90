"""What the engine calls: a :class:`Method` verifies drafts, a :class:`Runner` runs a whole
request by a schedule of its own.

A method is the step between scoring and accepting. The engine hands it every row of an
iteration that uses it, as one :class:`VerifyBatch` (ragged draft lengths padded, with
``lengths``), and gets back τ, Y and, for multi-draft methods, the kept draft per row:

* **accepted**: τ_b draft tokens X_1..X_τ of row b are kept;
* **next token** Y_b: recovered (τ < γ_b, from a residual) or bonus (τ = γ_b, from p).

Methods that are not "draft → score → verify" iterations (MJGD's target-only beam search,
PEARL's two concurrent workers) are a kind of their own, :class:`ScheduledMethod`: they carry
their options, and the method table's :class:`Runner` runs a whole request with them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor

from verispec.sampling import Randomness, Sampling
from verispec.verify import VerifyResult

__all__ = ["Method", "Runner", "ScheduledMethod", "SingleDraftMethod", "VerifyBatch"]


@dataclass
class VerifyBatch:
    """The rows of one iteration that a method verifies together.

    Attributes:
        target_probs: [B, M, γ+1, V] warped p along each of the M drafts of each row
            (position 0 is the shared context).
        draft_probs: [B, M, γ, V] q, exactly the distribution each draft token was drawn from.
        draft_tokens: [B, M, γ] int64 (entries beyond ``lengths[b]`` are padding).
        lengths: [B] int64 γ_b, the real draft length of each row.
        next_probs: [B, M, V] q after each whole draft, for methods that ask for it.
        joint: [B, M, γ] the drafter's joint probability of each prefix (beam drafting).
        randoms: each row's source of random decisions.
        states: each row's cross-iteration state (:meth:`Method.new_state`); a stateful
            method replaces entries in place.
    """

    target_probs: Tensor
    draft_probs: Tensor
    draft_tokens: Tensor
    lengths: Tensor
    next_probs: Tensor | None
    joint: Tensor | None
    randoms: Sequence[Randomness]
    states: list[Any]

    @property
    def ragged(self) -> bool:
        return bool((self.lengths != self.draft_tokens.shape[-1]).any())


class Method(ABC):
    """One verification method as the engine sees it.

    Attributes:
        name: registry name.
        lossless: True if the output distribution equals the target's exactly.
        num_drafts: M, drafts per iteration (1 for single-draft methods).
        needs_next_probs: the draft must also return q after its last token.
        matches_at_greedy: at temperature 0 the method is exact matching of the draft
            tokens against the target's argmax, so the engine may skip building p and q.
    """

    name: str = ""
    lossless: bool = True
    num_drafts: int = 1
    needs_next_probs: bool = False
    matches_at_greedy: bool = False

    def new_state(self) -> Any:
        """Cross-iteration state of a new request (None for stateless methods)."""
        return None

    def adjust_sampling(self, sampling: Sampling) -> Sampling:
        """The warp this method samples with (MJSD substitutes the paper's top-20/top-p 0.9)."""
        return sampling

    @abstractmethod
    def verify(self, batch: VerifyBatch) -> VerifyResult:
        """τ [B], Y [B]; multi-draft methods put the kept draft [B] in ``extras["branch"]``,
        lossy ones the step's exact bias in ``bias_tv`` [B]."""


class SingleDraftMethod(Method):
    """A plan-based single-draft verifier ``plan(p, q, tokens, lengths=) -> VerifyPlan``."""

    def __init__(self, name: str, plan: Callable[..., Any], *, lossless: bool = True,
                 matches_at_greedy: bool = True) -> None:
        self.name = name
        self.plan = plan
        self.lossless = lossless
        self.matches_at_greedy = matches_at_greedy

    def verify(self, batch: VerifyBatch) -> VerifyResult:
        from verispec.verify import draw_rows

        p = batch.target_probs[:, 0]  # [B, γ+1, V]
        q = batch.draft_probs[:, 0].to(p.dtype)  # [B, γ, V]
        lengths = batch.lengths if batch.ragged else None
        return draw_rows(self.plan(p, q, batch.draft_tokens[:, 0], lengths=lengths), batch.randoms)


class ScheduledMethod:
    """A method that runs a whole request by a schedule of its own (MJGD, PEARL): it holds
    the options its :class:`Runner` reads and never verifies an engine iteration.

    Attributes:
        name: registry name.
        lossless: True if the output distribution equals the target's exactly.
    """

    name: str = ""
    lossless: bool = True

    def adjust_sampling(self, sampling: Sampling) -> Sampling:
        """The warp this method samples with (MJGD substitutes the paper's warp)."""
        return sampling


class Runner(Protocol):
    """A whole request run by a method's own schedule (MJGD, PEARL).

    ``runner(target, draft, prompt, method=, sampling=, gamma=, max_new_tokens=, random=,
    on_tokens=)`` returns the tokens and :class:`~verispec.engine.stats.Stats` like the
    engine does; ``draft`` is None for methods without a draft model.
    """

    def __call__(self, target: Any, draft: Any, prompt: Sequence[int], *, method: ScheduledMethod,
                  sampling: Sampling, gamma: int | str | None, max_new_tokens: int,
                  random: Randomness, on_tokens: Callable[[list[int]], None] | None) -> Any: ...
