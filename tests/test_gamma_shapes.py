"""``--gamma auto`` in a batch when the start-up grid's *shape* is wrong (not only its
level): target passes are predicted per measured shape (rows × tokens) and an iteration's
draft passes per rows × γ (its first pass feeds two tokens per row), and a batch that keeps
drafting decodes plainly now and then when plain decoding is predicted close, so that a grid
which priced the two wrongly against each other is corrected from measured passes on both
sides.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from test_gamma_batch import DRAFT_STEP, KS, MAX_GAMMA, ROWS, _rows, counts

from verispec.engine.batch_gamma import (READING_MARGIN, RowDemand, batch_choice, batch_rate,
                                         choose_gammas, reading_choice)
from verispec.engine.costs import Acceptance, BatchCosts
from verispec.engine.gamma import AutoGamma, FixedGamma, PairHistory
from verispec.engine.overhead import (EXPLORE_EVERY, SHAPE_FRESH, SHAPE_PRIOR, SHAPE_TRUSTED,
                                      SHAPE_WINDOW, SLOPE_SPAN, IterationOverhead, PassLevel,
                                      ShapeLevels)

pytestmark = pytest.mark.usefixtures("one_thread")

#: The acceptance of every drafted position of every row (i.i.d., from a seeded generator).
ACCEPT = 0.8
Seconds = Callable[[int, int], float]


def _grid(seconds: Seconds) -> BatchCosts:
    return BatchCosts(target={(r, k): seconds(r, k) for r in ROWS for k in KS},
                      draft=DRAFT_STEP, draft_prefill=1e-3)


def _decode(grid: BatchCosts, truth: Seconds, rows: int, iterations: int,
            drafted: bool) -> tuple[list[int], list[AutoGamma]]:
    """``iterations`` of a batch of ``rows`` auto rows on ``grid`` whose target passes take
    ``truth(R, k)`` (draft steps as the grid says); ``drafted``: the drafts have read their
    contexts. Returns every iteration's longest draft and the rows' policies."""
    policies = [AutoGamma(grid.single(), max_gamma=MAX_GAMMA) for _ in range(rows)]
    for p in policies:
        p.start(100, 10_000)  # reading a context costs 0.1 s
        if drafted:
            p.observe(2, 2)
    batch = _rows(policies)
    overhead, longest, draws = IterationOverhead(), [], random.Random(0)
    for _ in range(iterations):
        gammas = choose_gammas(batch, [MAX_GAMMA] * rows, overhead)  # type: ignore[arg-type]
        g = max(gammas)
        passes = (g * grid.draft_step(rows), truth(rows, g + 1))
        overhead.record(batch, gammas, sum(passes), passes)  # type: ignore[arg-type]
        for p, x in zip(policies, gammas, strict=True):
            p.observe(x, next((i for i in range(x) if draws.random() >= ACCEPT), x))
        longest.append(g)
    return longest, policies


#: A grid on which extra tokens per row are nearly free, so 8 rows draft the longest block.
CHEAP_TOKENS = _grid(lambda r, k: 0.3 + 0.1 * r + 0.02 * r * k)


def _dear_tokens(r: int, k: int) -> float:
    """The passes as they run: each extra token per row costs 0.15 s a row more than
    CHEAP_TOKENS says, so plain decoding of 8 rows is the fastest side."""
    return CHEAP_TOKENS.target_pass(r, k) + 0.15 * r * (k - 1)


#: A grid on which 4 rows decode plainly (each token per row dear), against passes that grow
#: little with tokens (:func:`_cheap_tokens`), where drafting the longest block is best.
DEAR_TOKENS = _grid(lambda r, k: 0.1 + 0.2 * r * k)


def _cheap_tokens(r: int, k: int) -> float:
    return 0.3 + 0.2 * r + 0.01 * r * (k - 1)


def test_shape_times_interpolate_extrapolate_and_age() -> None:
    """Between measured shapes of one row count the time is interpolated in tokens, beyond
    the longest it grows along the last slope, below the shortest (or from a single shape)
    with the grid's shape; another row count is not predicted. A shape not seen for
    SHAPE_FRESH iterations is kept, at the level of its last pass, where it was measured
    SHAPE_TRUSTED times, and forgotten where it was measured fewer."""
    shapes = ShapeLevels()
    for t in (1.0, 5.0, 1.0):  # a median: one busy pass does not count
        shapes.observe((8, 2), t, now=0)
    shapes.observe((8, 4), 2.0, now=0)
    grid = {1: 0.5, 2: 1.0, 3: 1.5, 4: 2.0, 6: 3.0}.__getitem__
    assert shapes.seconds(8, 3, 0, grid) == pytest.approx(1.5)
    assert shapes.seconds(8, 6, 0, grid) == pytest.approx(3.0)
    assert shapes.seconds(8, 1, 0, grid) == pytest.approx(0.5)
    assert shapes.seconds(4, 2, 0, grid) is None
    shapes.observe((8, 4), 4.0, now=10)
    shapes.observe((8, 4), 3.0, now=10)
    assert shapes.seconds(8, 4, SHAPE_FRESH + 5, grid) == pytest.approx(3.0)  # median of 2, 4, 3
    assert shapes.seconds(8, 2, SHAPE_FRESH + 5, grid) == pytest.approx(1.0)  # (8, 2) aged, kept
    assert shapes.seconds(8, 4, SHAPE_FRESH + 11, grid) == pytest.approx(3.0)  # both aged
    # the passes now run 1.5x the level at which both were measured: both move with it

    def slower(k: int) -> float:
        return 1.5 * grid(k)

    assert shapes.seconds(8, 2, SHAPE_FRESH + 11, slower, level=1.5) == pytest.approx(1.5)
    assert shapes.seconds(8, 4, SHAPE_FRESH + 11, slower, level=1.5) == pytest.approx(4.5)
    assert shapes.seconds(8, 4, SHAPE_FRESH + 5, slower, level=1.5) == pytest.approx(
        (SHAPE_TRUSTED * 3.0 / slower(4) + SHAPE_PRIOR * 1.0) / (SHAPE_TRUSTED + SHAPE_PRIOR)
        * slower(4))  # (8, 4) fresh, as measured, toward the line of (8, 2) at the new level
    shapes.observe((4, 3), 1.5, now=0)  # one pass
    assert shapes.seconds(4, 3, SHAPE_FRESH, grid) == pytest.approx(1.5)
    assert shapes.seconds(4, 3, SHAPE_FRESH + 1, grid) is None


def _measured(times: dict[int, tuple[float, int]]) -> ShapeLevels:
    """Shapes of one row: k -> (seconds of each pass, passes)."""
    shapes = ShapeLevels()
    for k, (t, n) in times.items():
        for _ in range(n):
            shapes.observe((1, k), t, now=0)
    return shapes


def test_a_shape_timed_in_a_busy_minute_is_taken_toward_the_shapes_beside_it() -> None:
    """Four shapes of one row measured over whole windows at the grid's times, and a
    4-token shape measured SHAPE_TRUSTED times in a busy minute, 1.4 × the grid (dearer
    than the 7-token pass): its factor is taken SHAPE_PRIOR passes' worth toward the line
    through all five, so a 4-token pass is again predicted below a 7-token one; the shapes
    measured over a window stay within a few percent of their own times."""
    grid = {k: 0.1 + 0.02 * k for k in range(1, 12)}.__getitem__
    full = SHAPE_WINDOW
    shapes = _measured({1: (grid(1), full), 2: (grid(2), full), 3: (grid(3), full),
                        4: (1.4 * grid(4), SHAPE_TRUSTED), 7: (grid(7), full)})
    assert 1.4 * grid(4) > grid(7)  # as measured, 4 tokens cost more than 7
    four = shapes.seconds(1, 4, 0, grid)
    assert four is not None and four < shapes.seconds(1, 7, 0, grid)  # type: ignore[operator]
    assert grid(4) < four < 1.25 * grid(4)  # still dearer than the grid, but mostly the others'
    for k in (1, 2, 3, 7):
        assert shapes.seconds(1, k, 0, grid) == pytest.approx(grid(k), rel=0.05)


def test_passes_beyond_the_measured_shapes_keep_the_grids_shape() -> None:
    """Beyond the longest (or below the shortest) fresh shape the factor stays at that
    shape's; two shapes one token apart (less than SLOPE_SPAN) are fitted by a constant, a
    wider span by a line; the fitted line stays within the measured factors."""
    grid = {k: 0.5 * k for k in range(1, 10)}.__getitem__
    assert SLOPE_SPAN == 2
    adjacent = _measured({2: (1.0, SHAPE_TRUSTED), 3: (2.0, SHAPE_TRUSTED)})  # 1.0, 4/3
    mean = (1.0 + 4 / 3) / 2
    nine = grid(9) * (SHAPE_TRUSTED * 4 / 3 + SHAPE_PRIOR * mean) / (SHAPE_TRUSTED + SHAPE_PRIOR)
    assert adjacent.seconds(1, 9, 0, grid) == pytest.approx(nine)
    assert adjacent.seconds(1, 9, 0, grid) == pytest.approx(3 * adjacent.seconds(1, 3, 0, grid))
    one = grid(1) * (SHAPE_TRUSTED * 1.0 + SHAPE_PRIOR * mean) / (SHAPE_TRUSTED + SHAPE_PRIOR)
    assert adjacent.seconds(1, 1, 0, grid) == pytest.approx(one)
    rising = _measured({2: (1.0, SHAPE_TRUSTED), 4: (3.0, SHAPE_TRUSTED)})  # factors 1.0, 1.5
    assert rising.seconds(1, 2, 0, grid) == pytest.approx(1.0)  # on the line: its own
    assert rising.seconds(1, 4, 0, grid) == pytest.approx(3.0)
    assert rising.seconds(1, 3, 0, grid) == pytest.approx(grid(3) * 1.25)
    assert rising.seconds(1, 8, 0, grid) == pytest.approx(grid(8) * 1.5)


def test_a_shape_measured_few_times_is_not_priced_above_the_grid() -> None:
    """One slow pass of a shape (a busy moment) would keep the policy off that shape, and
    so from measuring it again, for SHAPE_FRESH iterations: until SHAPE_TRUSTED passes are
    known, its time is at most the grid's (at the current level); from then on the median
    stands."""
    grid = {k: 0.1 * k for k in range(1, 10)}.__getitem__
    shapes = ShapeLevels()
    shapes.observe((1, 5), 0.9, now=0)  # grid 0.5
    assert shapes.seconds(1, 5, 0, grid) == pytest.approx(0.5)
    shapes.observe((1, 5), 0.3, now=1)
    assert shapes.seconds(1, 5, 1, grid) == pytest.approx(0.5)  # median 0.6, capped
    shapes.observe((1, 5), 0.8, now=2)
    assert shapes.seconds(1, 5, 2, grid) == pytest.approx(0.8)  # three passes: the median


def test_a_batch_that_drafts_on_a_wrong_shape_explores_plain_decoding() -> None:
    """8 rows draft on a grid that underprices extra tokens; their passes, all of one
    shape, say only that drafting runs slower than the grid, which would price plain
    passes as dear too. After EXPLORE_EVERY iterations the batch runs one plain iteration,
    measures it at the grid's time and decodes plainly from then on."""
    truth_rates = {g: 8 * sum(ACCEPT ** i for i in range(g + 1))
                   / (g * CHEAP_TOKENS.draft_step(8) + _dear_tokens(8, g + 1))
                   for g in range(MAX_GAMMA + 1)}
    assert max(truth_rates, key=truth_rates.__getitem__) == 0
    longest, _ = _decode(CHEAP_TOKENS, _dear_tokens, 8, 4 * EXPLORE_EVERY, drafted=True)
    assert all(g > 0 for g in longest[:EXPLORE_EVERY])
    assert longest[EXPLORE_EVERY:] == [0] * (3 * EXPLORE_EVERY)


