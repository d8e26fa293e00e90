"""γ auto in a batch: when a row's draft reads its context (a one-time cost the whole
batch waits for), and what the first tokens of a batch cost."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
import torch
from test_gamma_batch import (ALPHA, BALANCED, DRAFT_STEP, FLAT, KS, LINEAR, MAX_GAMMA, ROWS,
                              _choice, _rows, counts)

from verispec.api import make_drafter
from verispec.engine.batch_gamma import RowDemand, batch_choice, choose_gammas, reading_choice
from verispec.engine.costs import Acceptance, BatchCosts
from verispec.engine.gamma import HISTORY_MIN, AutoGamma, PairHistory, best_gamma
from verispec.engine.loop import Engine
from verispec.engine.overhead import IterationOverhead
from verispec.engine.request import Request
from verispec.methods import build_method
from verispec.models.toy import RandomContextLM
from verispec.sampling import Randomness, Sampling

pytestmark = pytest.mark.usefixtures("one_thread")


class SlowReader(RandomContextLM):
    """A toy draft whose reading of a context (``add_rows``) takes ``READING_S`` seconds."""

    def _add_rows(self, prefixes: list[list[int]]) -> None:
        time.sleep(READING_S)
        super()._add_rows(prefixes)


#: The slow draft's reading: far above a toy iteration's own time.
READING_S = 0.4
#: Passes that cost a microsecond: an iteration's recorded time is then the engine's own.
MICRO = BatchCosts(target={(r, k): 1e-6 for r in ROWS for k in KS}, draft=dict.fromkeys(ROWS, 1e-6))


def test_the_drafts_reading_of_a_prompt_is_not_counted_as_overhead() -> None:
    """The draft's first reading of a context is a one-time cost (the reading-pays rule
    weighs it), not the engine's time per iteration: the iteration in which the rows join
    the draft's cache records its time without their reading."""
    target, draft = RandomContextLM(2, seed=41), SlowReader(2, seed=42)
    m = build_method("block")
    maker = make_drafter(target, draft, m)
    seen: list[tuple[int, int, float]] = []

    class Capture(IterationOverhead):
        def observe(self, rows: int, g: int, seconds: float) -> None:
            seen.append((rows, g, seconds))
            super().observe(rows, g, seconds)

    engine = Engine(target.spawn(), batch_size=2, overhead=Capture())
    reqs = [Request([0, 1, 1], m, m.adjust_sampling(Sampling()), 4,
                    Randomness(torch.Generator().manual_seed(b)),
                    AutoGamma(MICRO.single(), max_gamma=2, min_gamma=1), maker) for b in range(2)]
    engine.run(reqs)
    assert maker.reading_time_s >= READING_S
    # the rows drafted (and joined) at once; the last row alone may have no room to draft
    assert seen and all(g > 0 for rows, g, _ in seen if rows > 1)
    # neither counted nor taken off twice (a toy iteration is about a millisecond)
    assert all(abs(seconds) < READING_S / 2 for _, _, seconds in seen)


def test_a_rows_reading_is_the_batchs_decision_until_the_draft_has_read() -> None:
    """In a batch a row's bounds are its policy's (min_gamma, max_gamma) whether or not its
    draft has read (before its first token too: the batch decides, see below); what the
    reading would cost now (context and tokens decoded so far) and the tokens it must pay
    back over are the policy's; once it has drafted, the reading is paid."""
    costs = BatchCosts(target=FLAT.target, draft=DRAFT_STEP, draft_prefill=0.01).single()
    policy = AutoGamma(costs, max_gamma=MAX_GAMMA)
    policy.start(100, 64)
    assert policy.batch_bounds() == (0, MAX_GAMMA) and not policy.drafting
    assert policy.reading_deferred
    assert policy.reading_seconds == pytest.approx(1.0)
    assert policy.payback_tokens == pytest.approx(0.5 * 64)  # PAYBACK_SHARE of the budget
    policy.observe(0, 0)  # one token decoded plainly: the reading grows, so does the payback
    assert policy.batch_bounds() == (0, MAX_GAMMA) and not policy.drafting
    assert not policy.reading_deferred
    assert policy.reading_seconds == pytest.approx(1.01)
    assert policy.payback_tokens == pytest.approx(1 + 0.5 * 64)
    policy.observe(2, 1)  # it drafted: its draft has read the context
    assert policy.reading_seconds == 0.0 and policy.batch_bounds() == (0, MAX_GAMMA)


def _row_saving(grid: BatchCosts, rows: int, alpha: float) -> float:
    """Seconds per token of each row that ``rows`` rows at acceptance α save by drafting
    at the batch's choice: (T(R, 0) − T(R, g) / E[tokens](α, g)) / R."""
    g = max(_choice(grid, rows, alpha))
    e = (1 - alpha ** (g + 1)) / (1 - alpha)
    return (grid.iteration(rows, 0) - grid.iteration(rows, g) / e) / rows


