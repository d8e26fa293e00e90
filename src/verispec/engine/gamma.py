"""Draft-length policies: how many tokens a request drafts in its next iteration.

A policy sees only the request's past (its own acceptances), never the current draft, so
the draft length is decided before any token of the block is drawn and every lossless
verifier stays lossless with it (the tests prove it by exact enumeration).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from verispec.checks import check_positive
from verispec.engine.costs import Acceptance, Overhead, PassCosts

__all__ = ["EXPLORE_MARGIN", "FLAT_TOLERANCE", "HISTORY_CAP", "ROW_DECAY", "Acceptance",
           "AcceptanceCounts", "AutoGamma", "FixedGamma", "GammaPolicy", "PairHistory",
           "PassCosts", "best_gamma", "expected_rates", "flat_best"]


class GammaPolicy(Protocol):
    """Chooses γ for each iteration of one request."""

    @property
    def max_gamma(self) -> int:
        """The longest draft this policy may ask for (0: never drafts)."""

    @property
    def label(self) -> int | str:
        """γ as reported in the statistics (an int, or ``"auto"``)."""

    def start(self, prompt_tokens: int, budget: int, fixed_length: bool = False,
              streamed: bool = True) -> None:
        """The request's prompt length and token budget, before its first iteration;
        ``fixed_length``: it decodes its whole budget (EOS ignored); ``streamed``: its
        caller sees each token as it comes, so the time to its first token counts."""

    def choose(self, overhead: Overhead | None = None, explore: bool = False) -> int:
        """γ for the next iteration (the engine caps it by the room left); ``overhead``:
        what an iteration costs beyond its passes, as the engine has measured it (None:
        nothing); ``explore``: the engine has not measured a drafting iteration of this
        request's shape for a while, so one near the best is worth measuring."""

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

    def start(self, prompt_tokens: int, budget: int, fixed_length: bool = False,
              streamed: bool = True) -> None:
        return None

    def choose(self, overhead: Overhead | None = None, explore: bool = False) -> int:
        return self.gamma

    def observe(self, drafted: int, accepted: int) -> None:
        return None

    def __repr__(self) -> str:
        return str(self.gamma)


#: The prior on the acceptance rates: α₀ at every position with the weight of this many
#: observed positions (α₀ is the pair's pooled acceptance once it has HISTORY_MIN positions).
PRIOR_ALPHA, PRIOR_WEIGHT = 0.6, 4.0
HISTORY_MIN = 32
#: A pair's pooled acceptance weighs at most this many positions: beyond it the older
#: counts are scaled down, so the prior follows a change of prompts or sampling.
HISTORY_CAP = 1024
#: With a :class:`PairHistory`, the weight of each of a request's own outcomes is multiplied
#: by this for every block drafted after it, so that its estimate follows its recent blocks
#: around the pair's acceptance (:class:`AutoGamma`).
ROW_DECAY = 0.6
#: After this many iterations at γ = 0, draft one token to keep learning α.
PROBE_EVERY = 16
#: The shortest γ whose expected tokens per second is within this fraction of the best is
#: chosen. With a cheap draft the model's rate is nearly flat over a wide range of γ (within
#: 2% from γ 5 to 10 at a cost ratio of 4.6), and there the longest blocks are where it errs:
#: their late positions are accepted less often than the rates of the earlier ones say, and
#: each drafted position adds work to an iteration the pass costs leave out.
FLAT_TOLERANCE = 0.01
#: The draft reads a request's context at once when the time drafting is expected to save
#: over this share of the token budget covers that reading.
PAYBACK_SHARE = 0.5
#: A side not measured recently and predicted within this fraction of the chosen side's rate
#: is worth measuring: plain decoding in a batch that drafts
#: (:func:`~verispec.engine.batch_gamma.explore`), drafting for a request alone whose draft
#: has not read its context (:meth:`AutoGamma.choose` with ``explore``).
EXPLORE_MARGIN = 0.25


