"""``--gamma auto`` in a batch: the draft lengths of all rows are chosen together from the
measured cost of a batched pass, with no batch-size constant — whether speculation pays at
8 rows follows from the cost grid alone; the choice keeps every lossless method exact.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace

import pytest
import torch
from verifier_doubles import TargetResidual

from verispec.api import make_drafter
from verispec.checks import TOLERANCE
from verispec.engine import batch_gamma, loop
from verispec.engine.batch_gamma import (EXPLORE_EVERY, IterationOverhead, RowDemand, batch_choice,
                                         choose_gammas, reading_choice)
from verispec.engine.costs import BatchCosts
from verispec.engine.gamma import HISTORY_MIN, AutoGamma, PairHistory, PassCosts, best_gamma
from verispec.engine.loop import Engine
from verispec.engine.protocols import SingleDraftMethod
from verispec.engine.request import Request
from verispec.methods import build_method
from verispec.models.toy import RandomContextLM
from verispec.sampling import Randomness, Sampling
from verispec.theory.exact import target_law, tv_distance
from verispec.theory.replay import engine_law, marginal

pytestmark = pytest.mark.usefixtures("one_thread")

ROWS, KS = (1, 2, 4, 8), (1, 2, 4, 8, 16)
#: One draft step over R rows: nearly flat in R, as for a small draft model.
DRAFT_STEP = {r: 0.02 + 0.002 * r for r in ROWS}
#: The acceptance rate of every row in the flip test.
ALPHA = 0.8
MAX_GAMMA = 4


def _grid(seconds: Callable[[int, int], float]) -> BatchCosts:
    return BatchCosts(target={(r, k): seconds(r, k) for r in ROWS for k in KS}, draft=DRAFT_STEP)


#: A target pass that barely grows with rows × tokens (a wide accelerator).
FLAT = _grid(lambda r, k: 1.0 + 0.02 * r * k)
#: A target pass that grows linearly with rows × tokens (compute bound, as on a CPU).
LINEAR = _grid(lambda r, k: 0.2 + 0.1 * r * k)
#: In between: at 2 and 3 rows, drafting pays from an acceptance rate of about one half.
BALANCED = _grid(lambda r, k: 0.3 + 0.1 * r * k)


def _choice(costs: BatchCosts, rows: int, alpha: float = ALPHA) -> list[int]:
    return batch_choice([RowDemand(alpha, 0, MAX_GAMMA)] * rows, costs)


def test_whether_a_batch_speculates_follows_the_measured_costs() -> None:
    """At 8 rows the flat grid still drafts and the linear one decodes plainly; alone, a
    request drafts under both (the one-row choice of ``AutoGamma`` agrees)."""
    assert all(g > 0 for g in _choice(FLAT, 8))
    assert _choice(LINEAR, 8) == [0] * 8
    for costs in (FLAT, LINEAR):
        assert _choice(costs, 1)[0] > 0
        policy = AutoGamma(costs.single(), max_gamma=MAX_GAMMA)
        for _ in range(20):
            policy.observe(MAX_GAMMA, MAX_GAMMA if _ % 5 else 0)  # α ≈ 0.8
        assert policy.choose() > 0


def test_batch_costs_interpolate_and_slice() -> None:
    """Grid points are returned as timed, points between them linearly, and the one-row
    slice is a :class:`PassCosts` carrying the grid."""
    assert LINEAR.target_pass(4, 8) == pytest.approx(0.2 + 0.1 * 32)
    assert LINEAR.target_pass(3, 3) == pytest.approx(0.2 + 0.1 * 9)  # bilinear: exact here
    assert LINEAR.target_pass(16, 1) == pytest.approx(0.2 + 0.1 * 16)  # extrapolated
    halfway = DRAFT_STEP[4] + (DRAFT_STEP[8] - DRAFT_STEP[4]) / 2
    assert LINEAR.draft_step(6) == pytest.approx(halfway)
    single = LINEAR.single()
    assert single.target == {k: pytest.approx(0.2 + 0.1 * k) for k in KS}
    assert single.draft == DRAFT_STEP[1] and single.batch is LINEAR
    assert BatchCosts.from_json(LINEAR.to_json()) == LINEAR


def test_batch_choice_respects_floors_caps_and_fixed_rows() -> None:
    demands = [RowDemand(0.9, 0, 2), RowDemand(0.1, 1, 3), RowDemand(0.9, 0, 0),
               RowDemand(0.5, 0, 3, fixed=True)]
    got = batch_choice(demands, FLAT)
    assert got[0] <= 2 and got[1] >= 1 and got[2] == 0 and got[3] == 3
    assert batch_choice([RowDemand(0.3, 0, 0)] * 3, LINEAR) == [0, 0, 0]


class ScriptedOverhead(IterationOverhead):
    """Records, in place of the wall time, passes at ``levels`` (draft, target) times the
    grid's plus ``per_position`` seconds per drafted position: a deterministic engine
    (the replayed runs must take the same decisions for the same random draws)."""

    def __init__(self, per_position: float, levels: tuple[float, float] = (1.0, 1.0),
                 explore_every: int = EXPLORE_EVERY) -> None:
        super().__init__(explore_every=explore_every)
        self.per_position, self.levels = per_position, levels

    def record(self, rows: Sequence[object], gammas: Sequence[int], seconds: float,
               passes: tuple[float, float] | None = None) -> None:
        costs = rows[0].request.gamma.costs.batch  # type: ignore[attr-defined]
        g = max(gammas)
        scripted = (self.levels[0] * g * costs.draft_step(len(rows)),
                    self.levels[1] * costs.target_pass(len(rows), g + 1))
        super().record(rows, gammas, sum(scripted) + self.per_position * len(rows) * g,  # type: ignore[arg-type]
                       scripted)


def test_overhead_is_learned_from_iterations() -> None:
    """Noiseless iterations of c₀ + c₁·R + c₂·R·g seconds: the fit predicts unseen shapes."""
    c0, c1, c2 = 0.004, 0.002, 0.006
    learned = IterationOverhead()
    assert learned.predict(8, 4) == 0.0  # nothing seen: drafting is assumed free
    for i in range(300):
        rows, g = 2 + i % 5, (i // 5) % 4
        learned.observe(rows, g, c0 + c1 * rows + c2 * rows * g)
    assert learned.predict(8, 6) == pytest.approx(c0 + c1 * 8 + c2 * 48, rel=0.02)
    assert learned.predict(3, 0) == pytest.approx(c0 + c1 * 3, rel=0.02)


def test_plain_iterations_are_not_priced_with_the_drafting_rows_work() -> None:
    """Drafting rows cost the engine work that plain rows do not (gathering and verifying
    q): a batch of 8 rows that drafts 31 iterations in 32 and explores one plain iteration
    predicts its plain iterations at their own time, not at the drafting rows' per-row
    cost extrapolated to g = 0."""
    plain_per_row, drafting_per_row, per_token = 0.0005, 0.0008, 0.0002
    learned = IterationOverhead()
    for i in range(320):
        g = 0 if i % 32 == 0 else 2 + i % 2
        own = plain_per_row * 8 + (drafting_per_row * 8 + per_token * 8 * g if g else 0.0)
        learned.observe(8, g, own)
    assert learned.own_time(8, 0) == pytest.approx(plain_per_row * 8, rel=0.05)
    assert learned.own_time(8, 2) == pytest.approx(
        (plain_per_row + drafting_per_row + 2 * per_token) * 8, rel=0.05)


def _levelled(busy: int | None) -> IterationOverhead:
    """40 iterations of 1–3 rows, draft steps at 0.8× the grid, target passes at 1.25×, and
    3 ms of the engine's own; iteration ``busy`` has a target pass 10× slower."""
    learned = IterationOverhead()
    policy = AutoGamma(LINEAR.single(), max_gamma=MAX_GAMMA)
    for i in range(40):
        rows, g = 1 + i % 3, i % 4
        passes = (0.8 * g * LINEAR.draft_step(rows), 1.25 * LINEAR.target_pass(rows, g + 1))
        if i == busy:
            passes = (passes[0], 10 * passes[1])
        learned.record(_rows([policy] * rows), [g] * rows, sum(passes) + 0.003, passes)  # type: ignore[arg-type]
    return learned