@pytest.mark.parametrize("drafted", [True, False])
def test_a_plain_batch_is_not_explored_towards_drafting(drafted: bool) -> None:
    """4 rows decoding plainly on a grid that prices tokens dear, drafting predicted within
    the margin and cheaper in truth: the batch stays plain (before drafting, its drafts
    would read every token decoded since they last drafted, or the whole context, which
    the iteration's rate does not show), and drafts that have not read never read."""
    plain = 4 / DEAR_TOKENS.target_pass(4, 1)
    one = 4 * (1 + ACCEPT) / (DEAR_TOKENS.draft_step(4) + DEAR_TOKENS.target_pass(4, 2))
    assert 0.75 * plain < one < plain
    longest, policies = _decode(DEAR_TOKENS, _cheap_tokens, 4, 3 * EXPLORE_EVERY, drafted)
    assert longest == [0] * (3 * EXPLORE_EVERY)
    assert all(p.drafting for p in policies) == drafted


def test_a_side_predicted_far_slower_is_not_explored() -> None:
    """Plain decoding 8 rows whose drafts have read, on a grid where every token per row
    and every draft step is dear (the grid right): drafting is predicted far below the
    margin even at the grid's time, so the batch never explores it."""
    steep = BatchCosts(target={(r, k): 0.1 + 0.3 * r * k for r in ROWS for k in KS},
                       draft=dict.fromkeys(ROWS, 2.0), draft_prefill=1e-3)
    longest, _ = _decode(steep, steep.target_pass, 8, 4 * EXPLORE_EVERY, drafted=True)
    assert longest == [0] * (4 * EXPLORE_EVERY)


