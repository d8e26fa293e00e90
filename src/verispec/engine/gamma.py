"""Draft-length policies: how many tokens a request drafts in its next iteration.

A policy sees only the request's past (its own acceptances), never the current draft, so
the draft length is decided before any token of the block is drawn and every lossless
verifier stays lossless with it (the tests prove it by exact enumeration).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from verispec.checks import check_positive
from verispec.models.base import CausalLM

__all__ = ["AutoGamma", "FixedGamma", "GammaPolicy", "PairHistory", "PassCosts", "best_gamma",
           "expected_tokens", "measure_costs"]


class GammaPolicy(Protocol):
    """Chooses γ for each iteration of one request."""

    @property
    def max_gamma(self) -> int:
        """The longest draft this policy may ask for (0: never drafts)."""

    @property
    def label(self) -> int | str:
        """γ as reported in the statistics (an int, or ``"auto"``)."""

    def start(self, prompt_tokens: int, budget: int) -> None:
        """The request's prompt length and token budget, before its first iteration."""

    def choose(self) -> int:
        """γ for the next iteration (the engine caps it by the room left)."""

    def observe(self, drafted: int, accepted: int) -> None:
        """The iteration drafted ``drafted`` tokens and accepted ``accepted`` of them."""


class FixedGamma:
    """The same γ every iteration."""

    def __init__(self, gamma: int) -> None:
        self.gamma = check_positive("gamma", gamma, minimum=0)

    @property
    def max_gamma(self) -> int:
        return self.gamma

    @property
    def label(self) -> int:
        return self.gamma

    def start(self, prompt_tokens: int, budget: int) -> None:
        return None

    def choose(self) -> int:
        return self.gamma

    def observe(self, drafted: int, accepted: int) -> None:
        return None

    def __repr__(self) -> str:
        return str(self.gamma)


#: Target pass sizes timed at start-up; costs in between are interpolated linearly.
PROBE_SIZES = (1, 2, 4, 8, 16)
#: The prior on the acceptance rate: α₀ with the weight of this many observed positions
#: (α₀ is the pair's pooled acceptance over earlier requests once it has HISTORY_MIN positions).
PRIOR_ALPHA, PRIOR_WEIGHT = 0.6, 4.0
HISTORY_MIN = 32
#: After this many iterations at γ = 0, draft one token to keep learning α.
PROBE_EVERY = 16
#: The draft reads a request's context at once when the time drafting is expected to save
#: over this share of the token budget covers that reading.
PAYBACK_SHARE = 0.5


@dataclass(frozen=True)
class PassCosts:
    """Measured seconds of one target pass over k tokens, of one draft step and of the
    draft's reading of a prompt.

    Attributes:
        target: k -> seconds, for the k timed (others are interpolated).
        draft: seconds of one draft forward pass of one token.
        draft_prefill: seconds per token of the draft's prefill of a prompt (0: free).
    """

    target: dict[int, float]
    draft: float
    draft_prefill: float = 0.0

    def target_pass(self, k: int) -> float:
        """Seconds of a target pass over k tokens (linear between timed sizes)."""
        ks = sorted(self.target)
        if k in self.target:
            return self.target[k]
        lo = max((x for x in ks if x < k), default=ks[0])
        hi = min((x for x in ks if x > k), default=ks[-1])
        if lo == hi:  # beyond the timed range: extend the last slope
            lo, hi = ks[-2], ks[-1]
        slope = (self.target[hi] - self.target[lo]) / (hi - lo)
        return self.target[lo] + slope * (k - lo)

    def v(self, k: int) -> float:
        """V(k): a target pass over k tokens relative to one token."""
        return self.target_pass(k) / self.target_pass(1)

    @property
    def c(self) -> float:
        """c = target step / draft step."""
        return self.target_pass(1) / self.draft

    def iteration(self, gamma: int) -> float:
        """Seconds of one iteration that drafts γ tokens: γ draft steps and a target pass
        over γ + 1 tokens."""
        return gamma * self.draft + self.target_pass(gamma + 1)

    def saving(self, alpha: float, gamma: int) -> float:
        """Seconds per token that drafting γ tokens at acceptance α saves over plain
        decoding (negative: it costs)."""
        return self.target_pass(1) - self.iteration(gamma) / expected_tokens(alpha, gamma)

    def describe(self) -> str:
        return (f"target {self.target_pass(1) * 1e3:.1f} ms per token, draft "
                f"{self.draft * 1e3:.1f} ms (c = {self.c:.2f}), draft prefill "
                f"{self.draft_prefill * 1e3:.2f} ms per prompt token; V(k) = "
                + ", ".join(f"V({k}) {self.v(k):.2f}" for k in sorted(self.target) if k > 1))


class PairHistory:
    """The acceptance of one draft/target pair pooled over the requests it has served in
    this process (accepted drafts and tested positions): the prior of the next request's
    :class:`AutoGamma`, so a pair whose drafts are usually accepted starts drafting at once.
    It holds outcomes of earlier iterations only, so a γ chosen from it is still decided
    before the block it drafts."""

    def __init__(self) -> None:
        self.accepted = 0.0
        self.tested = 0.0

    def prior(self) -> float:
        """The pair's pooled α (PRIOR_ALPHA until HISTORY_MIN positions are known)."""
        if self.tested < HISTORY_MIN:
            return PRIOR_ALPHA
        return self.accepted / self.tested

    def add(self, accepted: float, tested: float) -> None:
        self.accepted += accepted
        self.tested += tested