def test_pass_levels_follow_the_measured_passes() -> None:
    """Draft steps at 0.8× the grid and target passes at 1.25×: the predicted drift is
    exactly that at every shape, the engine's own time is what is left beyond the
    re-levelled passes, and one pass slowed by another process moves neither level."""
    learned = _levelled(busy=None)
    want = -0.2 * 6 * LINEAR.draft_step(8) + 0.25 * LINEAR.target_pass(8, 7)
    assert learned.drift(8, 6) == pytest.approx(want)
    assert learned.predict(8, 6) == pytest.approx(want + learned.own_time(8, 6))
    assert learned.own_time(2, 1) == pytest.approx(0.003, rel=0.2)
    busy = _levelled(busy=17)
    assert busy.draft_level.scale == pytest.approx(0.8)
    assert busy.target_level.scale == pytest.approx(1.25)


def test_a_shape_the_grid_underprices_is_learned() -> None:
    """A grid on which 8 rows draft (extra tokens nearly free); the engine measures one-token
    passes as the grid says (the level stays 1) and multi-token passes dearer than its shape
    says: the excess is learned beyond the re-levelled passes and the batch decodes
    plainly."""
    cheap_tokens = _grid(lambda r, k: 0.3 + 0.1 * r + 0.02 * r * k)
    policy = AutoGamma(cheap_tokens.single(), max_gamma=MAX_GAMMA)
    demands = [RowDemand(ALPHA, 0, MAX_GAMMA)] * 8
    assert all(g > 0 for g in batch_choice(demands, cheap_tokens))
    learned = IterationOverhead()
    for i in range(60):
        g = [0, 0, 0, 2, 4][i % 5]
        passes = (g * cheap_tokens.draft_step(8), cheap_tokens.target_pass(8, g + 1) + 0.15 * 8 * g)
        learned.record(_rows([policy] * 8), [g] * 8, sum(passes), passes)  # type: ignore[arg-type]
    assert learned.target_level.scale == pytest.approx(1.0)
    assert batch_choice(demands, cheap_tokens, learned) == [0] * 8