def test_draft_steps_are_predicted_per_row_count() -> None:
    """Draft steps that run as the grid says over one row and 1.5× the grid over 8 rows:
    the drift of an iteration is predicted from each row count's own measured steps (the
    level of all steps would misprice both)."""
    policy = AutoGamma(CHEAP_TOKENS.single(), max_gamma=MAX_GAMMA)
    overhead = IterationOverhead()
    for i in range(40):
        rows = 1 if i % 2 else 8
        scale = 1.0 if rows == 1 else 1.5
        passes = (scale * 2 * CHEAP_TOKENS.draft_step(rows), CHEAP_TOKENS.target_pass(rows, 3))
        batch = _rows([policy] * rows)
        overhead.record(batch, [2] * rows, sum(passes), passes)  # type: ignore[arg-type]
    assert overhead.drift(1, 4) == pytest.approx(0.0, abs=1e-12)
    assert overhead.drift(8, 4) == pytest.approx(0.5 * 4 * CHEAP_TOKENS.draft_step(8))
    assert overhead.draft_level.scale == pytest.approx(1.25)  # the median of all steps


def _record(overhead: IterationOverhead, policy: object, rows: int, g: int, grid: BatchCosts,
            times: int = SHAPE_TRUSTED, drafter: object = None) -> None:
    """``times`` iterations of ``rows`` rows of ``policy`` (drafting with ``drafter``) at
    longest draft g, every pass at the grid's time."""
    request = SimpleNamespace(gamma=policy, drafter=drafter)
    batch = [SimpleNamespace(request=request, num_drafts=1)] * rows
    passes = (g * grid.draft_step(rows), grid.target_pass(rows, g + 1))
    for _ in range(times):
        overhead.record(batch, [g] * rows, sum(passes), passes)  # type: ignore[arg-type]


