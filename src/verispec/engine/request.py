"""A request, as submitted to the engine, and the row it occupies while it decodes."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from verispec.checks import check_positive
from verispec.drafters.base import Drafter
from verispec.engine.gamma import FixedGamma, GammaPolicy
from verispec.engine.protocols import Method
from verispec.engine.stats import Stats
from verispec.models.base import CausalLM, ContextTooLongError
from verispec.sampling import Randomness, Sampling

__all__ = ["GenerationOutput", "Request", "Row", "accept_tokens", "check_request"]


@dataclass
class GenerationOutput:
    """The tokens a request generated and its statistics."""

    tokens: list[int]
    stats: Stats


@dataclass
class Request:
    """One generation request.

    Attributes:
        prompt: token ids to condition on (at least one).
        method: how drafts are verified.
        sampling: the warp applied to p and q (already adjusted by the method).
        max_new_tokens: the budget.
        random: the request's source of random decisions (its own generator).
        gamma: draft length policy (an int is a fixed γ; 0 is plain decoding).
        drafter: who drafts for it (None: no draft, plain decoding).
        on_tokens: called with each accepted block of new tokens.
        ignore_eos: EOS does not end the request: it decodes to its budget (or the context
            window). Tokens after an EOS are drawn exactly as any other, from the method's
            law at the extended context, so a lossless method still samples the target's
            law (that of the target without EOS ids).
        streamed: the caller sees tokens as they come (``on_tokens`` streams them), so the
            time to the first token counts: ``gamma="auto"`` then decodes it without the
            draft's reading of the prompt. A request returned whole (False) may read and
            draft from its first iteration. Either way γ depends only on the past.
    """

    prompt: list[int]
    method: Method
    sampling: Sampling
    max_new_tokens: int
    random: Randomness
    gamma: GammaPolicy | int = 0
    drafter: Drafter | None = None
    on_tokens: Callable[[list[int]], None] | None = None
    ignore_eos: bool = False
    streamed: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.gamma, int):
            self.gamma = FixedGamma(self.gamma)
        if self.gamma.max_gamma > 0 and self.drafter is None:
            raise ValueError("gamma > 0 needs a drafter")


def check_request(target: CausalLM, prompt: Sequence[int], max_new_tokens: int) -> None:
    """Reject an empty prompt, a budget < 1 and a prompt that fills the context window."""
    if not prompt:
        raise ValueError("the prompt is empty: at least one token is needed to condition on")
    check_positive("max_new_tokens", max_new_tokens)
    if target.max_length is not None and len(prompt) >= target.max_length:
        raise ContextTooLongError(
            f"the prompt has {len(prompt)} tokens; {target.name}'s context window is "
            f"{target.max_length} tokens, leaving no room to generate"
        )


def accept_tokens(
    block: Sequence[int], eos_token_ids: frozenset[int], budget: int
) -> tuple[list[int], str]:
    """Clamp an accepted block X_1..X_τ, Y: stop after the first EOS and at ``budget``.

    Returns the tokens to emit and why generation stops ("" if it does not).
    """
    out: list[int] = []
    for token in block:
        if len(out) == budget:
            return out, "max_new_tokens"
        out.append(int(token))
        if int(token) in eos_token_ids:
            return out, "eos"
    return out, ("max_new_tokens" if len(out) == budget else "")


@dataclass
class Row:
    """A request while it occupies a slot of the batch (what drafters see of it)."""

    id: int
    request: Request
    context: list[int]
    stats: Stats
    state: Any = None
    emitted: list[int] = field(default_factory=list)
    start: float = field(default_factory=time.perf_counter)
    cancelled: bool = False

    @property
    def random(self) -> Randomness:
        return self.request.random

    @property
    def sampling(self) -> Sampling:
        return self.request.sampling

    @property
    def method(self) -> Method:
        return self.request.method

    @property
    def matching(self) -> bool:
        """Temperature 0 with a method that is then plain matching: no p or q is built."""
        return self.sampling.greedy and self.method.matches_at_greedy

    @property
    def num_drafts(self) -> int:
        return 1 if self.matching else self.method.num_drafts

    @property
    def with_next(self) -> bool:
        return self.method.needs_next_probs

    @property
    def done(self) -> bool:
        return bool(self.stats.stop_reason)

    def output(self) -> GenerationOutput:
        return GenerationOutput(tokens=list(self.emitted), stats=self.stats)
