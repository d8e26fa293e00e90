"""Draft lengths chosen for a whole batch (``--gamma auto`` with more than one active row).

One-row costs say whether speculation pays for a request alone; in a batch the target pass
it lengthens is already R rows wide, and on a machine whose pass time grows with R × k the
extra tokens cost what plain decoding of other rows would have cost. Each iteration the
batch policy chooses every ``auto`` row's γ_b to maximise the batch's expected tokens per
second under the measured :class:`~verispec.engine.costs.BatchCosts`:

    rate(γ_1..γ_R) = Σ_b E_b[tokens](γ_b) / (t_draft(R, g) + t_target(R, g + 1)),
    g = max_b γ_b

with E_b[tokens] from each row's own estimated :class:`~verispec.engine.costs.Acceptance`
(its :class:`~verispec.engine.gamma.AutoGamma`: its acceptances and the pair's prior, the
first position of a block apart from the later ones) and t_draft(R, g) the g draft passes
of an iteration, the first over two tokens per row
(:meth:`~verispec.engine.costs.BatchCosts.draft_passes`).

**Search.** The engine pads every row's block to the longest, so the cost depends on the
γs only through g = max_b γ_b (and the rows a multi-draft request forks while it drafts);
at a given g every row's E[tokens] grows with γ_b, so the best allocation with maximum g
gives each row min(max(g, floor_b), cap_b). Trying every g from 0 to the largest cap (at
most ``max_gamma`` + 1 evaluations) therefore finds the exact optimum of the model for
single-draft rows, of which the shortest g within
:data:`~verispec.engine.gamma.FLAT_TOLERANCE` of it is taken. Rows with a fixed γ keep it
(their blocks count in g and their tokens, at the prior acceptance, in the numerator).

**Reading.** A row whose draft has not read its context yet drafts (and so reads) only
where the batch choice itself gains enough by drafting it to repay the reading
(:func:`reading_choice`): the batch's rate with and without that row drafting is compared,
and the reading — during which every row of the batch waits — must be repaid over the
row's payback tokens (:attr:`AutoGamma.payback_tokens`). A row's reading is thus never
weighed against a batch in which every row drafts at its own acceptance when the rows
beside it would keep the batch plain. A reading, once paid, is sunk, while decoding
without it costs nothing irreversible: so a side whose pass shapes the engine has never
measured is priced :data:`READING_MARGIN` against the reading (the drafting
side dearer, the other cheaper). Where plain and drafting batches are predicted within
that margin of each other from the grid alone, the batch decodes plainly, and measures the
plain shape as it does.
A batch whose rows all wait for their first token (admitted at once) decodes it plainly, so
that no time to first token includes a reading; a row admitted into a batch that is already
decoding is a reader from its first iteration: held at γ = 0 it would be padded to the
batch's block for one token, and with another row out of room or not yet read, keep the
batch plain.

The choice depends only on the past (the rows' observed acceptances and the costs timed at
start-up), never on the current draft, so every lossless method stays lossless. A batch of
one row, or one whose ``auto`` rows have no measured batch grid (or different ones), is
given the per-request choice of :meth:`AutoGamma.choose` (a row alone with the engine's
learned overhead below, so its choice too counts the engine's own time per iteration).

**The engine's own time and the passes' drift.** Outside the model passes an iteration also
gathers p and q, verifies, samples and feeds the drafters, and that work grows with the rows
and the drafted positions (every position handles a vocabulary-wide distribution). The
start-up grid times passes only, and on a shared machine the passes themselves drift from
their start-up times (a busy minute at start-up, a guest that changes speed). So each engine
times its own iterations (:class:`IterationOverhead`): the draft passes and the target pass
of every iteration set the current level of each kind of pass against the grid
(:class:`PassLevel`: the grid gives the shape, recent passes the level), and the time left
over beyond the re-levelled passes is fitted in rows and drafted positions (the engine's
own work, and what the grid's shape misses). The rate above divides by
the re-levelled passes plus that time. Both are estimated from earlier iterations only, so
the choice still depends only on the past.

**Shapes measured, and explored.** A level cannot correct a grid whose shape is wrong (a
start-up timing on a busy minute that made 5-token passes look dear against 1-token ones):
target passes are therefore predicted per shape (:class:`ShapeLevels`: rows × tokens, a
factor on the grid per shape measured at those rows, each taken toward a line through
all of them, interpolated in tokens; one not measured recently moved with the level since
its last pass) and an iteration's draft passes per rows × γ, where measured, and a batch
that keeps
drafting while plain decoding, on a shape not measured recently, is predicted within
:data:`EXPLORE_MARGIN` of it (at the smaller of its grid time and its re-levelled time)
decodes one iteration plainly every :data:`EXPLORE_EVERY` iterations (:func:`explore`), so
that the comparison rests on measured passes on both sides. (Not the other way: before
drafting, the drafts of a plain batch would read what was decoded since they last drafted.)
Exploring too is decided from past iterations only.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace

import torch

from verispec.drafters.base import Drafter
from verispec.engine.costs import Acceptance, BatchCosts, interpolate
from verispec.engine.gamma import (EXPLORE_MARGIN, PRIOR_ALPHA, AutoGamma, GammaPolicy,
                                   flat_best)
from verispec.engine.request import Row

__all__ = ["EXPLORE_EVERY", "EXPLORE_MARGIN", "REACH_WEIGHT", "READING_MARGIN", "SHAPE_FRESH",
           "SHAPE_PRIOR", "SHAPE_TRUSTED", "SHAPE_WINDOW", "SLOPE_SPAN", "IterationOverhead",
           "PassLevel", "RowDemand", "ShapeLevels", "batch_choice", "choose_gammas", "explore",
           "reading_choice"]


@dataclass(frozen=True)
class RowDemand:
    """What the batch policy knows of one row.

    Attributes:
        acceptance: the row's estimated acceptance.
        floor: the shortest draft it may be given.
        cap: the longest (its ``max_gamma``, the room left, 0 while it may not draft).
        forks: cache rows it occupies while drafting (M for M drafts, else 1).
        fixed: its γ is not the policy's to choose (it drafts ``cap`` tokens).
    """

    acceptance: Acceptance
    floor: int
    cap: int
    forks: int = 1
    fixed: bool = False

    def gamma(self, g: int) -> int:
        """The row's γ when the batch's longest draft is g."""
        if self.fixed:
            return self.cap
        return min(max(g, self.floor), self.cap)


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
#: Iterations between two explorations (at most 1 / EXPLORE_EVERY of the iterations decode
#: plainly where that is predicted up to :data:`EXPLORE_MARGIN` slower).
EXPLORE_EVERY = 32
#: A reading is a cost sunk once paid: it is paid only where it pays with every iteration of a
#: pass shape never measured :data:`SHAPE_TRUSTED` times predicted this fraction dearer on the
#: drafting side and cheaper on the side without the reading (two measured shapes are
#: compared as measured).
#: Before a batch has drafted, its drafting rate rests on the grid, the pair's prior and
#: an own time learned from other shapes: the first prediction for 8 rows drafting ran
#: about 8% above what their iterations then delivered, and rows of one length that finish
#: at different iterations leave the batch's last iterations with fewer rows (a cost plain
#: decoding does not have and the rate does not show): a margin of 10% still paid readings
#: that the drafting never repaid.
READING_MARGIN = 0.2


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
    :data:`READING_MARGIN` dearer as never measured: four new rows whose drafting was
    predicted 21% ahead of plain decoding stayed plain."""

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
        (``optimistic``: the drift only where it makes the passes faster than the grid)."""
        drift = self.drift(rows, g)
        return (min(drift, 0.0) if optimistic else drift) + self.own_time(rows, g)

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
        return _shared_costs(policies, self.grid)

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
        cache_rows = _cache_rows([r.num_drafts for r in rows], gammas)
        g = max(gammas, default=0)
        if passes is not None:
            drafting, scoring = passes
            if g > 0:
                if self.drafting_stale():  # drafting again after a while: the level is now's
                    self.draft_level.ratios.clear()
                self.draft_level.observe(drafting, costs.draft_passes(cache_rows, g))
                self.draft_shapes.observe((cache_rows, g), drafting, self.iterations,
                                          self.draft_level.scale)
            self.target_level.observe(scoring, costs.target_pass(cache_rows, g + 1))
            self.shapes.observe((cache_rows, g + 1), scoring, self.iterations,
                                self.target_level.scale)
        self.observe(cache_rows, g,
                     seconds - costs.iteration(cache_rows, g) - self.drift(cache_rows, g))


def _drafters(rows: Sequence[Row], gammas: Sequence[int],
              auto_only: bool = False) -> set[Hashable]:
    """Cost keys (:attr:`Drafter.cost_key`) of the drafters of the rows that draft (γ > 0),
    of ``auto`` rows only if ``auto_only``."""
    return {_cost_key(getattr(r.request, "drafter", None))
            for r, gamma in zip(rows, gammas, strict=True)
            if gamma > 0 and (not auto_only or isinstance(r.request.gamma, AutoGamma))}


def _cost_key(drafter: Drafter | None) -> Hashable:
    return None if drafter is None else drafter.cost_key


def _cache_rows(forks: Sequence[int], gammas: Sequence[int]) -> int:
    """Cache rows an iteration's target pass covers: M for a row drafting M blocks, else 1."""
    return sum(m if gamma > 0 else 1 for m, gamma in zip(forks, gammas, strict=True))