class AcceptanceCounts:
    """Accepted and tested drafted positions, the first position of each block counted
    apart from the later ones (:class:`Acceptance`). A block of γ drafts whose first τ are
    accepted tests positions 1..min(τ + 1, γ)."""

    def __init__(self) -> None:
        self.first_accepted = self.first_tested = 0.0
        self.rest_accepted = self.rest_tested = 0.0

    @property
    def accepted(self) -> float:
        return self.first_accepted + self.rest_accepted

    @property
    def tested(self) -> float:
        return self.first_tested + self.rest_tested

    def observe(self, drafted: int, accepted: int) -> None:
        """A block drafted ``drafted`` tokens and ``accepted`` of them were accepted."""
        if drafted <= 0:
            return
        self.first_tested += 1
        self.first_accepted += 1.0 if accepted >= 1 else 0.0
        self.rest_tested += min(accepted + 1, drafted) - 1
        self.rest_accepted += max(accepted - 1, 0)

    def observe_recent(self, drafted: int, accepted: int, decay: float) -> None:
        """:meth:`observe`, the earlier outcomes weighed ×``decay`` first where the block
        drafted (a plain iteration tests nothing and ages nothing)."""
        if drafted > 0:
            self.scale(decay)
        self.observe(drafted, accepted)

    def scale(self, factor: float) -> None:
        """Every count times ``factor`` (older outcomes forgotten in proportion)."""
        self.first_accepted *= factor
        self.first_tested *= factor
        self.rest_accepted *= factor
        self.rest_tested *= factor

    def estimate(self, prior: Acceptance, weight: float = PRIOR_WEIGHT) -> Acceptance:
        """Each rate from its own counts, with ``prior``'s rate at the weight of ``weight``
        positions."""
        return Acceptance(
            (self.first_accepted + prior.first * weight) / (self.first_tested + weight),
            (self.rest_accepted + prior.rest * weight) / (self.rest_tested + weight))


class PairHistory(AcceptanceCounts):
    """The acceptance of one draft/target pair pooled over the requests it has served
    (at most ``HISTORY_CAP`` positions' worth): the prior of the next request's
    :class:`AutoGamma`, so a pair whose drafts are usually accepted starts drafting at once.
    It holds outcomes of earlier iterations only, so a γ chosen from it is still decided
    before the block it drafts. This class keeps them for one process;
    :class:`~verispec.engine.history.RecordedHistory` also keeps them on disk for the next."""

    def prior(self) -> Acceptance:
        """The pair's pooled acceptance (PRIOR_ALPHA until HISTORY_MIN positions are known):
        the first and the later positions each from their own counts, taken toward the rate
        over all positions at ``PRIOR_WEIGHT`` (a pair seen drafting one token at a time
        knows its later positions from that rate alone)."""
        if self.tested < HISTORY_MIN:
            return Acceptance.iid(PRIOR_ALPHA)
        return self.estimate(Acceptance.iid(self.accepted / self.tested))

    def observe(self, drafted: int, accepted: int) -> None:
        super().observe(drafted, accepted)
        self.cap()

    def cap(self) -> None:
        """Beyond ``HISTORY_CAP`` positions, older outcomes are forgotten in proportion."""
        if self.tested > HISTORY_CAP:
            self.scale(HISTORY_CAP / self.tested)


def expected_rates(acceptance: Acceptance, costs: PassCosts, max_gamma: int,
                   overhead: Overhead | None = None) -> list[float]:
    """Expected tokens per second of γ = 0..max_gamma:
    E[tokens](γ) / (γ · t_draft + t_target(γ + 1) + overhead(γ))."""
    return [acceptance.tokens(g) / costs.iteration(g, overhead) for g in range(max_gamma + 1)]


def best_gamma(acceptance: Acceptance, costs: PassCosts, max_gamma: int,
               overhead: Overhead | None = None) -> int:
    """The shortest γ in [0, max_gamma] whose :func:`expected_rates` entry is within
    :data:`FLAT_TOLERANCE` of the best."""
    return flat_best(expected_rates(acceptance, costs, max_gamma, overhead))


def flat_best(rates: Sequence[float]) -> int:
    """The first index whose rate is within :data:`FLAT_TOLERANCE` of the largest."""
    top = max(rates)
    return next(g for g, rate in enumerate(rates) if rate >= (1.0 - FLAT_TOLERANCE) * top)