def expected_tokens(alpha: float, gamma: int) -> float:
    """E[tokens per iteration] with i.i.d. acceptance α: (1 − α^{γ+1}) / (1 − α)."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def best_gamma(alpha: float, costs: PassCosts, max_gamma: int) -> int:
    """The γ in [0, max_gamma] that maximises expected tokens per second:
    E[tokens](α, γ) / (γ · t_draft + t_target(γ + 1)); ties go to the shorter draft."""
    rates = [expected_tokens(alpha, g) / costs.iteration(g) for g in range(max_gamma + 1)]
    return max(range(max_gamma + 1), key=lambda g: (rates[g], -g))


class AutoGamma:
    """γ chosen by measurement, per request (``--gamma auto``).

    Each iteration it estimates the request's acceptance rate α from its own past — every
    accepted draft token is a success and every rejection a failure, with a prior of
    ``PRIOR_WEIGHT`` positions at ``PRIOR_ALPHA``, or at the pair's pooled acceptance over
    earlier requests when a :class:`PairHistory` is given — and drafts the γ that maximises expected
    tokens per second under the papers' i.i.d. model with the measured costs (V(k) in the
    denominator). Where speculation does not pay it chooses γ = 0 (plain decoding), drafting
    one token every ``PROBE_EVERY`` iterations to keep its estimate current.

    The draft model reads a request's context at its first draft, which costs
    ``costs.draft_prefill`` per token. A request starts drafting once that reading is
    expected to pay back: when it costs no more than the time drafting saves (at the
    estimated α and best γ) over the tokens decoded so far plus ``PAYBACK_SHARE`` of the
    budget. A short prompt drafts from the first token; a long one with a small budget is
    decoded plainly until its output proves long (as in ski rental: by the estimate, the
    wait loses at most what one reading costs). While it waits it does not probe (a probe
    would need the reading). So that a pessimistic prior cannot keep a pair from ever
    drafting, requests with a :class:`PairHistory` that knows fewer than ``HISTORY_MIN``
    positions draft at least one token per iteration, from the first: they pay a prompt
    reading to learn the pair's acceptance for the requests after them. γ depends only on the past, so every lossless verifier stays
    lossless.
    """

    def __init__(self, costs: PassCosts, max_gamma: int = 12, min_gamma: int = 0,
                 history: PairHistory | None = None) -> None:
        self.costs = costs
        self.history = history
        self.prior = PRIOR_ALPHA if history is None else history.prior()
        self.max_gamma = check_positive("max_gamma", max_gamma)
        self.min_gamma = min(check_positive("min_gamma", min_gamma, minimum=0), self.max_gamma)
        self.accepted = 0.0
        self.tested = 0.0
        self.idle = 0
        self.context = 0  # tokens the draft would read at its first draft
        self.emitted = 0
        self.budget = 0
        self.drafting = costs.draft_prefill <= 0.0 or self.min_gamma > 0

    def start(self, prompt_tokens: int, budget: int) -> None:
        self.context, self.budget = prompt_tokens, budget

    @property
    def label(self) -> str:
        return "auto"

    @property
    def alpha(self) -> float:
        return (self.accepted + self.prior * PRIOR_WEIGHT) / (self.tested + PRIOR_WEIGHT)

    def choose(self) -> int:
        gamma = max(best_gamma(self.alpha, self.costs, self.max_gamma), self.min_gamma)
        if self.history is not None and self.history.tested < HISTORY_MIN:
            self.drafting = True  # the pair is new: learn its acceptance (reads the prompt)
            return max(gamma, 1)
        if not self.drafting:
            if gamma == 0:
                return 0
            reading = self.costs.draft_prefill * (self.context + self.emitted)
            gain = self.costs.saving(self.alpha, gamma) * (self.emitted
                                                          + PAYBACK_SHARE * self.budget)
            if reading > gain:
                return 0
            self.drafting = True
        if gamma == 0:
            self.idle += 1
            if self.idle >= PROBE_EVERY:
                self.idle = 0
                return 1
        else:
            self.idle = 0
        return gamma

    def observe(self, drafted: int, accepted: int) -> None:
        tested = accepted + (1 if accepted < drafted else 0)
        self.emitted += accepted + 1
        self.accepted += accepted
        self.tested += tested
        if self.history is not None:
            self.history.add(accepted, tested)


#: Repetitions of the start-up timing (interleaved, medians): enough that one slow phase
#: of a busy 2-core machine does not decide c or V(k).
TIMING_REPS = 5


def measure_costs(target: CausalLM, draft: CausalLM, *, context: int = 128,
                  reps: int = TIMING_REPS) -> PassCosts:
    """Time target passes over ``PROBE_SIZES`` tokens and a draft step after ``context``
    tokens, in turns within each repetition (:func:`~verispec.models.timing.
    interleaved_costs`), and the draft's prefill of ``context`` tokens (on spawned models:
    the callers' rows are untouched)."""
    from verispec.models.timing import interleaved_costs, prefill_cost

    sizes = tuple(k for k in PROBE_SIZES if target.max_length is None
                  or context + k <= target.max_length)
    timed, step = interleaved_costs([(target, sizes), (draft, (1,))], context=context,
                                    reps=reps)
    return PassCosts(target=dict(timed), draft=step[1],
                     draft_prefill=prefill_cost(draft, context, reps=reps) / context)
