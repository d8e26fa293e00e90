"""``--gamma auto`` in a batch: the draft lengths of all rows are chosen together from the
measured cost of a batched pass, with no batch-size constant — whether speculation pays at
8 rows follows from the cost grid alone; the choice keeps every lossless method exact.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace

import pytest
from verifier_doubles import TargetResidual

from verispec.api import make_drafter
from verispec.checks import TOLERANCE
from verispec.engine import batch_gamma, loop
from verispec.engine.batch_gamma import RowDemand, batch_choice, choose_gammas
from verispec.engine.costs import Acceptance, BatchCosts
from verispec.engine.gamma import AcceptanceCounts, AutoGamma, PassCosts
from verispec.engine.loop import Engine
from verispec.engine.overhead import EXPLORE_EVERY, IterationOverhead
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


def _rows(policies: Sequence[object]) -> list[SimpleNamespace]:
    """Engine rows as the batch policy sees them: each with its γ policy and one draft."""
    return [SimpleNamespace(request=SimpleNamespace(gamma=p), num_drafts=1) for p in policies]


def counts(rate: float, positions: float,
           into: AcceptanceCounts | None = None) -> AcceptanceCounts:
    """``into`` (or new counts) with ``positions`` more tested positions accepted at
    ``rate``, a quarter of them first positions of blocks."""
    c = AcceptanceCounts() if into is None else into
    c.first_tested += positions / 4
    c.first_accepted += rate * positions / 4
    c.rest_tested += 3 * positions / 4
    c.rest_accepted += 3 * rate * positions / 4
    return c


def _choice(costs: BatchCosts, rows: int, alpha: float = ALPHA) -> list[int]:
    return batch_choice([RowDemand(Acceptance.iid(alpha), 0, MAX_GAMMA)] * rows, costs)


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
    demands = [RowDemand(Acceptance.iid(0.9), 0, 2), RowDemand(Acceptance.iid(0.1), 1, 3),
               RowDemand(Acceptance.iid(0.9), 0, 0),
               RowDemand(Acceptance.iid(0.5), 0, 3, fixed=True)]
    got = batch_choice(demands, FLAT)
    assert got[0] <= 2 and got[1] >= 1 and got[2] == 0 and got[3] == 3
    assert batch_choice([RowDemand(Acceptance.iid(0.3), 0, 0)] * 3, LINEAR) == [0, 0, 0]


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
    """Noiseless iterations of c₀ + c₁·R + c₂·R·g seconds, g up to 3: the fit predicts
    unseen row counts; a draft longer than any recorded is priced at the longest one."""
    c0, c1, c2 = 0.004, 0.002, 0.006
    learned = IterationOverhead()
    assert learned.predict(8, 4) == 0.0  # nothing seen: drafting is assumed free
    for i in range(300):
        rows, g = 2 + i % 5, (i // 5) % 4
        learned.observe(rows, g, c0 + c1 * rows + c2 * rows * g)
    assert learned.reach == 3
    assert learned.predict(8, 3) == pytest.approx(c0 + c1 * 8 + c2 * 24, rel=0.02)
    assert learned.predict(8, 6) == pytest.approx(learned.predict(8, 3))
    assert learned.predict(3, 0) == pytest.approx(c0 + c1 * 3, rel=0.02)


def test_own_time_is_not_extrapolated_beyond_the_drafts_recorded() -> None:
    """Every drafting iteration drafted one token (c₂ and c₃ not told apart): a draft of 6
    is priced at the one-token draft's own time, not at a slope the fit never measured;
    once drafts of 6 are recorded, their own time is learned, and as they age (decayed
    below REACH_WEIGHT) the longest draft that is still recorded sets the price again."""
    learned = IterationOverhead()
    for i in range(200):
        learned.observe(1, i % 2, 0.001 + 0.004 * (i % 2))
    assert learned.reach == 1
    assert learned.own_time(1, 6) == pytest.approx(learned.own_time(1, 1))
    assert learned.own_time(1, 1) == pytest.approx(0.005, rel=0.05)
    for i in range(200):
        g = (0, 1, 6)[i % 3]
        learned.observe(1, g, 0.001 + (0.0035 + 0.0005 * g if g else 0.0))
    assert learned.reach == 6
    assert learned.own_time(1, 6) == pytest.approx(0.0075, rel=0.05)
    for _ in range(400):
        learned.observe(1, 1, 0.005)
    assert learned.reach == 1


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


def test_a_prediction_is_kept_only_until_the_next_recorded_iteration() -> None:
    """The batch policy prices each shape for many candidate choices per iteration, so a
    prediction is kept per shape; every recorded iteration (new levels, a new fit) replaces
    it with what the record now says, and passes slowing down move it."""
    policy = AutoGamma(LINEAR.single(), max_gamma=MAX_GAMMA)
    learned, moved = IterationOverhead(), 0
    for i in range(30):
        g = [0, 2, 4][i % 3]
        slow = 1.0 + i / 10  # the passes slow down iteration by iteration
        passes = (slow * LINEAR.draft_passes(8, g), slow * LINEAR.target_pass(8, g + 1))
        before = learned.predict(8, 4)
        learned.record(_rows([policy] * 8), [g] * 8, sum(passes) + 0.01,  # type: ignore[arg-type]
                       passes)
        after = learned.predict(8, 4)
        assert after == learned.drift(8, 4) + learned.own_time(8, 4)
        moved += after != before
    assert moved == 30


def test_a_shape_the_grid_underprices_is_learned() -> None:
    """A grid on which 8 rows draft (extra tokens nearly free); the engine measures one-token
    passes as the grid says (the level stays 1) and multi-token passes dearer than its shape
    says: the excess is learned beyond the re-levelled passes and the batch decodes
    plainly."""
    cheap_tokens = _grid(lambda r, k: 0.3 + 0.1 * r + 0.02 * r * k)
    policy = AutoGamma(cheap_tokens.single(), max_gamma=MAX_GAMMA)
    demands = [RowDemand(Acceptance.iid(ALPHA), 0, MAX_GAMMA)] * 8
    assert all(g > 0 for g in batch_choice(demands, cheap_tokens))
    learned = IterationOverhead()
    for i in range(60):
        g = [0, 0, 0, 2, 4][i % 5]
        passes = (g * cheap_tokens.draft_step(8), cheap_tokens.target_pass(8, g + 1) + 0.15 * 8 * g)
        learned.record(_rows([policy] * 8), [g] * 8, sum(passes), passes)  # type: ignore[arg-type]
    assert learned.target_level.scale == pytest.approx(1.0)
    assert batch_choice(demands, cheap_tokens, learned) == [0] * 8


def test_a_noisy_grid_is_made_monotone() -> None:
    """Timings that say more work is cheaper (a busy moment during the start-up timing,
    which only slows a timing down) give way to the larger pass's time: the fit is
    non-decreasing in tokens and in rows, and a monotone grid is left as it is."""
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
    assert fit.target[(4, 1)] == fit.target[(8, 1)] == noisy[(8, 1)]
    assert fit.target[(4, 8)] == fit.target[(4, 4)] == noisy[(4, 8)]
    assert fit.target[(1, 1)] == LINEAR.target[(1, 1)]
    assert fit.draft == {1: 0.02, 2: 0.02, 4: 0.04, 8: 0.05}


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
        rows, g = 4 + i % 5, i % (MAX_GAMMA + 1)
        costly.observe(rows, g, 0.1 * rows * g)
    demands = [RowDemand(Acceptance.iid(ALPHA), 0, MAX_GAMMA)] * 8
    assert batch_choice(demands, FLAT, costly) == [0] * 8
    assert batch_choice(demands, FLAT, IterationOverhead()) == _choice(FLAT, 8)


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