class AutoGamma:
    """γ chosen by measurement, per request (``--gamma auto``).

    Each iteration it estimates the request's :class:`Acceptance` from its own past — every
    accepted draft token is a success and every rejection a failure, the first position of
    each block counted apart from the later ones, each rate with a prior of
    ``PRIOR_WEIGHT`` positions at ``PRIOR_ALPHA``, or at the pair's pooled acceptance over
    earlier requests when a :class:`PairHistory` is given — and drafts the shortest γ within
    :data:`FLAT_TOLERANCE` of the one that maximises expected tokens per second under that
    model with the measured costs (V(k) in the
    denominator, plus the engine's own time per iteration when the engine passes what it has
    measured: plain decoding pays that time on every token, an iteration that drafts γ shares
    it among its accepted tokens). Where speculation does not pay it chooses γ = 0 (plain
    decoding), drafting one token every ``PROBE_EVERY`` iterations to keep its estimate
    current.

    With a :class:`PairHistory`, the request's own outcomes weigh less the older they are
    (× :data:`ROW_DECAY` per later block), so its estimate is the pair's acceptance moved by
    its recent blocks. A request's acceptance comes in stretches (easy boilerplate, hard
    logic), and its recent blocks predict the next better than its whole record does:
    on the embedded pair (block verification, γ 4, 64 tokens per request; ``python
    benchmarks/acceptance_memory.py``) the whole record's estimate predicted a block's
    tokens with 0.988× the squared error of the pair's rates alone at T = 0 and 1.016× at
    T = 1, the estimate at ``ROW_DECAY`` with 0.885× and 0.929×. Without a history the prior
    is a generic guess, and the whole record is the better estimate.

    The draft model reads a request's context at its first draft, which costs
    ``costs.draft_prefill`` per token. Alone, a streamed request's first token is always
    decoded plainly, so the time to it never includes that reading (admitted into a batch
    that is already decoding, its first iteration may read and draft: :meth:`batch_bounds`);
    a request returned whole (nothing sees its first token before its last) may read and
    draft with its first iteration, where the reading pays as below. A request
    starts drafting once that reading is expected to pay back: when it costs no more than
    the time drafting saves (at the estimated acceptance and best γ) over the tokens decoded
    so far plus ``PAYBACK_SHARE`` of the budget. A short prompt drafts from the second
    token; a long one with a small budget is decoded plainly until its output proves long
    (as in ski rental: by the estimate, the wait loses at most what one reading costs). A request
    of fixed length (EOS ignored) knows how many tokens it has left: it reads as soon as
    they would repay the reading. While it waits it does not probe (a probe would need the
    reading), except where the engine says (``explore``) that no drafting iteration of its
    shape has been measured for a while: then, if drafting at its best γ is predicted within
    :data:`EXPLORE_MARGIN` of plain decoding and the reading costs at most that share of
    plain decoding's time over its payback tokens, it reads and drafts, so that passes
    measured in another state of the machine (a host whose one-token passes run at two
    speeds) do not keep every later request plain. So that a pessimistic prior cannot keep a
    pair from ever drafting, requests with a :class:`PairHistory` that knows fewer than
    ``HISTORY_MIN`` positions draft at least one token per iteration, from the second token:
    they pay a prompt reading to learn the pair's acceptance for the requests after them —
    alone, not in a batch: there a drafting row pads every row's pass to its block, which
    costs the batch more than the learning is worth. In a batch of several rows the engine
    chooses every ``auto`` row's γ together from the measured cost of a batched pass
    (:meth:`batch_bounds`, :mod:`verispec.engine.batch_gamma`). γ depends only on the past,
    so every lossless verifier stays lossless."""

    def __init__(self, costs: PassCosts, max_gamma: int = 12, min_gamma: int = 0,
                 history: PairHistory | None = None) -> None:
        self.costs = costs
        self.history = history
        # None: read from the history at the first choice
        self._prior = Acceptance.iid(PRIOR_ALPHA) if history is None else None
        self.max_gamma = check_positive("max_gamma", max_gamma)
        self.min_gamma = min(check_positive("min_gamma", min_gamma, minimum=0), self.max_gamma)
        self.seen = AcceptanceCounts()  # this request's own outcomes
        self.idle = 0
        self.context = 0  # tokens the draft would read at its first draft
        self.emitted = 0
        self.budget = 0
        self.fixed_length = False  # the request decodes its whole budget
        self.streamed = True  # its caller sees its first token before the others
        self.drafting = costs.draft_prefill <= 0.0 or self.min_gamma > 0

    def start(self, prompt_tokens: int, budget: int, fixed_length: bool = False,
              streamed: bool = True) -> None:
        self.context, self.budget, self.fixed_length = prompt_tokens, budget, fixed_length
        self.streamed = streamed

    @property
    def label(self) -> str:
        return "auto"

    @property
    def prior(self) -> Acceptance:
        """``PRIOR_ALPHA`` at every position, or the pair's pooled acceptance as it stands at
        this request's first choice of γ (not when the request was made: a batch submitted
        at once still starts its later requests from the outcomes of the earlier ones),
        fixed from then on."""
        if self._prior is None:
            assert self.history is not None
            return self.history.prior()
        return self._prior

    @property
    def acceptance(self) -> Acceptance:
        """The request's estimated acceptance: its own outcomes with the prior."""
        return self.seen.estimate(self.prior)

    def _first_choice(self) -> None:
        if self._prior is None:
            self._prior = self.prior

    def choose(self, overhead: Overhead | None = None, explore: bool = False) -> int:
        self._first_choice()
        if self.reading_deferred:
            return 0
        acceptance = self.acceptance
        rates = expected_rates(acceptance, self.costs, self.max_gamma, overhead)
        gamma = max(flat_best(rates), self.min_gamma)
        if self.learning:
            self.drafting = True  # the pair is new: learn its acceptance (reads the prompt)
            return max(gamma, 1)
        if not self.drafting:
            saving = self.costs.saving(acceptance, gamma, overhead)
            if gamma == 0 or not self._reading_pays(saving):
                gamma = self._exploration(rates) if explore else 0
                if gamma == 0:
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

    def _exploration(self, rates: Sequence[float]) -> int:
        """The best γ > 0 where its expected rate (``rates``: :func:`expected_rates`, γ = 0
        first) is within :data:`EXPLORE_MARGIN` of plain decoding's and the reading costs at
        most that share of plain decoding's time over :attr:`payback_tokens` (a long prompt
        with a short budget is not read to explore), else 0."""
        gamma = 1 + flat_best(rates[1:])  # max_gamma >= 1: rates has γ = 1 at least
        cheap = self.reading_seconds <= EXPLORE_MARGIN * self.payback_tokens / rates[0]
        return gamma if cheap and rates[gamma] >= (1.0 - EXPLORE_MARGIN) * rates[0] else 0

    @property
    def reading_deferred(self) -> bool:
        """The draft has not read the context and a streamed request has no token yet:
        alone, its first token is decoded plainly, so that the time to it never includes the
        draft's reading; in a batch, where every row waits for its first token
        (:meth:`batch_bounds`). A request returned whole is never deferred: its first token
        is seen with its last."""
        return not self.drafting and self.emitted == 0 and self.streamed

    def _reading_pays(self, saving: float) -> bool:
        """Whether the draft's reading of the context costs no more than ``saving`` (seconds
        per token that drafting saves) over :attr:`payback_tokens`."""
        return self.reading_seconds <= saving * self.payback_tokens

    @property
    def reading_seconds(self) -> float:
        """What the draft's reading of the context would cost now (0 once it has read)."""
        if self.drafting:
            return 0.0
        return self.costs.draft_prefill * (self.context + self.emitted)

    @property
    def payback_tokens(self) -> float:
        """The tokens over which a reading must pay back: those decoded so far plus
        PAYBACK_SHARE of the budget — or, for a request of fixed length, those it has left."""
        if self.fixed_length:
            return float(self.budget - self.emitted)
        return self.emitted + PAYBACK_SHARE * self.budget

    @property
    def learning(self) -> bool:
        """The pair is new: fewer than HISTORY_MIN positions of its acceptance are known."""
        return self.history is not None and self.history.tested < HISTORY_MIN

    def batch_bounds(self) -> tuple[int, int]:
        """(floor, cap) of this request's γ when the engine chooses the draft lengths of a
        whole batch (:mod:`verispec.engine.batch_gamma`), in place of :meth:`choose`:
        ``min_gamma`` and ``max_gamma``. Whether a row whose draft has not read the context
        yet may draft (and so read) is the batch's decision: it prices the reading
        (:attr:`reading_seconds`, over :attr:`payback_tokens`) against what the batch gains
        by drafting that row — before the row's first token (:attr:`reading_deferred`) too,
        unless every row of the batch waits for its first token (a batch admitted at once
        decodes it plainly): admitted into a batch that is already decoding, its first
        token comes from the batch's iteration whatever that is, and a row held at γ = 0
        would still be padded to the batch's block. Neither a new pair nor a periodic probe
        makes a row draft here: one drafting row pads the pass of every row of the batch to
        its block, so a new pair is judged at its prior and learned by requests that run
        alone. A row the batch keeps at γ = 0 keeps its estimate until it drafts again
        (alone, it probes as before)."""
        self._first_choice()
        return self.min_gamma, self.max_gamma

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted > 0:
            self.drafting = True  # the draft has read the context: that cost is paid
        self.emitted += accepted + 1
        # recent blocks against the pair's acceptance; a generic prior: the whole record
        self.seen.observe_recent(drafted, accepted, 1.0 if self.history is None else ROW_DECAY)
        if self.history is not None:
            self.history.observe(drafted, accepted)