def test_a_noisy_grid_is_made_monotone() -> None:
    """Timings that say more work is cheaper (a busy moment during the start-up timing) are
    pooled with their neighbours: the fit is non-decreasing in tokens and in rows, and a
    monotone grid is left as it is."""
    assert LINEAR.monotone() == LINEAR
    noisy = dict(LINEAR.target)
    noisy[(4, 8)] = 0.8 * LINEAR.target[(4, 4)]  # 8 tokens cheaper than 4
    noisy[(8, 1)] = 0.9 * LINEAR.target[(4, 1)]  # 8 rows cheaper than 4
    fit = BatchCosts(target=noisy, draft={1: 0.03, 2: 0.02, 4: 0.04, 8: 0.05}).monotone()
    for r in ROWS:
        ks = fit.ks(r)
        assert all(fit.target[(r, a)] <= fit.target[(r, b)] for a, b in zip(ks, ks[1:]))
    for k in KS:
        rs = [r for r in ROWS if (r, k) in fit.target]
        assert all(fit.target[(a, k)] <= fit.target[(b, k)] for a, b in zip(rs, rs[1:]))
    assert fit.target[(4, 1)] == fit.target[(8, 1)] == pytest.approx(
        (LINEAR.target[(4, 1)] + noisy[(8, 1)]) / 2)
    assert fit.target[(1, 1)] == LINEAR.target[(1, 1)]
    assert fit.draft == {1: 0.025, 2: 0.025, 4: 0.04, 8: 0.05}


#: Draft steps that the start-up grid overprices: alone, at the prior α, drafting does not
#: pay at the grid's draft step and does at a fifth of it.
DEAR_DRAFT = BatchCosts(target={(r, k): 0.1 + 0.02 * r * k for r in ROWS for k in KS},
                        draft=dict.fromkeys(ROWS, 0.1))