def test_a_reading_within_the_margin_waits_until_both_sides_are_measured() -> None:
    """8 rows whose drafts have not read, the readings at 0.9× what drafting saves by the
    grid: with the grid's shapes unmeasured, each side is taken READING_MARGIN against the
    reading and the batch decodes plainly; once the plain and the drafting shapes have
    been measured (at the grid's times), the same readings are paid. Readings at 1.1×
    the saving are not all paid."""
    rows, tokens, alpha = 8, 48.0, 0.9
    demands = [RowDemand(Acceptance.iid(alpha), 0, MAX_GAMMA)] * rows
    g = max(batch_choice(demands, CHEAP_TOKENS))
    assert g > 0
    saving = rows * tokens * (1 / batch_rate(demands, CHEAP_TOKENS, 0)
                              - 1 / batch_rate(demands, CHEAP_TOKENS, g))
    # the margin takes more than a tenth of the saving off: without it 0.9× would pay
    margin_saving = rows * tokens * ((1 - READING_MARGIN) / batch_rate(demands, CHEAP_TOKENS, 0)
                                     - (1 + READING_MARGIN) / batch_rate(demands, CHEAP_TOKENS, g))
    assert margin_saving < 0.9 * saving
    policy = AutoGamma(CHEAP_TOKENS.single(), max_gamma=MAX_GAMMA)
    overhead: IterationOverhead | None = None

    def reads(share: float) -> bool:
        readings = {b: (share * saving / rows, tokens) for b in range(rows)}
        choice, _ = reading_choice(demands, readings, CHEAP_TOKENS, overhead)
        return min(choice) > 0  # all of them

    assert reads(0.9) and not reads(1.1)  # no overhead: the grid is taken as measured
    overhead = IterationOverhead()
    assert not reads(0.9)
    _record(overhead, policy, 1, 1, CHEAP_TOKENS)  # the grid is known, 8-row shapes are not
    assert not overhead.measured(rows, 0) and not reads(0.9)
    _record(overhead, policy, rows, 0, CHEAP_TOKENS)
    assert overhead.measured(rows, 0) and not overhead.measured(rows, g)
    _record(overhead, policy, rows, g, CHEAP_TOKENS)
    assert overhead.measured(rows, g) and reads(0.9) and not reads(1.1)
    # a plain stretch ages the drafting shapes out: still measured, the readings still paid
    _record(overhead, policy, rows, 0, CHEAP_TOKENS, times=SHAPE_FRESH + 1)
    assert not overhead.draft_shapes.fresh((rows, g), overhead.iterations)
    assert overhead.measured(rows, g) and reads(0.9) and not reads(1.1)