def batch_rate(demands: Sequence[RowDemand], costs: BatchCosts, g: int,
               overhead: IterationOverhead | None = None, optimistic: bool = False) -> float:
    """Expected tokens per second of the batch when its longest draft is g (``optimistic``:
    see :meth:`IterationOverhead.predict`)."""
    gammas = [d.gamma(g) for d in demands]
    rows = _cache_rows([d.forks for d in demands], gammas)
    tokens = sum(d.acceptance.tokens(gamma) for d, gamma in zip(demands, gammas, strict=True))
    g = max(gammas, default=0)
    extra = 0.0 if overhead is None else overhead.predict(rows, g, optimistic)
    return tokens / (costs.iteration(rows, g) + extra)


def batch_choice(demands: Sequence[RowDemand], costs: BatchCosts,
                 overhead: IterationOverhead | None = None) -> list[int]:
    """Every row's γ: the shortest longest draft g in [0, max cap] whose :func:`batch_rate`
    is within :data:`~verispec.engine.gamma.FLAT_TOLERANCE` of the highest, each row at
    :meth:`RowDemand.gamma` of it."""
    top = max((d.cap for d in demands), default=0)
    best = flat_best([batch_rate(demands, costs, g, overhead) for g in range(top + 1)])
    return [d.gamma(best) for d in demands]