def test_measured_passes_flip_the_choice_the_grid_made() -> None:
    """A request alone on a grid whose draft step is 5× what the draft now takes: from the
    grid it decodes plainly; once iterations have measured the draft at a fifth of the grid
    it drafts. Both ways of being wrong are corrected: a grid that underprices the draft
    by as much leads to drafting until the measured draft steps stop it."""

    def alone(costs: BatchCosts) -> list[SimpleNamespace]:
        policy = AutoGamma(costs.single(), max_gamma=MAX_GAMMA)
        policy.start(1, 100)
        return _rows([policy])

    def measured(costs: BatchCosts, level: float) -> IterationOverhead:
        overhead = IterationOverhead()
        for g in [1, 2] * 6:
            passes = (level * g * costs.draft_step(1), costs.target_pass(1, g + 1))
            overhead.record(alone(costs), [g], sum(passes), passes)  # type: ignore[arg-type]
        return overhead

    cheap = BatchCosts(target=DEAR_DRAFT.target, draft=dict.fromkeys(ROWS, 0.02))
    assert choose_gammas(alone(DEAR_DRAFT), [MAX_GAMMA], IterationOverhead()) == [0]  # type: ignore[arg-type]
    assert choose_gammas(alone(DEAR_DRAFT), [MAX_GAMMA], measured(DEAR_DRAFT, 0.2))[0] > 0  # type: ignore[arg-type]
    assert choose_gammas(alone(cheap), [MAX_GAMMA], IterationOverhead())[0] > 0  # type: ignore[arg-type]
    assert choose_gammas(alone(cheap), [MAX_GAMMA], measured(cheap, 5.0)) == [0]  # type: ignore[arg-type]


#: A target pass that grows steeply with its tokens: alone, at the prior α, drafting does
#: not pay on the passes alone.
STEEP = _grid(lambda r, k: 0.1 + 0.2 * r * k)


def test_a_request_alone_weighs_the_engines_own_time_per_iteration() -> None:
    """Plain decoding pays the engine's own time on every token; an iteration that drafts
    shares it among its accepted tokens. Learned from iterations of one row: a fixed time
    per iteration makes a request alone draft where the passes alone say it should not,
    and a time per drafted position stops it where the passes alone say draft."""

    def alone(costs: BatchCosts) -> list[SimpleNamespace]:
        policy = AutoGamma(costs.single(), max_gamma=MAX_GAMMA)
        policy.start(1, 100)
        return _rows([policy])

    def learned(costs: BatchCosts, extra: Callable[[int], float]) -> IterationOverhead:
        overhead = IterationOverhead()
        for g in [0, 1, 2, 3] * 10:
            overhead.record(alone(costs), [g], costs.iteration(1, g) + extra(g))  # type: ignore[arg-type]
        assert overhead.iterations == 40  # one-row iterations are recorded
        return overhead

    fixed, per_position = learned(STEEP, lambda g: 0.3), learned(FLAT, lambda g: 1.0 * g)
    assert fixed.predict(1, 2) == pytest.approx(0.3, rel=0.05)
    caps = [MAX_GAMMA]
    for overhead in (None, IterationOverhead()):  # nothing learned: the passes decide
        assert choose_gammas(alone(STEEP), caps, overhead) == [0]  # type: ignore[arg-type]
        assert choose_gammas(alone(FLAT), caps, overhead)[0] > 0  # type: ignore[arg-type]
    assert choose_gammas(alone(STEEP), caps, fixed)[0] > 0  # type: ignore[arg-type]
    assert choose_gammas(alone(FLAT), caps, per_position) == [0]  # type: ignore[arg-type]