def test_passes_of_rows_with_a_fixed_gamma_measure_the_shapes_of_the_grid() -> None:
    """An engine whose ``auto`` rows have given it a grid also times the iterations of rows
    with a fixed γ: their passes cost what the same shapes cost any row. Before any
    ``auto`` row, there is no grid to hold them against; fixed rows that draft with a
    drafter that steps unlike the ``auto`` rows' are not recorded (the grid did not time
    it), and a drafter over the same draft weights counts as theirs."""
    model, ngram = SimpleNamespace(cost_key=("model", 1)), SimpleNamespace(cost_key=("ngram",))
    twin = SimpleNamespace(cost_key=("model", 1))  # another drafter over the same weights
    overhead = IterationOverhead()
    _record(overhead, FixedGamma(0), 8, 0, CHEAP_TOKENS)
    assert overhead.iterations == 0 and not overhead.measured(8, 0)
    _record(overhead, AutoGamma(CHEAP_TOKENS.single(), max_gamma=MAX_GAMMA), 1, 1,
            CHEAP_TOKENS, times=1, drafter=model)
    _record(overhead, FixedGamma(0), 8, 0, CHEAP_TOKENS)
    assert overhead.measured(8, 0) and overhead.iterations == 1 + SHAPE_TRUSTED
    _record(overhead, FixedGamma(2), 8, 2, CHEAP_TOKENS, drafter=ngram)
    assert not overhead.measured(8, 2) and overhead.iterations == 1 + SHAPE_TRUSTED
    _record(overhead, FixedGamma(2), 8, 2, CHEAP_TOKENS, drafter=twin)
    assert overhead.measured(8, 2) and overhead.iterations == 1 + 2 * SHAPE_TRUSTED


def _first_pass_grid(ratio: float) -> BatchCosts:
    """CHEAP_TOKENS with an iteration's first draft pass (two tokens per row) at ``ratio``
    × a one-token step over 8 rows (and over one row)."""
    return BatchCosts(target=CHEAP_TOKENS.target, draft=DRAFT_STEP,
                      draft_first={1: DRAFT_STEP[1], 8: ratio * DRAFT_STEP[8]})