def test_readings_pay_where_the_batch_choice_repays_them() -> None:
    """A batch of rows whose drafts have not read: they read where the readings cost no
    more than the batch's saving per row over their payback tokens, (T(R, 0) − T(R, g) /
    E) / R at the batch's choice g, and not all of them a little above it. A new row
    beside a row accepted at 0.2 (with it the batch gains under 4% by drafting) is weighed
    with it: it does not read, although a batch in which every row drafted at its
    acceptance would repay its reading; beside rows that draft, its reading (the same
    seconds) pays."""
    rows, tokens = 4, 50.0
    threshold = _row_saving(FLAT, rows, ALPHA) * tokens
    assert threshold > 0
    demands = [RowDemand(Acceptance.iid(ALPHA), 0, MAX_GAMMA)] * rows
    for share, reads in [(0.99, True), (1.01, False)]:
        readings = {b: (share * threshold, tokens) for b in range(rows)}
        choice, _ = reading_choice(demands, readings, FLAT)
        assert all(g > 0 for g in choice) is reads  # above it, not all of them read
    pair = [RowDemand(Acceptance.iid(ALPHA), 0, MAX_GAMMA)] * 2
    reading = 0.5 * _row_saving(BALANCED, 2, ALPHA) * tokens  # repaid if both drafted at α
    new = {1: (reading, tokens)}
    beside_weak = [RowDemand(Acceptance.iid(0.2), 0, MAX_GAMMA), pair[1]]
    assert max(batch_choice(beside_weak, BALANCED)) > 0  # the row would make the batch draft
    assert reading_choice(beside_weak, new, BALANCED)[0] == [0, 0]
    choice, chosen_from = reading_choice(pair, new, BALANCED)
    assert all(g > 0 for g in choice) and chosen_from == pair


def _first_tokens(policies: Sequence[AutoGamma]) -> None:
    """The first tokens of requests admitted together, decoded plainly (no time to first
    token includes a draft's reading)."""
    assert choose_gammas(_rows(policies), [MAX_GAMMA] * len(policies)) \
        == [0] * len(policies)  # type: ignore[arg-type]
    for p in policies:
        p.observe(0, 0)


def test_a_batch_reads_the_drafts_context_only_when_the_batch_gains() -> None:
    """A prompt whose reading pays back alone (one-row saving) waits in a batch of 8 on the
    linear grid, where drafting saves the batch nothing, and reads on the flat one; the
    batch's saving per row is (T(R, 0) − T(R, g) / E) / R."""
    def policies(grid: BatchCosts, rows: int) -> list[AutoGamma]:
        costs = BatchCosts(grid.target, grid.draft, draft_prefill=1e-3).single()
        out = [AutoGamma(costs, max_gamma=MAX_GAMMA) for _ in range(rows)]
        for p in out:
            p.start(100, 100)  # reading 0.1 s
        _first_tokens(out)
        return out

    alone = policies(LINEAR, 1)[0]
    assert not alone.drafting and alone.choose() > 0 and alone.drafting
    waiting = policies(LINEAR, 8)
    assert choose_gammas(_rows(waiting), [MAX_GAMMA] * 8) == [0] * 8  # type: ignore[arg-type]
    assert not any(p.drafting for p in waiting)
    reading = policies(FLAT, 8)
    got = choose_gammas(_rows(reading), [MAX_GAMMA] * 8)  # type: ignore[arg-type]
    assert all(g > 0 for g in got)
    for policy, g in zip(reading, got, strict=True):
        policy.observe(g, 0)  # they drafted: their drafts read the contexts
    assert all(p.drafting for p in reading)