def test_a_learned_overhead_flips_the_batch_choice() -> None:
    """On the flat grid 8 rows draft; once the engine has learned that every drafted
    position costs it a tenth of a second, they decode plainly. The passes alone (the grid)
    did not change."""
    assert all(g > 0 for g in _choice(FLAT, 8))
    costly = IterationOverhead()
    for i in range(100):
        rows, g = 4 + i % 5, i % 3
        costly.observe(rows, g, 0.1 * rows * g)
    demands = [RowDemand(ALPHA, 0, MAX_GAMMA)] * 8
    assert batch_choice(demands, FLAT, costly) == [0] * 8
    assert batch_choice(demands, FLAT, IterationOverhead()) == _choice(FLAT, 8)


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
    beside rows that keep the batch plain (acceptance 0.1) is weighed with them: it does
    not read, although a batch in which every row drafted at its acceptance would repay
    its reading; beside rows that draft, its reading (the same seconds) pays."""
    rows, tokens = 4, 50.0
    threshold = _row_saving(FLAT, rows, ALPHA) * tokens
    assert threshold > 0
    demands = [RowDemand(ALPHA, 0, MAX_GAMMA)] * rows
    for share, reads in [(0.99, True), (1.01, False)]:
        readings = {b: (share * threshold, tokens) for b in range(rows)}
        choice, _ = reading_choice(demands, readings, FLAT)
        assert all(g > 0 for g in choice) is reads  # above it, not all of them read
    pair = [RowDemand(ALPHA, 0, MAX_GAMMA)] * 2
    reading = 0.5 * _row_saving(BALANCED, 2, ALPHA) * tokens  # repaid if both drafted at α
    new = {1: (reading, tokens)}
    beside_plain = [RowDemand(0.1, 0, MAX_GAMMA), pair[1]]
    assert max(batch_choice(beside_plain, BALANCED)) > 0  # the row would make the batch draft
    assert reading_choice(beside_plain, new, BALANCED)[0] == [0, 0]
    choice, chosen_from = reading_choice(pair, new, BALANCED)
    assert all(g > 0 for g in choice) and chosen_from == pair


def _rows(policies: Sequence[object]) -> list[SimpleNamespace]:
    return [SimpleNamespace(request=SimpleNamespace(gamma=p), num_drafts=1) for p in policies]


def _first_tokens(policies: Sequence[AutoGamma]) -> None:
    """Each request's first token, decoded plainly (every row's is: its time to first
    token never includes the draft's reading)."""
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
        policy.accepted, policy.tested = accepted, tested
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
    alpha = AutoGamma(FLAT.single(), max_gamma=MAX_GAMMA).alpha  # the prior

    def policies(saving: float, fixed_length: bool, n: int = 1,
                 emitted: int = 1) -> list[AutoGamma]:  # 1: past the first token
        prefill = 0.75 * saving * budget / context  # reading = 0.75 × saving × budget
        costs = BatchCosts(FLAT.target, FLAT.draft, draft_prefill=prefill).single()
        out = [AutoGamma(costs, max_gamma=MAX_GAMMA) for _ in range(n)]
        for p in out:
            p.start(context, budget, fixed_length=fixed_length)
            p.emitted = emitted
        return out

    alone = FLAT.single().saving(alpha, best_gamma(alpha, FLAT.single(), MAX_GAMMA))
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


def test_one_row_or_no_grid_keeps_the_per_request_choice() -> None:
    """A batch of one, and ``auto`` rows measured for one row only, are given exactly what
    :meth:`AutoGamma.choose` gives, capped by the room."""
    one_row = PassCosts(target=LINEAR.single().target, draft=DRAFT_STEP[1])
    for costs, rows in [(LINEAR.single(), 1), (one_row, 3)]:
        mine = [AutoGamma(costs, max_gamma=MAX_GAMMA) for _ in range(rows)]
        twins = [AutoGamma(costs, max_gamma=MAX_GAMMA) for _ in range(rows)]
        for step in range(24):
            caps = [MAX_GAMMA - (step + b) % 3 for b in range(rows)]
            got = choose_gammas(_rows(mine), caps)  # type: ignore[arg-type]
            assert got == [min(t.choose(), c) for t, c in zip(twins, caps, strict=True)]
            for p, t, g in zip(mine, twins, got, strict=True):
                p.observe(g, g if step % 4 else 0)
                t.observe(g, g if step % 4 else 0)


def _auto_batch_runner(method: str | SingleDraftMethod, prompts: Sequence[Sequence[int]],
                       budgets: Sequence[int], costs: PassCosts, batch_size: int,
                       per_position: float = 0.0, levels: tuple[float, float] = (1.0, 1.0),
                       explore_every: int = EXPLORE_EVERY) -> tuple[Callable[[Sequence[Randomness]], list[list[int]]],
                                  RandomContextLM]:
    target, draft = RandomContextLM(2, seed=41), RandomContextLM(2, seed=42)
    m = build_method(method) if isinstance(method, str) else method

    def run(randoms: Sequence[Randomness]) -> list[list[int]]:
        maker = make_drafter(target, draft.spawn(), m)
        engine = Engine(target.spawn(), batch_size=batch_size,
                        overhead=ScriptedOverhead(per_position, levels, explore_every))
        reqs = [Request(list(p), m, m.adjust_sampling(Sampling()), n, r,
                        AutoGamma(costs, max_gamma=3), maker)
                for p, n, r in zip(prompts, budgets, randoms, strict=True)]
        return [o.tokens for o in engine.run(reqs)]

    return run, target