def test_an_iterations_first_draft_pass_is_priced_at_two_tokens_per_row() -> None:
    """γ draft passes cost the first pass (two tokens per row) and γ − 1 steps; a grid
    without first passes prices them as steps; a recorded grid keeps them, and a first
    pass timed below a step is noise (raised to the step)."""
    grid = _first_pass_grid(1.6)
    assert grid.draft_passes(8, 0) == 0.0
    assert grid.draft_passes(8, 3) == pytest.approx(1.6 * DRAFT_STEP[8] + 2 * DRAFT_STEP[8])
    assert grid.draft_first_pass(4) == pytest.approx(  # interpolated in rows
        DRAFT_STEP[1] + (1.6 * DRAFT_STEP[8] - DRAFT_STEP[1]) * 3 / 7)
    assert CHEAP_TOKENS.draft_passes(8, 3) == pytest.approx(3 * DRAFT_STEP[8])
    assert grid.iteration(8, 2) == pytest.approx(grid.draft_passes(8, 2)
                                                 + grid.target_pass(8, 3))
    assert BatchCosts.from_json(grid.to_json()) == grid
    single = grid.single()
    assert single.iteration(2) == pytest.approx(grid.iteration(1, 2))
    assert _first_pass_grid(0.5).monotone().draft_first[8] == pytest.approx(DRAFT_STEP[8])


def test_a_dear_first_draft_pass_keeps_a_batch_plain() -> None:
    """The same target passes, acceptance and draft steps: where an 8-row first draft pass
    costs what a step does the batch drafts, where it costs twice a step (a compute-bound
    draft pass over 16 tokens) it decodes plainly; one row drafts on both."""
    target = {(r, k): 0.1 + 0.01 * r + 0.005 * r * k for r in ROWS for k in KS}

    def grid(ratio: float) -> BatchCosts:
        return BatchCosts(target=target, draft=DRAFT_STEP,
                          draft_first={1: DRAFT_STEP[1], 8: ratio * DRAFT_STEP[8]})

    demands = [RowDemand(Acceptance.iid(0.5), 0, MAX_GAMMA)] * 8
    assert max(batch_choice(demands, grid(1.0))) > 0
    assert batch_choice(demands, grid(2.0)) == [0] * 8
    assert max(batch_choice(demands[:1], grid(2.0))) > 0


def test_draft_passes_are_predicted_per_rows_and_gamma() -> None:
    """Iterations of 8 rows at γ 1 whose draft passes take 1.5× the grid (the first pass
    dearer than the grid says): γ 1 is predicted as measured, γ 3 from it with the grid's
    shape (first pass plus steps), and only γ 1 counts as measured."""
    grid = _first_pass_grid(1.6)
    policy = AutoGamma(grid.single(), max_gamma=MAX_GAMMA)
    overhead = IterationOverhead()
    batch = _rows([policy] * 8)
    measured = 1.5 * grid.draft_passes(8, 1)
    for _ in range(SHAPE_TRUSTED):
        passes = (measured, grid.target_pass(8, 2))
        overhead.record(batch, [1] * 8, sum(passes), passes)  # type: ignore[arg-type]
    assert overhead.drift(8, 1) == pytest.approx(measured - grid.draft_passes(8, 1))
    assert overhead.drift(8, 3) == pytest.approx(0.5 * grid.draft_passes(8, 3))
    assert overhead.measured(8, 0) is False and overhead.draft_shapes.trusted((8, 1), 3)
    assert not overhead.draft_shapes.fresh((8, 3), overhead.iterations)


def test_a_draft_level_from_fewer_than_trusted_passes_is_not_above_the_grid() -> None:
    """A capped level (the draft passes') from fewer than SHAPE_TRUSTED passes is at most 1
    (the grid); from SHAPE_TRUSTED passes on the median stands; a level below 1 is taken at
    once; an uncapped level (the target pass's) takes the median from the first pass."""
    slow = PassLevel(capped=True)
    for n in range(1, SHAPE_TRUSTED + 1):
        slow.observe(3.0, 1.0)
        assert slow.scale == (pytest.approx(3.0) if n >= SHAPE_TRUSTED else 1.0)
    fast = PassLevel(capped=True)
    fast.observe(0.5, 1.0)
    assert fast.scale == pytest.approx(0.5)
    target = PassLevel()
    target.observe(3.0, 1.0)
    assert target.scale == pytest.approx(3.0)


