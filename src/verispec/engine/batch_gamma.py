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

**The engine's own time and the passes' drift** are learned per engine
(:class:`~verispec.engine.overhead.IterationOverhead`): the rate above divides by the
passes re-levelled to their measured times plus the engine's own time per iteration, both
from earlier iterations only, so the choice still depends only on the past. A batch that
keeps drafting while plain decoding, on a shape not measured recently, is predicted within
:data:`~verispec.engine.gamma.EXPLORE_MARGIN` of it (at the smaller of its grid time and
its re-levelled time) decodes one iteration plainly every
:data:`~verispec.engine.overhead.EXPLORE_EVERY` iterations (:func:`explore`), so that the
comparison rests on measured passes on both sides. (Not the other way: before drafting,
the drafts of a plain batch would read what was decoded since they last drafted.)
Exploring too is decided from past iterations only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from verispec.engine.costs import Acceptance, BatchCosts
from verispec.engine.gamma import EXPLORE_MARGIN, PRIOR_ALPHA, AutoGamma, GammaPolicy, flat_best
from verispec.engine.overhead import IterationOverhead, cache_rows, shared_costs
from verispec.engine.request import Row

__all__ = ["READING_MARGIN", "RowDemand", "batch_choice", "batch_rate", "choose_gammas",
           "explore", "reading_choice"]


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


def batch_rate(demands: Sequence[RowDemand], costs: BatchCosts, g: int,
               overhead: IterationOverhead | None = None, optimistic: bool = False) -> float:
    """Expected tokens per second of the batch when its longest draft is g (``optimistic``:
    see :meth:`IterationOverhead.predict`)."""
    gammas = [d.gamma(g) for d in demands]
    rows = cache_rows([d.forks for d in demands], gammas)
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


def _alone(row: Row, overhead: IterationOverhead) -> Callable[[int], float]:
    """γ -> the learned overhead of an iteration of this row alone (M cache rows while a
    multi-draft row drafts M blocks)."""
    return lambda g: overhead.predict(cache_rows([row.num_drafts], [g]), g)


def choose_gammas(rows: Sequence[Row], caps: Sequence[int],
                  overhead: IterationOverhead | None = None) -> list[int]:
    """γ for every active row of an iteration; ``caps[b]`` is the longest draft row b has
    room for; ``overhead``: the engine's learned time beyond the passes (None: none).
    One row, or no shared batch grid: each policy's own :meth:`choose` (one row with a grid:
    given the overhead at R = 1, and told to explore where no drafting iteration of one row
    has been recorded lately: :meth:`IterationOverhead.drafting_stale`)."""
    policies: list[GammaPolicy] = [r.request.gamma for r in rows]  # type: ignore[misc]
    costs = shared_costs(policies)
    if costs is None or len(rows) == 1:
        if costs is None or overhead is None:
            return [min(p.choose(), cap) for p, cap in zip(policies, caps, strict=True)]
        stale = overhead.drafting_stale(cache_rows([rows[0].num_drafts], [1]))
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
    return cache_rows([d.forks for d in demands], gammas), max(gammas, default=0)


def explore(choice: list[int], demands: Sequence[RowDemand], costs: BatchCosts,
            overhead: IterationOverhead) -> list[int]:
    """``choice``, or, once every ``overhead.explore_every`` iterations when the choice
    drafts, plain decoding (every row at its floor) if plain decoding, on a target pass
    shape not measured for :data:`~verispec.engine.overhead.SHAPE_FRESH` iterations, is
    predicted within :data:`EXPLORE_MARGIN` of the choice's rate at the smaller of its grid
    time and its re-levelled time (a shape never measured is priced by passes of other
    shapes, whose level may be what sets them apart). A plain batch is not explored the other way: its
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