def _shared_costs(policies: Sequence[GammaPolicy],
                  default: BatchCosts | None = None) -> BatchCosts | None:
    """The batch grid every ``auto`` row shares (None: several, or none and no ``default``:
    the grid of rows none of which is ``auto``)."""
    grids = {id(p.costs.batch): p.costs.batch for p in policies if isinstance(p, AutoGamma)}
    if len(grids) > 1:
        return None
    return next(iter(grids.values())) if grids else default


def _alone(row: Row, overhead: IterationOverhead) -> Callable[[int], float]:
    """γ -> the learned overhead of an iteration of this row alone (M cache rows while a
    multi-draft row drafts M blocks)."""
    return lambda g: overhead.predict(_cache_rows([row.num_drafts], [g]), g)


def choose_gammas(rows: Sequence[Row], caps: Sequence[int],
                  overhead: IterationOverhead | None = None) -> list[int]:
    """γ for every active row of an iteration; ``caps[b]`` is the longest draft row b has
    room for; ``overhead``: the engine's learned time beyond the passes (None: none).
    One row, or no shared batch grid: each policy's own :meth:`choose` (one row with a grid:
    given the overhead at R = 1, and told to explore where no drafting iteration of one row
    has been recorded lately: :meth:`IterationOverhead.drafting_stale`)."""
    policies: list[GammaPolicy] = [r.request.gamma for r in rows]  # type: ignore[misc]
    costs = _shared_costs(policies)
    if costs is None or len(rows) == 1:
        if costs is None or overhead is None:
            return [min(p.choose(), cap) for p, cap in zip(policies, caps, strict=True)]
        stale = overhead.drafting_stale(_cache_rows([rows[0].num_drafts], [1]))
        return [min(policies[0].choose(_alone(rows[0], overhead), stale), caps[0])]
    # a batch admitted at once decodes its first tokens plainly (none includes a reading)
    first = all(isinstance(p, AutoGamma) and p.reading_deferred for p in policies)
    demands, readings = [], {}
    for b, (row, policy, cap) in enumerate(zip(rows, policies, caps, strict=True)):
        if isinstance(policy, AutoGamma):
            floor, top = policy.batch_bounds()
            top = 0 if first else max(min(top, cap), 0)
            demands.append(RowDemand(policy.acceptance, min(floor, top), top, row.num_drafts))
            if not policy.drafting and top > 0:
                readings[b] = (policy.reading_seconds, policy.payback_tokens)
        else:
            demands.append(RowDemand(Acceptance.iid(PRIOR_ALPHA), 0,
                                     max(min(policy.choose(), cap), 0), row.num_drafts,
                                     fixed=True))
    choice, demands = reading_choice(demands, readings, costs, overhead)
    return choice if overhead is None else explore(choice, demands, costs, overhead)


