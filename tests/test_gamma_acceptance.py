"""γ auto's acceptance model: a block's first position apart from the later ones."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from verispec.engine.gamma import (FLAT_TOLERANCE, PRIOR_ALPHA, PRIOR_WEIGHT, ROW_DECAY,
                                   Acceptance, AcceptanceCounts, AutoGamma, PairHistory,
                                   PassCosts, best_gamma, flat_best)

#: A target pass that grows slowly with its tokens and a cheap draft step: long blocks pay
#: where the later positions are accepted often.
COSTS = PassCosts({1: 0.10, 2: 0.105, 4: 0.115, 8: 0.135, 16: 0.175}, 0.02)
#: The draft agrees with the target less often right after the target's own token.
TRUTH = Acceptance(first=0.7, rest=0.95)


def test_expected_tokens_count_the_first_position_apart() -> None:
    """E[tokens](γ) = 1 + first · (1 + rest + … + rest^{γ−1}); with first = rest the
    i.i.d. model's (1 − α^{γ+1}) / (1 − α)."""
    for alpha in (0.0, 0.3, 0.9):
        for gamma in range(6):
            iid = sum(alpha ** i for i in range(gamma + 1))
            assert Acceptance.iid(alpha).tokens(gamma) == pytest.approx(iid)
    assert TRUTH.tokens(0) == 1.0
    assert TRUTH.tokens(3) == pytest.approx(1 + 0.7 * (1 + 0.95 + 0.95 ** 2))
    assert Acceptance(0.5, 1.0).tokens(4) == pytest.approx(3.0)


def test_counts_split_each_block_at_its_first_position() -> None:
    """A block of γ drafts with τ accepted tests positions 1..min(τ + 1, γ): the first
    apart, the rest after it; a plain iteration (γ = 0) tests nothing."""
    c = AcceptanceCounts()
    c.observe(4, 4)  # every position accepted
    c.observe(4, 0)  # the first rejected
    c.observe(4, 2)  # the third rejected
    c.observe(0, 0)
    assert (c.first_accepted, c.first_tested) == (2, 3)
    assert (c.rest_accepted, c.rest_tested) == (3 + 1, 3 + 2)
    assert (c.accepted, c.tested) == (6, 8)
    est = c.estimate(Acceptance(0.5, 0.9), weight=2)
    assert (est.first, est.rest) == pytest.approx(((2 + 1.0) / 5, (4 + 1.8) / 7))


def _run(seed: int, iterations: int) -> tuple[list[int], AutoGamma]:
    """A request alone whose drafts are accepted at TRUTH (seeded draws)."""
    policy = AutoGamma(COSTS, max_gamma=12)
    policy.start(10, 10**6, fixed_length=True)
    draws, gammas = random.Random(seed), []
    for _ in range(iterations):
        gamma = policy.choose()
        rates = [TRUTH.first] + [TRUTH.rest] * (gamma - 1)
        policy.observe(gamma, next((i for i, a in enumerate(rates) if draws.random() >= a),
                                   gamma))
        gammas.append(gamma)
    return gammas, policy


def test_a_low_first_position_does_not_keep_blocks_short() -> None:
    """The draft is accepted at 0.7 at a block's first position and 0.95 after it, where
    γ 8 pays best and γ 7, within FLAT_TOLERANCE of it, is chosen. The request learns both
    rates and drafts about γ 7. One rate for all positions, pooled from the same outcomes
    (mostly first positions and early ones), would choose γ ≤ 5 (the control)."""
    rates = [TRUTH.tokens(g) / COSTS.iteration(g) for g in range(13)]
    assert max(range(13), key=rates.__getitem__) == 8
    best = best_gamma(TRUTH, COSTS, 12)
    assert best == 7 and rates[7] >= (1 - FLAT_TOLERANCE) * rates[8]
    gammas, policy = _run(seed=0, iterations=400)
    late = Counter(gammas[200:])
    assert sum(n for g, n in late.items() if abs(g - best) <= 1) == 200
    est = policy.acceptance
    assert est.first == pytest.approx(TRUTH.first, abs=0.05)
    assert est.rest == pytest.approx(TRUTH.rest, abs=0.02)
    pooled = Acceptance.iid(policy.seen.accepted / policy.seen.tested)
    assert best_gamma(pooled, COSTS, 12) <= best - 2


def test_the_shortest_gamma_within_the_tolerance_of_the_best_is_chosen() -> None:
    """Of rates nearly flat at their top the first within FLAT_TOLERANCE of the largest is
    taken (a longer block is drafted only for a gain above it); exact ties go to the first."""
    assert FLAT_TOLERANCE == 0.01
    assert flat_best([1.0, 1.5, 1.985, 2.0, 1.99]) == 2
    assert flat_best([1.0, 1.5, 1.975, 2.0, 1.99]) == 3
    assert flat_best([2.0, 2.0, 1.0]) == 0
    assert flat_best([0.5]) == 0


def _blocks(counts: AcceptanceCounts, blocks: list[tuple[int, int]], decay: float) -> None:
    for drafted, accepted in blocks:
        counts.scale(decay)
        counts.observe(drafted, accepted)


def test_a_request_with_a_pair_history_follows_its_recent_blocks() -> None:
    """Against the pair's recorded rates, a request's blocks weigh ×ROW_DECAY per later
    block: after an easy stretch (every block accepted whole) and three blocks rejected at
    their first position, its estimate has fallen well below what its whole record says,
    and it drafts shorter blocks. Without a history (a generic prior) its whole record is
    its estimate."""
    assert 0.0 < ROW_DECAY < 1.0
    history = PairHistory()
    history.first_accepted, history.first_tested = 240.0, 300.0
    history.rest_accepted, history.rest_tested = 630.0, 700.0
    blocks = [(4, 4)] * 12 + [(4, 0)] * 3
    policy, plain = AutoGamma(COSTS, history=history), AutoGamma(COSTS)
    for p in (policy, plain):
        p.start(10, 10**6, fixed_length=True)
        p.choose()  # the prior is fixed at the first choice
    prior = policy.prior
    for drafted, accepted in blocks:
        policy.observe(drafted, accepted)
        plain.observe(drafted, accepted)
    recent, whole = AcceptanceCounts(), AcceptanceCounts()
    _blocks(recent, blocks, ROW_DECAY)
    _blocks(whole, blocks, 1.0)
    est = policy.acceptance
    assert (est.first, est.rest) == pytest.approx(
        (recent.estimate(prior).first, recent.estimate(prior).rest))
    assert est.first < whole.estimate(prior).first - 0.2  # the whole record: 12 of 15
    assert best_gamma(est, COSTS, 12) < best_gamma(whole.estimate(prior), COSTS, 12)
    assert (plain.seen.first_accepted, plain.seen.first_tested) == (12, 15)
    assert plain.acceptance == whole.estimate(Acceptance.iid(PRIOR_ALPHA), PRIOR_WEIGHT)