#: Batches of two and three rows (prompts, budgets).
BATCHES = {2: ([[0, 1, 1], [1]], [3, 3]), 3: ([[0, 1, 1], [1], [0]], [2, 3, 2])}


@pytest.mark.parametrize("rows", sorted(BATCHES))
@pytest.mark.parametrize(("method", "per_position", "levels", "explore_every"),
                         [("token", 0.0, (1.0, 1.0), EXPLORE_EVERY),
                          ("block", 0.0, (1.0, 1.0), EXPLORE_EVERY),
                          ("block", 0.05, (1.0, 1.0), EXPLORE_EVERY),
                          ("block", 0.0, (0.5, 1.2), EXPLORE_EVERY),
                          ("block", 0.0, (1.5, 1.5), 1)])
def test_batch_chosen_gamma_stays_exact(method: str, per_position: float,
                                        levels: tuple[float, float], explore_every: int,
                                        rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` rows whose γ the batch policy chooses from all rows' acceptances, the
    engine overhead and the passes' levels learned from earlier iterations (so it moves
    between 0 and drafting as they accept or reject; with ``explore_every`` 1 a drafting
    batch also decodes plainly at every iteration the rule allows): the joint law of their
    outputs is the product of the target laws."""
    assert _choice(BALANCED, rows, 0.3)[0] == 0 < _choice(BALANCED, rows, 0.9)[0]
    seen: set[tuple[int, ...]] = set()
    real = loop.choose_gammas

    def spy(rows: Sequence[object], caps: Sequence[int],
            overhead: IterationOverhead | None = None) -> list[int]:
        got = real(rows, caps, overhead)  # type: ignore[arg-type]
        if len(rows) > 1:
            seen.add(tuple(got))
        return got

    monkeypatch.setattr(loop, "choose_gammas", spy)
    explored: list[bool] = []
    real_explore = batch_gamma.explore

    def explore_spy(choice: list[int], *args: object) -> list[int]:
        got = real_explore(list(choice), *args)  # type: ignore[arg-type]
        explored.append(got != choice)
        return got

    monkeypatch.setattr(batch_gamma, "explore", explore_spy)
    prompts, budgets = BATCHES[rows]
    run, target = _auto_batch_runner(method, prompts, budgets, BALANCED.single(), rows,
                                     per_position, levels, explore_every)
    law = engine_law(run, rows=rows)
    assert any(max(g) == 0 for g in seen) and any(max(g) > 0 for g in seen)
    if explore_every != 1:
        assert not any(explored)
    elif rows == 2:  # the two-row batches decode long enough to explore (three rows end first)
        assert any(explored)
    want: dict[tuple[tuple[int, ...], ...], float] = {(): 1.0}
    for p, n in zip(prompts, budgets, strict=True):
        want = {(*k, kb): pk * pb for k, pk in want.items()
                for kb, pb in target_law(target, p, Sampling(), n).items()}
    assert abs(sum(law.values()) - 1) < TOLERANCE * 10
    assert max(abs(law.get(k, 0.0) - want.get(k, 0.0)) for k in set(law) | set(want)) < TOLERANCE


def test_the_batched_harness_catches_a_biased_verifier() -> None:
    """Negative control: the same batches under the batch policy with a verifier that draws
    Y from p after a rejection are told apart from the target."""
    prompts, budgets = BATCHES[2]
    run, target = _auto_batch_runner(TargetResidual(), prompts, budgets, BALANCED.single(), 2)
    law = engine_law(run, rows=2)
    assert max(tv_distance(marginal(law, b), target_law(target, p, Sampling(), n))
               for b, (p, n) in enumerate(zip(prompts, budgets, strict=True))) > 1e-3