def test_one_slow_first_draft_pass_does_not_keep_a_request_plain() -> None:
    """Plain iterations at the grid's times, then one drafting iteration whose draft pass
    took 4× the grid (a process's first draft pass, in a warm-up call): a request alone at
    the pair's α = 0.9 still drafts after its first token. Priced at that one pass, every
    γ ≥ 1 would be predicted below plain decoding, and the request would never draft (and
    so never measure a draft pass again)."""
    grid = BatchCosts(target={(1, k): 0.085 + 0.0045 * k for k in KS}, draft={1: 0.022},
                      draft_prefill=1e-3)
    history = PairHistory()
    counts(0.9, 1000, into=history)
    policy = AutoGamma(grid.single(), max_gamma=12, history=history)
    [row] = _rows([policy])
    overhead = IterationOverhead()
    plain = (0.0, grid.target_pass(1, 1))
    for _ in range(100):
        overhead.record([row], [0], sum(plain), plain)  # type: ignore[list-item]
    first = (4 * grid.draft_passes(1, 1), grid.target_pass(1, 2))
    overhead.record([row], [1], sum(first), first)  # type: ignore[list-item]
    assert overhead.draft_level.scale == 1.0
    policy.start(100, 64, fixed_length=True)
    policy.observe(0, 0)  # its first token, decoded plainly
    assert choose_gammas([row], [12], overhead)[0] > 0  # type: ignore[list-item]


@pytest.mark.parametrize(("draft_slowdown", "explores"), [(4.0, True), (12.0, False)])
def test_a_request_alone_explores_drafting_measured_long_ago(draft_slowdown: float,
                                                             explores: bool) -> None:
    """Draft passes measured ``draft_slowdown``× the grid (in another state of the machine),
    then plain iterations only: a request alone at the pair's α = 0.9 whose draft has not
    read its context decodes plainly while those passes are recent; once no drafting
    iteration has been recorded for SHAPE_FRESH iterations it reads and drafts where
    drafting is predicted within EXPLORE_MARGIN of plain decoding (4×), and not where it
    is predicted far slower (12×); nor does a request whose reading (a 5,000-token prompt)
    would cost more than that share of its plain decoding. Drafting at the grid's speed in
    the exploring iteration, the request keeps drafting: the passes of the other minute no
    longer set the draft's level or its shapes' times."""
    grid = BatchCosts(target={(1, k): 0.085 + 0.0045 * k for k in KS}, draft={1: 0.022},
                      draft_prefill=1e-3)
    history = PairHistory()
    counts(0.9, 1000, into=history)
    overhead = IterationOverhead()
    [row] = _rows([AutoGamma(grid.single(), max_gamma=12, history=history)])
    plain = (0.0, grid.target_pass(1, 1))
    drafting = (draft_slowdown * grid.draft_passes(1, 4), grid.target_pass(1, 5))
    for _ in range(8):
        overhead.record([row], [4], sum(drafting), drafting)  # type: ignore[list-item]

    def alone(context: int = 100) -> tuple[int, AutoGamma]:
        policy = AutoGamma(grid.single(), max_gamma=12, history=history)
        policy.start(context, 64)
        policy.observe(0, 0)  # its first token, decoded plainly
        row.request.gamma = policy
        return choose_gammas([row], [12], overhead)[0], policy  # type: ignore[list-item]

    for _ in range(20):
        overhead.record([row], [0], sum(plain), plain)  # type: ignore[list-item]
    assert not overhead.drafting_stale(1)
    gamma, policy = alone()
    assert gamma == 0 and not policy.drafting
    for _ in range(SHAPE_FRESH):
        overhead.record([row], [0], sum(plain), plain)  # type: ignore[list-item]
    assert overhead.drafting_stale(1)
    assert alone(context=5000)[0] == 0
    gamma, policy = alone()
    assert (gamma > 0) == explores and policy.drafting == explores
    if explores:  # the draft runs at the grid's speed now: one iteration re-prices drafting
        now = (grid.draft_passes(1, gamma), grid.target_pass(1, gamma + 1))
        overhead.record([row], [gamma], sum(now), now)  # type: ignore[list-item]
        policy.observe(gamma, gamma)
        assert overhead.draft_level.scale == pytest.approx(1.0)
        assert choose_gammas([row], [12], overhead)[0] > 0  # type: ignore[list-item]
