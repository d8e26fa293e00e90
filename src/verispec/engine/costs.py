"""What a batched iteration costs: target passes over R rows of k tokens, draft passes over R
rows, measured once per machine and model pair and kept on disk.

The engine's target pass pads every row to the longest block (both model back ends run an
[R, k_max] pass), so an iteration whose rows draft γ_1..γ_R tokens costs one target pass of
shape (R, max γ + 1) and max γ draft passes over the R rows. The first of those passes
feeds what the draft has not seen of the previous iteration: its bonus token and, where the
whole block was accepted, the block's last draft token too (a draft feeds the last token it
drafts only for a method that asks for q after the block). Every row is padded to the
longest, so in a batch that pass is an [R, 2] pass almost always (a row alone: whenever its
block was accepted whole), and where a draft pass over many rows is compute bound it costs
well above a one-token step: the first pass is timed apart (:attr:`BatchCosts.draft_first`)
and priced at two tokens per row.
:class:`BatchCosts` holds the pass times on a grid of (R, k) and interpolates between grid
points; its R = 1 slice is the single-row :class:`PassCosts`. :class:`Acceptance` turns a row's
acceptance rates into the tokens an iteration is expected to emit, the model both γ
policies use.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch

from verispec.models.base import CausalLM

__all__ = [
    "BATCH_MAX_K",
    "BATCH_ROWS",
    "PROBE_SIZES",
    "Acceptance",
    "BatchCosts",
    "Overhead",
    "PassCosts",
    "cost_key",
    "grid_shapes",
    "interpolate",
    "load_or_measure",
    "machine_signature",
    "measure_costs",
    "record_agrees",
    "timing_file",
]

#: γ -> seconds an iteration that drafts γ tokens costs beyond its model passes (the
#: engine's own work, learned from its iterations).
Overhead = Callable[[int], float]

#: Target pass sizes timed at start-up; costs in between are interpolated linearly.
PROBE_SIZES = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class Acceptance:
    """How often a row's drafted tokens are accepted: ``first``, the first position of a
    block, and ``rest``, each later position given that the positions before it were
    accepted.

    The first position is drafted right after the target's own token (the bonus token, or
    the token that replaced a rejected draft, which the draft did not propose), and there
    the draft agrees with the target less often: on the embedded pair (block verification,
    γ 6 and 8, 20 HumanEval prompts) 0.84 against 0.94 for the later positions at T = 0,
    0.81 against 0.89 at T = 1. One rate for all positions (the papers' i.i.d. model, the
    case first = rest) estimated from short blocks is mostly the first position's, and so
    prices every longer block too low; with the two apart, short blocks do not pull the
    estimate of the later positions down.
    """

    first: float
    rest: float

    @classmethod
    def iid(cls, alpha: float) -> Acceptance:
        """The same rate α at every position."""
        return cls(alpha, alpha)

    def tokens(self, gamma: int) -> float:
        """E[tokens per iteration] drafting γ: the target's own token plus the accepted
        drafts, 1 + first · (1 + rest + … + rest^{γ−1}) (for first = rest = α the i.i.d.
        model's (1 − α^{γ+1}) / (1 − α))."""
        if gamma <= 0:
            return 1.0
        if self.rest >= 1.0:
            return 1.0 + self.first * gamma
        return 1.0 + self.first * (1.0 - self.rest ** gamma) / (1.0 - self.rest)


def _draft_passes(first: float, step: float, gamma: int) -> float:
    """Seconds of an iteration's γ draft passes: its first pass, then γ − 1 one-token steps."""
    return first + (gamma - 1) * step if gamma > 0 else 0.0


@dataclass(frozen=True)
class PassCosts:
    """Measured seconds of one target pass over k tokens, of one draft step and of the
    draft's reading of a prompt.

    Attributes:
        target: k -> seconds, for the k timed (others are interpolated).
        draft: seconds of one draft forward pass of one token.
        draft_prefill: seconds per token of the draft's prefill of a prompt (0: free).
        draft_first: seconds of an iteration's first draft pass, which feeds two tokens (the
            module docstring; None: as ``draft``).
        batch: the pair's costs over batches of rows, of which these are the one-row slice
            (None: measured for one row only; batch choices then fall back to per-row ones).
    """

    target: dict[int, float]
    draft: float
    draft_prefill: float = 0.0
    batch: BatchCosts | None = field(default=None, compare=False, repr=False)
    draft_first: float | None = None

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

    def draft_passes(self, gamma: int) -> float:
        """Seconds of the γ draft passes of an iteration (the first over two tokens)."""
        first = self.draft if self.draft_first is None else self.draft_first
        return _draft_passes(first, self.draft, gamma)

    def iteration(self, gamma: int, overhead: Overhead | None = None) -> float:
        """Seconds of one iteration that drafts γ tokens: γ draft passes and a target pass
        over γ + 1 tokens, plus ``overhead(γ)`` (the engine's own time beyond the passes)
        when given."""
        extra = 0.0 if overhead is None else overhead(gamma)
        return self.draft_passes(gamma) + self.target_pass(gamma + 1) + extra

    def saving(self, acceptance: Acceptance, gamma: int,
               overhead: Overhead | None = None) -> float:
        """Seconds per token that drafting γ tokens at ``acceptance`` saves over plain
        decoding (negative: it costs); iterations cost their passes plus ``overhead``."""
        return (self.iteration(0, overhead)
                - self.iteration(gamma, overhead) / acceptance.tokens(gamma))

    def describe(self) -> str:
        return (f"target {self.target_pass(1) * 1e3:.1f} ms per token, draft "
                f"{self.draft * 1e3:.1f} ms (c = {self.c:.2f}), draft prefill "
                f"{self.draft_prefill * 1e3:.2f} ms per prompt token; V(k) = "
                + ", ".join(f"V({k}) {self.v(k):.2f}" for k in sorted(self.target) if k > 1)
                + ("" if self.batch is None or len(self.batch.rows) < 2
                   else "; " + self.batch.describe()))


#: Row counts timed at start-up; batches in between (or beyond) are interpolated
#: (extrapolated along the last slope).
BATCH_ROWS = (1, 2, 4, 8)
#: Tokens per row timed for batches of more than one row (longer blocks are extrapolated:
#: a batched pass is compute bound well before that, so its time grows linearly).
BATCH_MAX_K = 8
#: Version of the on-disk record; a record of another version is measured again.
RECORD_VERSION = 2


def interpolate(xs: Sequence[int], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear y(x) through sorted points xs, extended along the end slopes."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _envelope(ys: Sequence[float]) -> list[float]:
    """Each time replaced by the least of it and the times after it: the non-decreasing
    sequence that keeps every time that no later one undercuts."""
    out = list(ys)
    for i in range(len(out) - 2, -1, -1):
        out[i] = min(out[i], out[i + 1])
    return out


@dataclass(frozen=True)
class BatchCosts:
    """Measured seconds of batched passes.

    Attributes:
        target: (R, k) -> seconds of one target pass appending k tokens to each of R rows
            (every timed R with at least two timed k, or one k = 1).
        draft: R -> seconds of one draft step (one token into each of R rows).
        draft_prefill: seconds per token of the draft's prefill of a prompt (0: free).
        draft_first: R -> seconds of an iteration's first draft pass (two tokens into each
            of R rows: the module docstring); R not timed: interpolated, none timed: as
            ``draft``.
    """

    target: dict[tuple[int, int], float]
    draft: dict[int, float]
    draft_prefill: float = 0.0
    draft_first: dict[int, float] = field(default_factory=dict)

    @cached_property
    def rows(self) -> tuple[int, ...]:
        return tuple(sorted({r for r, _ in self.target}))

    def ks(self, rows: int = 1) -> tuple[int, ...]:
        """The k timed with ``rows`` rows."""
        return self._curves.get(rows, ((), []))[0]

    @cached_property
    def _curves(self) -> dict[int, tuple[tuple[int, ...], list[float]]]:
        """rows -> (the k timed with those rows, their seconds), built once (the batch
        policy asks for many passes every iteration)."""
        out = {}
        for r in self.rows:
            ks = tuple(sorted(k for rr, k in self.target if rr == r))
            out[r] = ks, [self.target[(r, k)] for k in ks]
        return out

    @cached_property
    def _draft_curve(self) -> tuple[list[int], list[float]]:
        rs = sorted(self.draft)
        return rs, [self.draft[r] for r in rs]

    @cached_property
    def _first_curve(self) -> tuple[list[int], list[float]]:
        rs = sorted(self.draft_first)
        return rs, [self.draft_first[r] for r in rs]

    def target_pass(self, rows: int, k: int) -> float:
        """Seconds of a target pass over ``rows`` rows of k tokens: linear in k at every
        timed row count, then linear in the rows between them (bilinear on a full grid)."""
        at_rows = [interpolate(ks, ts, k) for ks, ts in self._curves.values()]
        return interpolate(self.rows, at_rows, rows)

    def draft_step(self, rows: int) -> float:
        """Seconds of one draft step over ``rows`` rows (linear between timed counts)."""
        return interpolate(*self._draft_curve, rows)

    def draft_first_pass(self, rows: int) -> float:
        """Seconds of an iteration's first draft pass over ``rows`` rows (two tokens each)."""
        if not self.draft_first:
            return self.draft_step(rows)
        return interpolate(*self._first_curve, rows)

    def draft_passes(self, rows: int, gamma: int) -> float:
        """Seconds of the γ draft passes of an iteration over ``rows`` rows."""
        if gamma <= 0:  # nothing to interpolate
            return 0.0
        return _draft_passes(self.draft_first_pass(rows), self.draft_step(rows), gamma)

    def iteration(self, rows: int, gamma: int) -> float:
        """Seconds of one iteration of ``rows`` rows whose longest draft is γ tokens: γ
        draft passes over the rows and one padded target pass over γ + 1 tokens per row
        (kept per shape: the grid never changes, and the batch policy prices the same
        shapes for many candidate choices every iteration)."""
        known = self._iterations
        if (rows, gamma) not in known:
            known[(rows, gamma)] = (self.draft_passes(rows, gamma)
                                    + self.target_pass(rows, gamma + 1))
        return known[(rows, gamma)]

    @cached_property
    def _iterations(self) -> dict[tuple[int, int], float]:
        return {}

    def single(self) -> PassCosts:
        """The R = 1 slice as single-row costs, this grid attached for batch choices."""
        return PassCosts(target={k: self.target[(1, k)] for k in self.ks(1)},
                         draft=self.draft_step(1), draft_prefill=self.draft_prefill,
                         batch=self, draft_first=self.draft_first_pass(1))

    def describe(self) -> str:
        """How a pass grows with rows: T(R, 1) / T(1, 1) and, at the most rows timed, V(k)."""
        top = self.rows[-1]
        return ("batched target pass T(R, 1) / T(1, 1): "
                + ", ".join(f"R={r} {self.target_pass(r, 1) / self.target_pass(1, 1):.2f}"
                            for r in self.rows if r > 1)
                + f"; at R={top}: " + ", ".join(
                    f"V({k}) {self.target_pass(top, k) / self.target_pass(top, 1):.2f}"
                    for k in self.ks(top) if k > 1)
                + f"; draft pass of 2 tokens / 1 at R={top}: "
                f"{self.draft_first_pass(top) / self.draft_step(top):.2f}")

    def monotone(self) -> BatchCosts:
        """The grid made non-decreasing in tokens at every row count, then in rows at every
        k, and the draft passes in rows, a first pass never below a step: a pass over more
        work never costs more than one over less (it could be padded to it), so a time that
        a larger pass undercuts is noise — a busy moment during the start-up timing, which
        only ever slows a timing down — and the larger pass's time replaces it (the lower
        envelope). Otherwise the noise would make the policy shun that shape: a draft step
        timed at 14.9 ms for one row and 9.9 ms for two made γ auto draft short blocks."""
        target = dict(self.target)
        lines = [[(r, k) for k in self.ks(r)] for r in self.rows]
        lines += [[(r, k) for r in self.rows if (r, k) in target]
                  for k in sorted({k for _, k in target})]
        for line in lines:
            target.update(zip(line, _envelope([target[x] for x in line]), strict=True))
        rs = sorted(self.draft)
        draft = dict(zip(rs, _envelope([self.draft[r] for r in rs]), strict=True))
        steps = sorted(draft), [draft[r] for r in sorted(draft)]
        rs = sorted(self.draft_first)
        first = {r: max(t, interpolate(*steps, r)) for r, t in
                 zip(rs, _envelope([self.draft_first[r] for r in rs]), strict=True)}
        return BatchCosts(target=target, draft=draft, draft_prefill=self.draft_prefill,
                          draft_first=first)

    def to_json(self) -> dict[str, object]:
        return {"target": [[r, k, t] for (r, k), t in sorted(self.target.items())],
                "draft": [[r, t] for r, t in sorted(self.draft.items())],
                "draft_first": [[r, t] for r, t in sorted(self.draft_first.items())],
                "draft_prefill": self.draft_prefill}

    @classmethod
    def from_json(cls, data: dict) -> BatchCosts:  # type: ignore[type-arg]
        return cls(target={(int(r), int(k)): float(t) for r, k, t in data["target"]},
                   draft={int(r): float(t) for r, t in data["draft"]},
                   draft_prefill=float(data["draft_prefill"]),
                   draft_first={int(r): float(t) for r, t in data.get("draft_first", [])})


def machine_signature(device: torch.device, int8: bool = False) -> str:
    """What pass times depend on besides the models: torch, the CPU (model, cores, threads
    in use), the accelerator, and for int8 weights the kernel signature and what makes
    the activation codes."""
    from verispec.telemetry.machine import cpu_info

    parts = [torch.__version__, platform.machine(), cpu_info().model_name,
             str(os.cpu_count()), str(torch.get_num_threads()), device.type]
    if device.type == "cuda":
        parts.append(torch.cuda.get_device_name(device))
    if int8:
        try:
            from verispec.models.native import codes_kernel
            from verispec.models.native.kernels import signature

            parts += [signature(), codes_kernel.status()]
        except (ImportError, RuntimeError, OSError):
            parts.append("no-kernel-signature")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def grid_shapes(rows: Sequence[int], ks: Sequence[int]) -> list[tuple[int, int]]:
    """The (R, k) timed: every k for one row, k up to :data:`BATCH_MAX_K` for more."""
    return [(r, k) for r in sorted(set(rows)) for k in sorted(set(ks))
            if r == 1 or k <= BATCH_MAX_K]


def pair_key(target: CausalLM, draft: CausalLM, *parts: str) -> str:
    """A record name for the pair and the machine it is measured on: a hash of the model
    names, precisions and variants, the machine signature and ``parts`` (what else the
    record depends on)."""
    int8 = "int8" in (target.precision, draft.precision)
    text = "|".join([target.name, target.precision, target.variant, draft.name,
                     draft.precision, draft.variant,
                     machine_signature(target.device, int8), *parts])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def cost_key(target: CausalLM, draft: CausalLM, *, context: int,
             shapes: Sequence[tuple[int, int]]) -> str:
    """The name of a pair's record: model names, precisions and variants, the machine and
    the grid."""
    return pair_key(target, draft, f"context={context}",
                    "shapes=" + ",".join(f"{r}x{k}" for r, k in shapes), f"v{RECORD_VERSION}")


def timing_file(key: str) -> Path:
    from verispec.models.fetch import cache_dir

    return cache_dir() / "timing" / f"pass-costs-{key}.json"


def load_or_measure(target: CausalLM, draft: CausalLM, *, context: int, reps: int,
                    rows: Sequence[int], ks: Sequence[int], refresh: bool = False) -> BatchCosts:
    """The pair's :class:`BatchCosts`: read from its record when one exists for this key
    (models, precisions, machine, grid), else timed (target passes over :func:`grid_shapes`
    and draft passes of one and two tokens over ``rows``, in turns, and the draft's prefill
    of ``context`` tokens)
    and recorded. ``refresh`` times again whatever is recorded. Only models loaded from a
    directory (a ``source``) are recorded: a model built in memory (toy tables, test
    doubles) is not identified by its name, so it is timed afresh in every process. The
    record keeps the times as measured; the grid returned is their :meth:`BatchCosts.monotone`
    fit."""
    shapes = grid_shapes(rows, ks)
    file = timing_file(cost_key(target, draft, context=context, shapes=shapes))
    recorded = all(getattr(m, "source", None) for m in (target, draft))
    if recorded and not refresh:
        try:
            kept = BatchCosts.from_json(json.loads(file.read_text())["costs"])
        except (OSError, ValueError, KeyError, TypeError):
            kept = None
        if kept is not None:
            fit = kept.monotone()  # the grid as γ auto prices with it
            if record_agrees(fit, target, draft, context=context):
                return fit
    from verispec.models.fetch import save_record
    from verispec.models.timing import grid_costs, prefill_cost

    steps = sorted(set(rows))
    draft_shapes = [(r, k) for r in steps for k in (1, 2)]  # one-token steps, first passes
    timed, step = grid_costs([(target, shapes), (draft, draft_shapes)], context=context,
                             reps=reps)
    costs = BatchCosts(target=timed, draft={r: step[(r, 1)] for r in steps},
                       draft_prefill=prefill_cost(draft, context, reps=reps) / context,
                       draft_first={r: step[(r, 2)] for r in steps})
    record = {"target": target.name, "draft": draft.name, "context": context,
              "costs": costs.to_json()}
    if not recorded:
        return costs.monotone()
    save_record(file, record)
    return costs.monotone()  # the record keeps the times as measured


#: A recorded grid is kept while its c (the one-row target step over the draft step)
#: lies within this factor, either way, of a fresh timing of those two passes.
RECORD_CHECK_TOLERANCE = 1.5
#: Repetitions of that fresh timing (interleaved, medians).
RECORD_CHECK_REPS = 3


def record_agrees(kept: BatchCosts, target: CausalLM, draft: CausalLM, *, context: int,
                  reps: int = RECORD_CHECK_REPS) -> bool:
    """Whether a recorded grid (its :meth:`BatchCosts.monotone` fit, as γ auto prices with
    it) still prices drafting as the machine runs it now: a grid timed
    while something else loaded the CPU (a package install, another benchmark) can price
    the draft several times dearer than it is, and γ auto, which then never drafts, would
    never measure the draft to correct it. The one-row steps of both models and the draft's
    first pass of an iteration (two tokens) are timed afresh (:data:`RECORD_CHECK_REPS`
    interleaved repetitions after each reads ``context`` tokens; 0.7–1.0 s for the embedded
    pair on a 2-core AMD EPYC Zen 5); the record is kept when its c and its first pass over
    a step each agree with the fresh ones within :data:`RECORD_CHECK_TOLERANCE`. Both are
    ratios of passes timed in turns, so a machine that is slower or faster as a whole keeps
    its record; a first pass recorded dear prices every drafting iteration a fixed cost that
    long blocks amortise (a record on an AMD EPYC Zen 4 held 22.9 ms for the embedded
    draft's first pass against an 11.0 ms step, where both now take 12.7 and 11.7 ms, and
    γ auto drafted longer blocks than paid). The fit is what is compared: a one-row step
    timed dear beside a cheaper two-row one (as the grid's timing of the draft there does,
    17.1 against 12.3 ms) is already replaced by the two-row time in it."""
    from verispec.models.timing import grid_costs

    if (1, 1) not in kept.target or 1 not in kept.draft or 1 not in kept.draft_first:
        return False
    now_target, now_draft = grid_costs([(target, [(1, 1)]), (draft, [(1, 1), (1, 2)])],
                                       context=context, reps=reps)
    pairs = [(now_target[(1, 1)] / now_draft[(1, 1)], kept.target[(1, 1)] / kept.draft[1]),
             (now_draft[(1, 2)] / now_draft[(1, 1)], kept.draft_first[1] / kept.draft[1])]
    return all(1 / RECORD_CHECK_TOLERANCE <= now / recorded <= RECORD_CHECK_TOLERANCE
               for now, recorded in pairs)


#: Repetitions of the start-up timing (interleaved, medians): enough that one slow phase
#: of a busy 2-core machine does not decide c or V(k).
TIMING_REPS = 5


def measure_costs(target: CausalLM, draft: CausalLM, *, context: int = 128,
                  reps: int = TIMING_REPS, rows: Sequence[int] | None = None,
                  refresh: bool = False) -> PassCosts:
    """Time target passes over R rows of k tokens (R in ``rows``, default
    :data:`BATCH_ROWS`; k in ``PROBE_SIZES``) and draft passes of one and two tokens
    over R rows after ``context`` tokens, in turns within each repetition
    (:func:`~verispec.models.timing.grid_costs`), and the draft's prefill of ``context``
    tokens (on spawned models: the callers' rows are untouched). The times are recorded
    under the cache directory, keyed by the models, their precisions and the machine, and
    read back by later calls (``refresh``: time again). Returns the one-row costs with the
    batch grid attached (:attr:`PassCosts.batch`). A context window shorter than twice
    ``context`` shortens the timed context to half the window."""
    windows = [m.max_length for m in (target, draft) if m.max_length is not None]
    if windows:
        context = max(1, min(context, min(windows) // 2))
    sizes = tuple(k for k in PROBE_SIZES if not windows or context + k <= min(windows))
    grid_rows = tuple(sorted({1, *(BATCH_ROWS if rows is None else rows)}))
    return load_or_measure(target, draft, context=context, reps=reps, rows=grid_rows,
                           ks=sizes, refresh=refresh).single()
