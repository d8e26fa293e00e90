"""What an engine learns about its own iterations, for ``--gamma auto``
(:mod:`verispec.engine.batch_gamma` and a request alone, :meth:`AutoGamma.choose`).

**The engine's own time and the passes' drift.** Outside the model passes an iteration also
gathers p and q, verifies, samples and feeds the drafters, and that work grows with the rows
and the drafted positions (every position handles a vocabulary-wide distribution). The
start-up grid times passes only, and on a shared machine the passes themselves drift from
their start-up times (a busy minute at start-up, a guest that changes speed). So each engine
times its own iterations (:class:`IterationOverhead`): the draft passes and the target pass
of every iteration set the current level of each kind of pass against the grid
(:class:`PassLevel`: the grid gives the shape, recent passes the level), and the time left
over beyond the re-levelled passes is fitted in rows and drafted positions (the engine's
own work, and what the grid's shape misses). A choice of γ divides a rate by the
re-levelled passes plus that time. Both are estimated from earlier iterations only, so the
choice still depends only on the past.

**Shapes measured.** A level cannot correct a grid whose shape is wrong (a start-up timing
on a busy minute that made 5-token passes look dear against 1-token ones): target passes
are therefore predicted per shape (:class:`ShapeLevels`: rows × tokens, a factor on the
grid per shape measured at those rows, each taken toward a line through all of them,
interpolated in tokens; one not measured recently moved with the level since its last
pass) and an iteration's draft passes per rows × γ, where measured. Shapes the choice
stopped running are measured again by exploring: a batch that keeps drafting decodes
plainly now and then (:func:`~verispec.engine.batch_gamma.explore`), and a request alone
whose drafting has not been recorded lately drafts (:meth:`AutoGamma.choose` with
``explore``, told by :meth:`IterationOverhead.drafting_stale`).
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence

import torch

from verispec.drafters.base import Drafter
from verispec.engine.costs import BatchCosts, interpolate
from verispec.engine.gamma import AutoGamma, GammaPolicy
from verispec.engine.request import Row

__all__ = ["EXPLORE_EVERY", "LEVEL_WINDOW", "OVERHEAD_DECAY", "OVERHEAD_RIDGE", "REACH_WEIGHT",
           "SHAPE_FRESH", "SHAPE_PRIOR", "SHAPE_TRUSTED", "SHAPE_WINDOW", "SLOPE_SPAN",
           "IterationOverhead", "PassLevel", "ShapeLevels", "cache_rows", "shared_costs"]

#: Forgetting factor of :class:`IterationOverhead` per recorded iteration: the estimate
#: follows a change of load within a few hundred iterations.
OVERHEAD_DECAY = 0.99
#: Ridge weight pulling every overhead coefficient toward 0 (an unexplored draft length is
#: assumed free, so the policy tries it and learns its cost).
OVERHEAD_RIDGE = 0.1
#: Recorded iterations' worth of weight (decayed as :data:`OVERHEAD_DECAY`) that drafts at
#: least g must carry before the engine's own time is predicted as its fit at g
#: (:meth:`IterationOverhead.own_time`); beyond, at the longest draft that carries it.
REACH_WEIGHT = 2.0
#: Passes of one kind whose times set its current level (:class:`PassLevel`): enough that
#: one pass slowed by another process does not move the median, few enough that a change
#: of the machine's speed shows within a few seconds of decoding.
LEVEL_WINDOW = 24
#: Passes of one shape (rows, tokens) whose median time predicts that shape.
SHAPE_WINDOW = 8
#: Passes of a shape from which its median is trusted as measured; from fewer it is
#: capped at the grid's time at the current level.
SHAPE_TRUSTED = 3
#: Tokens per row that the fresh shapes of one row count must span before their factors on
#: the grid are fitted with a slope in tokens (the slope between two adjacent shapes, each a
#: median of a few noisy passes, is mostly noise: below this span the fit is a constant).
SLOPE_SPAN = 2
#: Passes' worth of weight with which each measured shape's factor is taken toward the line
#: fitted through the factors of all fresh shapes of its row count (:class:`ShapeLevels`): a
#: shape of SHAPE_TRUSTED passes keeps less than half its own, one of a whole window two thirds.
SHAPE_PRIOR = 4
#: Iterations after which a shape's own median is no longer taken as its time now (the
#: machine may have changed speed since): its factor on the grid is then taken at the level
#: of its last pass, and plain decoding on it may be explored.
SHAPE_FRESH = 256
#: Iterations between two explorations of a batch (at most 1 / EXPLORE_EVERY of the
#: iterations decode plainly where that is predicted up to
#: :data:`~verispec.engine.gamma.EXPLORE_MARGIN` slower).
EXPLORE_EVERY = 32

class PassLevel:
    """How fast one kind of pass (draft passes, target pass) runs now relative to the start-up
    grid: the median of measured / predicted over its last :data:`LEVEL_WINDOW` passes
    (1 before any). The grid keeps the shape (how a pass grows with rows and tokens); this
    factor follows its level.

    ``capped`` (the draft passes' level): from fewer than :data:`SHAPE_TRUSTED` passes the
    level is at most 1. The first draft pass of a process runs its kernels for the first
    time, and a short call before the timed ones (a warm-up that drafted once) left a draft
    level of 1.4–2.9 from that one pass; every later call then priced drafting that dear,
    decoded plainly, and so never measured a draft pass again (a whole 64-token call of 8
    prompts decoded plainly at one row). Target passes are measured by every iteration,
    plain or not, so their level corrects itself; draft passes only by the drafting
    iterations a level too high prevents."""

    def __init__(self, capped: bool = False) -> None:
        self.ratios: deque[float] = deque(maxlen=LEVEL_WINDOW)
        self.capped = capped

    def observe(self, measured: float, predicted: float) -> None:
        if measured > 0.0 and predicted > 0.0:
            self.ratios.append(measured / predicted)

    @property
    def scale(self) -> float:
        if not self.ratios:
            return 1.0
        median = statistics.median(self.ratios)
        few = self.capped and len(self.ratios) < SHAPE_TRUSTED
        return min(median, 1.0) if few else median


class ShapeLevels:
    """Measured times of passes per shape (cache rows R, tokens k; for the draft passes of
    an iteration, k = γ), kept as factors on the grid: each shape's median over its last
    :data:`SHAPE_WINDOW` passes, divided by the grid's time at the current level, for
    :data:`SHAPE_FRESH` iterations after its last pass.

    A shape's median rests on a few passes, often timed within one minute, while the
    shapes beside it were timed in others: on a shared machine one busy minute made a
    4-token pass of one row dearer than a 7-token one, and the policy, priced off every γ
    of that shape for :data:`SHAPE_FRESH` iterations, never measured it again. So the
    fresh shapes of one R are also fitted together: their factors, weighted by their
    passes, by a line in k (a constant where they span fewer than :data:`SLOPE_SPAN`
    tokens), and each shape's factor is taken :data:`SHAPE_PRIOR` passes' worth toward that
    line (a shape of few passes mostly follows the others; one measured over a whole
    window keeps the larger share of its own). Between the fresh shapes the factor is
    interpolated in k; beyond them it stays at the nearest one's, so the time follows the
    grid's shape from there.

    A shape not measured for :data:`SHAPE_FRESH` iterations (a plain stretch ages out every
    drafting shape) is not forgotten: once measured :data:`SHAPE_TRUSTED` times it stays in
    the fit as its median divided by the grid at the level of its last pass (``level`` of
    :meth:`observe`), so a change of the machine's speed since then moves it with the level,
    until it is measured again: then its window starts afresh (with fewer than
    :data:`SHAPE_TRUSTED` passes, capped at the grid), so that one exploring iteration is
    not outvoted by the passes of another minute. Forgotten, the drafting shapes of a batch
    that has decoded plainly for a while would fall back to the grid and be priced
    :data:`~verispec.engine.batch_gamma.READING_MARGIN` dearer as never measured: four new
    rows whose drafting was predicted 21% ahead of plain decoding stayed plain."""

    def __init__(self) -> None:
        self.times: dict[tuple[int, int], deque[float]] = {}
        self.seen: dict[tuple[int, int], int] = {}  # shape -> iteration of its last pass
        self.levels: dict[tuple[int, int], float] = {}  # shape -> level at its last pass
        # rows -> the ks used for those rows and their factors at iteration known_at (the
        # policy asks for many k and several row counts between two passes)
        self.known: dict[int, tuple[list[int], list[float]]] = {}
        self.known_at = -1

    def observe(self, shape: tuple[int, int], measured: float, now: int,
                level: float = 1.0) -> None:
        """A pass of ``shape`` took ``measured`` seconds while its kind of pass ran at
        ``level`` (:attr:`PassLevel.scale`) against the grid."""
        if measured > 0.0:
            if shape in self.times and not self.fresh(shape, now):
                del self.times[shape]  # measured again: its old passes are another minute's
            self.times.setdefault(shape, deque(maxlen=SHAPE_WINDOW)).append(measured)
            self.seen[shape] = now
            self.levels[shape] = level
            self.known.clear()

    def _median(self, shape: tuple[int, int], grid: Callable[[int], float]) -> float:
        """The shape's median time; from fewer than :data:`SHAPE_TRUSTED` passes, at most
        ``grid`` (one slow pass must not keep the policy off a shape it then never
        measures again)."""
        times = self.times[shape]
        median = statistics.median(times)
        return median if len(times) >= SHAPE_TRUSTED else min(median, grid(shape[1]))

    def fresh(self, shape: tuple[int, int], now: int) -> bool:
        return shape in self.seen and now - self.seen[shape] <= SHAPE_FRESH

    def trusted(self, shape: tuple[int, int], now: int | None = None) -> bool:
        """Measured at least :data:`SHAPE_TRUSTED` times (and fresh at ``now``, if given)."""
        return (shape in self.times and len(self.times[shape]) >= SHAPE_TRUSTED
                and (now is None or self.fresh(shape, now)))

    def _factor(self, shape: tuple[int, int], now: int, grid: Callable[[int], float],
                level: float) -> float:
        """A fresh shape's factor on ``grid`` (at the current ``level``); an aged one's on
        the grid at the level of its last pass."""
        factor = self._median(shape, grid) / grid(shape[1])
        return factor if self.fresh(shape, now) else factor * level / self.levels[shape]

    def _factors(self, rows: int, now: int, grid: Callable[[int], float], level: float,
                 ) -> tuple[list[int], list[float]]:
        """The ks of ``rows`` rows measured recently or trusted, and their factors on
        ``grid``, each taken toward the weighted line through all of them."""
        ks = sorted(x for r, x in self.seen
                    if r == rows and (self.fresh((r, x), now) or self.trusted((r, x))))
        if not ks:
            return [], []
        own = [self._factor((rows, x), now, grid, level) for x in ks]
        weights = [float(len(self.times[(rows, x)])) for x in ks]
        line = _weighted_line(ks, own, weights)
        return ks, [(w * f + SHAPE_PRIOR * line(x)) / (w + SHAPE_PRIOR)
                    for x, f, w in zip(ks, own, weights, strict=True)]

    def seconds(self, rows: int, k: int, now: int, grid: Callable[[int], float],
                level: float = 1.0) -> float | None:
        """The predicted time of a pass of ``rows`` rows × k tokens (None: no shape of those
        rows fresh or trusted); ``grid(k)``: the grid's time at those rows, at the current
        ``level``."""
        if now != self.known_at:
            self.known, self.known_at = {}, now
        if rows not in self.known:
            self.known[rows] = self._factors(rows, now, grid, level)
        ks, factors = self.known[rows]
        if not ks:
            return None
        return grid(k) * interpolate(ks, factors, min(max(k, ks[0]), ks[-1]))


def _weighted_line(xs: Sequence[int], ys: Sequence[float],
                   weights: Sequence[float]) -> Callable[[int], float]:
    """The weighted least-squares line through (xs, ys), kept within the ys' range; a
    constant (their weighted mean) where the xs span fewer than :data:`SLOPE_SPAN`."""
    total = sum(weights)
    mx = sum(w * x for w, x in zip(weights, xs, strict=True)) / total
    my = sum(w * y for w, y in zip(weights, ys, strict=True)) / total
    spread = sum(w * (x - mx) ** 2 for w, x in zip(weights, xs, strict=True))
    slope = 0.0 if xs[-1] - xs[0] < SLOPE_SPAN else sum(
        w * (x - mx) * (y - my) for w, x, y in zip(weights, xs, ys, strict=True)) / spread
    low, high = min(ys), max(ys)
    return lambda x: min(max(my + slope * (x - mx), low), high)


class IterationOverhead:
    """Seconds an iteration of R cache rows with longest draft g costs beyond the passes the
    start-up grid predicts, learned from the engine's own iterations. Two parts:

    * **drift of the passes**: each iteration's measured draft passes and target pass set
      the current :class:`PassLevel` of each kind against the grid and their
      :class:`ShapeLevels` (draft passes per rows × γ, target passes per rows × tokens), so
      the passes are predicted at their recently measured times where those exist and at
      the level times the grid elsewhere (beyond the grid: negative when they now run
      faster);
    * **the engine's own time** (what an iteration takes beyond the re-levelled passes: its
      work outside them, and what the grid's shape misses, such as a multi-token pass
      dearer relative to a one-token pass than at start-up): c₀ + c₁·R + d·(c₂·R + c₃·R·g)
      with d = 1 where the iteration drafts (g > 0: each drafting row's q is gathered and
      verified, work a plain row does not do), fitted by least squares with exponential
      forgetting (:data:`OVERHEAD_DECAY` per iteration) and a ridge toward 0
      (:data:`OVERHEAD_RIDGE`), never predicted negative. Without the drafting term, a batch
      that mostly drafts would price its plain iterations with the drafting rows' work.
      Beyond the longest draft recorded recently (:data:`REACH_WEIGHT`), the fit is taken
      at that draft: where every drafting iteration drafted one token, c₂ and c₃ are not
      told apart, and extrapolated (a pair that had learned its acceptance from one- and
      two-token blocks) they priced a draft of 6 at 31 ms of own time against 2.7 ms at 1,
      which kept longer drafts from being tried and learned. A longer draft is thus priced
      by its passes until it is tried.

    An iteration recorded without its pass times (``passes`` None) leaves the levels alone.
    Iterations of one row are recorded too: a request alone weighs the same time (R = 1)
    in its own choice."""

    FEATURES = 4

    def __init__(self, clock: Callable[[], float] = time.perf_counter,
                 explore_every: int = EXPLORE_EVERY) -> None:
        self.clock = clock
        self.explore_every = explore_every  # iterations between explorations
        self.explored = 0  # the iteration of the last exploration
        self.shapes = ShapeLevels()  # target passes per (rows, tokens)
        self.draft_shapes = ShapeLevels()  # an iteration's draft passes per (rows, γ)
        self.gram = torch.zeros((self.FEATURES, self.FEATURES), dtype=torch.float64)  # [4, 4]
        self.moment = torch.zeros(self.FEATURES, dtype=torch.float64)  # [4]
        self.coef = [0.0] * self.FEATURES  # c₀..c₃ as floats (predict runs per row and g)
        self.drafts: dict[int, float] = {}  # g > 0 -> decayed count of iterations drafting g
        self.reach = 0  # the longest g whose own time is predicted from the fit at g
        self.iterations = 0
        self.draft_level, self.target_level = PassLevel(capped=True), PassLevel()
        self.grid: BatchCosts | None = None  # the grid the levels are relative to
        self.drafters: set[Hashable] = set()  # cost keys of the auto rows' drafters recorded
        self._predicted: dict[tuple[int, int, bool], float] = {}  # predict's, until a record

    @staticmethod
    def _features(rows: int, g: int) -> torch.Tensor:
        return torch.tensor([1.0, rows, rows * (g > 0), rows * g], dtype=torch.float64)  # [4]

    def own_time(self, rows: int, g: int) -> float:
        """The engine's own seconds per iteration beyond its passes (never negative)."""
        c0, c1, c2, c3 = self.coef
        drafting = c2 * rows + c3 * rows * min(g, max(self.reach, 1)) if g > 0 else 0.0
        return max(c0 + c1 * rows + drafting, 0.0)

    def drift(self, rows: int, g: int) -> float:
        """Seconds the passes of an iteration now take beyond the grid's prediction."""
        grid = self.grid
        if grid is None:
            return 0.0
        planned, steps = grid.target_pass(rows, g + 1), grid.draft_passes(rows, g)
        level, draft_level = self.target_level.scale, self.draft_level.scale
        target = self.shapes.seconds(rows, g + 1, self.iterations,
                                     lambda k: grid.target_pass(rows, k) * level, level)
        drafted = None if g == 0 else self.draft_shapes.seconds(
            rows, g, self.iterations, lambda k: grid.draft_passes(rows, k) * draft_level,
            draft_level)
        return ((steps * draft_level if drafted is None else drafted) - steps
                + (planned * level if target is None else target) - planned)

    def predict(self, rows: int, g: int, optimistic: bool = False) -> float:
        """Seconds beyond the grid's passes: the passes' drift plus the engine's own time
        (``optimistic``: the drift only where it makes the passes faster than the grid).
        Kept per shape until the next iteration is recorded: the batch policy prices the
        same shapes for many candidate choices."""
        key = (rows, g, optimistic)
        if key not in self._predicted:
            drift = self.drift(rows, g)
            self._predicted[key] = ((min(drift, 0.0) if optimistic else drift)
                                    + self.own_time(rows, g))
        return self._predicted[key]

    def drafting_stale(self, rows: int | None = None) -> bool:
        """No drafting iteration (of ``rows`` cache rows, if given) has been recorded for
        :data:`SHAPE_FRESH` iterations (or ever)."""
        return not any((rows is None or r == rows)
                       and self.draft_shapes.fresh((r, g), self.iterations)
                       for r, g in self.draft_shapes.seen)

    def measured(self, rows: int, g: int) -> bool:
        """Whether the passes of an iteration of ``rows`` cache rows and longest draft g
        (target pass and draft passes) are predicted from measurements of their shapes
        (:meth:`ShapeLevels.trusted`, recent or not) rather than from the grid."""
        return self.shapes.trusted((rows, g + 1)) and (
            g == 0 or self.draft_shapes.trusted((rows, g)))

    def observe(self, rows: int, g: int, seconds: float) -> None:
        """One iteration of ``rows`` cache rows and longest draft g took ``seconds`` of the
        engine's own time."""
        self._predicted.clear()  # the fit changes here, and record's levels before it
        f = self._features(rows, g)
        self.gram = self.gram * OVERHEAD_DECAY + torch.outer(f, f)
        self.moment = self.moment * OVERHEAD_DECAY + f * seconds
        ridge = torch.eye(self.FEATURES, dtype=torch.float64) * OVERHEAD_RIDGE
        self.coef = torch.linalg.solve(self.gram + ridge, self.moment).tolist()
        self.drafts = {x: w * OVERHEAD_DECAY for x, w in self.drafts.items()}
        if g > 0:
            self.drafts[g] = self.drafts.get(g, 0.0) + 1.0
        self.reach, carried = 0, 0.0
        for x in sorted(self.drafts, reverse=True):  # weight of the drafts of x or longer
            carried += self.drafts[x]
            if carried >= REACH_WEIGHT:
                self.reach = x
                break
        self.iterations += 1

    def grid_for(self, rows: Sequence[Row], gammas: Sequence[int]) -> BatchCosts | None:
        """The grid an iteration over ``rows`` with these γs is recorded against (None: it
        is not recorded, so its passes need no timing): its ``auto`` rows' grid, if they
        share one, or, for rows whose γ is fixed, the grid of earlier ``auto`` rows (their
        passes cost what the same shapes cost any row) where every row that drafts uses a
        drafter that steps like those ``auto`` rows' (:attr:`Drafter.cost_key`: the same
        draft weights; an n-gram table, say, is not what the grid timed)."""
        policies = [r.request.gamma for r in rows]
        if not any(isinstance(p, AutoGamma) for p in policies) \
                and not _drafters(rows, gammas) <= self.drafters:
            return None
        return shared_costs(policies, self.grid)

    def record(self, rows: Sequence[Row], gammas: Sequence[int], seconds: float,
               passes: tuple[float, float] | None = None) -> None:
        """An engine iteration over ``rows`` with these γs took ``seconds`` (choice to
        acceptance), of which ``passes`` = (draft passes, target pass) when timed: recorded
        against :meth:`grid_for` (if any)."""
        self.drafters |= _drafters(rows, gammas, auto_only=True)
        costs = self.grid_for(rows, gammas)
        if costs is None:
            return
        self.grid = costs
        covered = cache_rows([r.num_drafts for r in rows], gammas)
        g = max(gammas, default=0)
        if passes is not None:
            drafting, scoring = passes
            if g > 0:
                if self.drafting_stale():  # drafting again after a while: the level is now's
                    self.draft_level.ratios.clear()
                self.draft_level.observe(drafting, costs.draft_passes(covered, g))
                self.draft_shapes.observe((covered, g), drafting, self.iterations,
                                          self.draft_level.scale)
            self.target_level.observe(scoring, costs.target_pass(covered, g + 1))
            self.shapes.observe((covered, g + 1), scoring, self.iterations,
                                self.target_level.scale)
        self.observe(covered, g,
                     seconds - costs.iteration(covered, g) - self.drift(covered, g))