def test_a_row_admitted_into_a_decoding_batch_may_read_before_its_first_token() -> None:
    """On the flat grid, where a batch of 4 repays a 0.1 s reading: a new row admitted
    beside 3 rows that draft reads and drafts at its first iteration (else it would be
    padded to their block for one token), and so do three new rows beside a row out of
    room (together they repay their readings); with every row new (a batch admitted
    at once) the first tokens are decoded plainly, and a reading that does not pay (100 s)
    is not made even beside drafting rows."""
    grid = BatchCosts(FLAT.target, FLAT.draft, draft_prefill=1e-3)  # one batch, one grid

    def new_row(context: int = 100) -> AutoGamma:
        policy = AutoGamma(grid.single(), max_gamma=MAX_GAMMA)
        policy.start(context, 100)  # reading context × 1 ms
        return policy

    def drafting(accepted: float, tested: float) -> AutoGamma:
        policy = new_row()
        policy.observe(MAX_GAMMA, MAX_GAMMA)  # it has drafted: its reading is paid
        policy.seen = counts(accepted / tested, tested)
        return policy

    assert new_row().reading_deferred
    beside = [drafting(40.0, 50.0) for _ in range(3)]
    assert all(g > 0 for g in choose_gammas(_rows(beside), [MAX_GAMMA] * 3))  # type: ignore[arg-type]
    got = choose_gammas(_rows([*beside, new_row()]), [MAX_GAMMA] * 4)  # type: ignore[arg-type]
    assert all(g > 0 for g in got)
    dear = choose_gammas(_rows([*beside, new_row(100_000)]), [MAX_GAMMA] * 4)  # type: ignore[arg-type]
    assert dear[-1] == 0 and all(g > 0 for g in dear[:3])
    turnover = choose_gammas(_rows([beside[0], *[new_row() for _ in range(3)]]),  # type: ignore[arg-type]
                             [0, MAX_GAMMA, MAX_GAMMA, MAX_GAMMA])
    assert turnover[0] == 0 and all(g > 0 for g in turnover[1:])
    assert choose_gammas(_rows([new_row() for _ in range(4)]),  # type: ignore[arg-type]
                         [MAX_GAMMA] * 4) == [0] * 4


def test_a_fixed_length_request_reads_when_its_remaining_tokens_repay_the_reading() -> None:
    """A reading that the saving repays over the whole budget (1.33×) but not over half of
    it: a request that may stop at any EOS waits (ski rental), one of fixed length (EOS
    ignored) reads at once, and with one token left it does not read; alone and in a batch
    of 4 (the batch's saving per row in place of the one-row saving)."""
    budget, context = 20, 100
    prior = AutoGamma(FLAT.single(), max_gamma=MAX_GAMMA).acceptance
    alpha = prior.first
    assert prior == Acceptance.iid(alpha)  # the generic prior, at every position

    def policies(saving: float, fixed_length: bool, n: int = 1,
                 emitted: int = 1) -> list[AutoGamma]:  # 1: past the first token
        prefill = 0.75 * saving * budget / context  # reading = 0.75 × saving × budget
        costs = BatchCosts(FLAT.target, FLAT.draft, draft_prefill=prefill).single()
        out = [AutoGamma(costs, max_gamma=MAX_GAMMA) for _ in range(n)]
        for p in out:
            p.start(context, budget, fixed_length=fixed_length)
            p.emitted = emitted
        return out

    alone = FLAT.single().saving(prior, best_gamma(prior, FLAT.single(), MAX_GAMMA))
    assert alone > 0
    assert policies(alone, False)[0].choose() == 0
    assert policies(alone, True)[0].choose() > 0
    assert policies(alone, True, emitted=budget - 1)[0].choose() == 0  # one token repays little
    batch = _row_saving(FLAT, 4, alpha)
    assert batch > 0
    for fixed_length in (False, True):
        rows = policies(batch, fixed_length, 4)
        gammas = choose_gammas(_rows(rows), [MAX_GAMMA] * 4)  # type: ignore[arg-type]
        assert all(g > 0 for g in gammas) is fixed_length


def test_a_batch_does_not_draft_to_learn_a_new_pair() -> None:
    """A new pair (fewer than HISTORY_MIN positions known) is learned by a request alone; in
    a batch where drafting does not pay at the prior α, no row drafts for it (one drafting
    row would pad every row's pass), nor does a row that began learning alone."""
    costs = BatchCosts(LINEAR.target, LINEAR.draft, draft_prefill=1e-3).single()
    alone = AutoGamma(costs, max_gamma=MAX_GAMMA, history=PairHistory())
    alone.start(100, 100)
    _first_tokens([alone])
    assert alone.learning and alone.choose() >= 1 and alone.drafting
    history = PairHistory()
    batch = [AutoGamma(costs, max_gamma=MAX_GAMMA, history=history) for _ in range(8)]
    for p in batch:
        p.start(100, 100)
    _first_tokens(batch)
    for _ in range(3):
        assert choose_gammas(_rows(batch), [MAX_GAMMA] * 8) == [0] * 8  # type: ignore[arg-type]
    assert not any(p.drafting for p in batch) and history.tested < HISTORY_MIN
    joined = [alone, *batch[1:]]
    assert choose_gammas(_rows(joined), [MAX_GAMMA] * 8) == [0] * 8  # type: ignore[arg-type]
    on_flat = [AutoGamma(BatchCosts(FLAT.target, FLAT.draft, draft_prefill=1e-3).single(),
                         max_gamma=MAX_GAMMA, history=PairHistory()) for _ in range(8)]
    for p in on_flat:
        p.start(100, 100)
    _first_tokens(on_flat)
    assert all(g > 0 for g in choose_gammas(_rows(on_flat), [MAX_GAMMA] * 8))  # type: ignore[arg-type]