def reading_choice(demands: Sequence[RowDemand], readings: dict[int, tuple[float, float]],
                   costs: BatchCosts, overhead: IterationOverhead | None = None,
                   ) -> tuple[list[int], list[RowDemand]]:
    """The batch's choice when the drafts of some rows have not read their contexts yet
    (``readings``: row -> (seconds of its reading, tokens over which it must pay back)), and
    the demands it was chosen from (rows left unread at cap 0).

    The choice without those rows drafting is the base (rate r₀). With the readers drafting
    too the batch runs at r₁ and saves (1/r₀ − 1/r₁) · R seconds per token of each of its R
    rows; the readings, during which the whole batch waits, pay when their sum is at
    most that saving over the shortest payback of the readers. Where they do not, the
    reader whose reading is dearest per payback token is dropped and the rest weighed
    again. A batch that would not draft the readers even so does not read for them. With
    ``overhead``, a side whose pass shapes it has never measured is taken
    :data:`READING_MARGIN` against the reading (:func:`_bounded_seconds`); without, the
    grid is taken as measured."""
    plain = [replace(d, floor=0, cap=0) if b in readings else d for b, d in enumerate(demands)]
    base = batch_choice(plain, costs, overhead)
    base_seconds = _bounded_seconds(plain, costs, max(base, default=0), overhead, -1)  # 1 / r₀
    readers = dict(readings)
    while readers:
        trial = [d if b in readers or b not in readings else plain[b]
                 for b, d in enumerate(demands)]
        choice = batch_choice(trial, costs, overhead)
        g = max(choice, default=0)
        if g == 0:
            break
        saved = len(demands) * (base_seconds - _bounded_seconds(trial, costs, g, overhead, 1))
        reading = sum(seconds for seconds, _ in readers.values())
        if reading <= saved * min(tokens for _, tokens in readers.values()):
            return choice, trial
        del readers[max(readers, key=lambda b: readers[b][0] / max(readers[b][1], 1e-9))]
    return base, plain


def _bounded_seconds(demands: Sequence[RowDemand], costs: BatchCosts, g: int,
                     overhead: IterationOverhead | None, side: int) -> float:
    """Seconds per expected token of the batch at longest draft g (1 / :func:`batch_rate`),
    ``side`` · :data:`READING_MARGIN` more (side 1) or less (side −1) where ``overhead``
    has not measured the iteration's pass shapes (:meth:`IterationOverhead.measured`)."""
    seconds = 1.0 / batch_rate(demands, costs, g, overhead)
    if overhead is None or overhead.measured(*_shape(demands, [d.gamma(g) for d in demands])):
        return seconds
    return seconds * (1.0 + side * READING_MARGIN)


def _shape(demands: Sequence[RowDemand], gammas: Sequence[int]) -> tuple[int, int]:
    """(cache rows, longest draft g) of an iteration with these γs: its target pass is
    cache rows × (g + 1) tokens."""
    return _cache_rows([d.forks for d in demands], gammas), max(gammas, default=0)


def explore(choice: list[int], demands: Sequence[RowDemand], costs: BatchCosts,
            overhead: IterationOverhead) -> list[int]:
    """``choice``, or, once every ``overhead.explore_every`` iterations when the choice
    drafts, plain decoding (every row at its floor) if plain decoding, on a target pass
    shape not measured for :data:`SHAPE_FRESH` iterations, is predicted within
    :data:`EXPLORE_MARGIN` of the choice's rate at the smaller of its grid time and its
    re-levelled time (a shape never measured is priced by passes of other shapes, whose
    level may be what sets them apart). A plain batch is not explored the other way: its
    drafts would first read every token decoded since they last drafted (or the whole
    context), a cost the iteration's rate does not show."""
    now, g = overhead.iterations, max(choice, default=0)
    if now - overhead.explored < overhead.explore_every or g == 0:
        return choice
    gammas = [d.gamma(0) for d in demands]
    rows, plain_g = _shape(demands, gammas)
    if ((rows, plain_g) == _shape(demands, choice)
            or overhead.shapes.fresh((rows, plain_g + 1), now)
            or batch_rate(demands, costs, 0, overhead, optimistic=True)
            < (1.0 - EXPLORE_MARGIN) * batch_rate(demands, costs, g, overhead)):
        return choice
    overhead.explored = now
    return gammas