def _drafters(rows: Sequence[Row], gammas: Sequence[int],
              auto_only: bool = False) -> set[Hashable]:
    """Cost keys (:attr:`Drafter.cost_key`) of the drafters of the rows that draft (γ > 0),
    of ``auto`` rows only if ``auto_only``."""
    return {_cost_key(getattr(r.request, "drafter", None))
            for r, gamma in zip(rows, gammas, strict=True)
            if gamma > 0 and (not auto_only or isinstance(r.request.gamma, AutoGamma))}


def _cost_key(drafter: Drafter | None) -> Hashable:
    return None if drafter is None else drafter.cost_key


def cache_rows(forks: Sequence[int], gammas: Sequence[int]) -> int:
    """Cache rows an iteration's target pass covers: M for a row drafting M blocks, else 1."""
    return sum(m if gamma > 0 else 1 for m, gamma in zip(forks, gammas, strict=True))


def shared_costs(policies: Sequence[GammaPolicy],
                 default: BatchCosts | None = None) -> BatchCosts | None:
    """The batch grid every ``auto`` row shares (None: several, or none and no ``default``:
    the grid of rows none of which is ``auto``)."""
    grids = {id(p.costs.batch): p.costs.batch for p in policies if isinstance(p, AutoGamma)}
    if len(grids) > 1:
        return None
    return next(iter(grids.values())) if grids else default
