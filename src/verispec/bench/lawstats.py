"""Statistics of the two-sample law test (:mod:`verispec.bench.lawtest`): a homogeneity
statistic on first-k-token samples, its permutation null and its power.

* **Cells.** At one prompt, the n_a samples of a method and the n_b of the reference are
  k-token sequences. Every distinct sequence whose expected count on the smaller side,
  c · min(n_a, n_b) / (n_a + n_b) for a pooled count c, is at least ``MIN_EXPECTED`` is a
  cell; the rarer sequences are pooled into one cell (merged into the smallest kept cell
  when that pool is itself too small). The cells depend on the pooled sample only, so they
  are the same under every relabelling.
* **Statistic.** Pearson's chi-square of the 2 × m contingency table of each prompt,
  X² = Σ_cells (a − E_a)² · n² / (c · n_a · n_b), summed over the prompts.
* **Null.** ``permutations`` relabellings drawn from a seeded generator: within each prompt
  the method/reference labels are shuffled (a uniformly random set of n_a of the n samples
  becomes the method's). p = (1 + #{T_perm ≥ T}) / (1 + permutations): under the null (the
  two samplers have one law at every prompt) P(p ≤ α) ≤ α exactly, no asymptotics.
* **Power.** :func:`power_threshold` simulates the whole test at a given size between a law
  and mixtures (1 − t)·law + t·r of it with a direction r, and finds by bisection the
  smallest t flagged ``POWER_LEVEL`` of the time; the threshold is reported as the mean over
  the prompts of the total-variation distance t·TV(law, r) of the first-k-token laws.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "ALPHA",
    "MIN_EXPECTED",
    "PERMUTATIONS",
    "POWER_LEVEL",
    "POWER_REPS",
    "PowerCurve",
    "SimLaw",
    "TestResult",
    "cells_of",
    "directions",
    "empirical_law",
    "permutation_test",
    "power_threshold",
]

ALPHA = 0.01  # a comparison is flagged when its permutation p-value is below this
MIN_EXPECTED = 5.0  # smallest expected count of a cell on the smaller side
PERMUTATIONS = 999  # relabellings of the null (p-values in steps of 1/1000)
POWER_LEVEL = 0.8  # the threshold TV is the one flagged this often
POWER_REPS = 200  # simulated checks per point of the power curve
BISECTION_STEPS = 7  # t is found to within 2⁻⁷ of its range
NOVEL = -1  # atom of a simulated law whose every draw is a sequence never seen before


@dataclass
class TestResult:
    """One permutation test over the prompts.

    Attributes:
        statistic: T = Σ_prompts X².
        pvalue: (1 + #{T_perm ≥ T}) / (1 + permutations).
        flagged: pvalue < alpha.
        per_prompt: X² of each prompt.
        cells: the number of cells of each prompt.
    """

    statistic: float
    pvalue: float
    flagged: bool
    per_prompt: list[float]
    cells: list[int]


def cells_of(ids: Sequence[Hashable], n_a: int, min_expected: float = MIN_EXPECTED) -> np.ndarray:
    """[n] int64 cell of each sample (the first ``n_a`` are the method's), cells numbered
    0..m−1 in order of first appearance of their sequence; rare sequences pooled."""
    n = len(ids)
    n_b = n - n_a
    if n_a < 1 or n_b < 1:
        raise ValueError(f"each side needs at least one sample, got {n_a} and {n_b}")
    share = min(n_a, n_b) / n
    counts = Counter(ids)
    keep: dict[Hashable, int] = {}
    for s in ids:
        if s not in keep and counts[s] * share >= min_expected:
            keep[s] = len(keep)
    rare = len(keep)
    cells = np.fromiter((keep.get(s, rare) for s in ids), dtype=np.int64, count=n)
    pooled = int((cells == rare).sum())
    if pooled and keep and pooled * share < min_expected:
        kept = np.bincount(cells, minlength=rare + 1)[:rare]
        cells[cells == rare] = int(np.argmin(kept))  # the first of the smallest kept cells
    return cells


def _chi2(counts_a: np.ndarray, totals: np.ndarray, n_a: int, n: int) -> np.ndarray:
    """Pearson's X² of 2 × m tables: counts_a [..., m] on side a, totals [m] -> [...]."""
    expected = totals * (n_a / n)  # [m]
    return ((counts_a - expected) ** 2 / (totals * (n_a * (n - n_a) / n**2))).sum(-1)


def _masks(n_a: int, n: int, permutations: int, rng: np.random.Generator) -> np.ndarray:
    """[permutations, n] float32: 1 on the samples a relabelling gives to side a."""
    base = np.zeros((permutations, n), dtype=np.float32)
    base[:, :n_a] = 1.0
    return rng.permuted(base, axis=1)


def _prompt_stats(cells: np.ndarray, n_a: int, masks: np.ndarray) -> tuple[float, np.ndarray]:
    """(observed X², [permutations] X² of the relabellings) of one prompt."""
    n = cells.shape[0]
    onehot = np.zeros((n, int(cells.max()) + 1), dtype=np.float32)  # [n, m]
    onehot[np.arange(n), cells] = 1.0
    totals = onehot.sum(0, dtype=np.float64)  # [m]
    observed = _chi2(onehot[:n_a].sum(0, dtype=np.float64), totals, n_a, n)
    permuted = _chi2((masks @ onehot).astype(np.float64), totals, n_a, n)  # [permutations]
    return float(observed), permuted


def permutation_test(samples: Sequence[tuple[Sequence[Hashable], Sequence[Hashable]]], *,
                     permutations: int = PERMUTATIONS, seed: int = 0,
                     alpha: float = ALPHA, min_expected: float = MIN_EXPECTED) -> TestResult:
    """The two-sample test over prompts: ``samples[j] = (method's, reference's)`` sequences
    at prompt j (any hashable values: token tuples)."""
    rng = np.random.default_rng(seed)
    total, null = 0.0, np.zeros(permutations)
    per_prompt, cells_n = [], []
    for a, b in samples:
        ids = list(a) + list(b)
        cells = cells_of(ids, len(a), min_expected)
        masks = _masks(len(a), len(ids), permutations, rng)
        observed, permuted = _prompt_stats(cells, len(a), masks)
        total += observed
        null += permuted
        per_prompt.append(observed)
        cells_n.append(int(cells.max()) + 1)
    exceed = int((null >= total * (1 - 1e-9)).sum())  # ties count against the method
    pvalue = (1 + exceed) / (1 + permutations)
    return TestResult(total, pvalue, pvalue < alpha, per_prompt, cells_n)


# --------------------------------------------------------------------------- power


@dataclass
class SimLaw:
    """A law over atoms, for simulation: ``atoms[i]`` (a sequence, or ``NOVEL``: a draw of it
    is a sequence never drawn before) has probability ``probs[i]``."""

    atoms: list[Hashable]
    probs: np.ndarray  # [m]


def empirical_law(samples: Sequence[Hashable]) -> SimLaw:
    """The empirical law of a sample with a Good–Turing share for unseen sequences: the
    sequences seen once carry the probability f₁/n of a new sequence (``NOVEL``)."""
    counts = Counter(samples)
    n = len(samples)
    novel = sum(1 for c in counts.values() if c == 1) / n
    atoms: list[Hashable] = list(counts)
    probs = np.array([counts[s] / n * (1 - novel) for s in atoms])
    if novel > 0:
        atoms.append(NOVEL)
        probs = np.append(probs, novel)
    return SimLaw(atoms, probs)


def directions(law: SimLaw, first_ratio: dict[int, float] | None = None) -> dict[str, np.ndarray]:
    """Perturbation directions r [m] over the atoms of ``law``.

    * ``confident``: all mass on the most likely sequence (a sampler too sure of itself);
    * ``diffuse``: all mass on new sequences (a sampler too spread out);
    * ``first-token``: the first token's marginal reweighted by ``first_ratio[x₁]``
      (e.g. q(x₁)/p(x₁), the draft's first-token law), the rest of each sequence kept.
    """
    out: dict[str, np.ndarray] = {}
    seen = [i for i, a in enumerate(law.atoms) if a != NOVEL]
    if seen:
        mode = max(seen, key=lambda i: law.probs[i])
        out["confident"] = np.eye(len(law.atoms))[mode]
    if NOVEL in law.atoms and len(law.atoms) > 1:
        out["diffuse"] = np.eye(len(law.atoms))[law.atoms.index(NOVEL)]
    if first_ratio is not None:
        w = np.array([1.0 if a == NOVEL or not a else first_ratio.get(a[0], 0.0)  # type: ignore[index]
                      for a in law.atoms])
        r = law.probs * w
        if r.sum() > 0:
            out["first-token"] = r / r.sum()
    return out


def _draw(law: np.ndarray, atoms: list[Hashable], u: np.ndarray, fresh: int) -> np.ndarray:
    """[R, n] int64 atom ids drawn by inverting the CDF at uniforms u [R, n]; draws of the
    NOVEL atom get ids fresh, fresh+1, ... (each a sequence of its own)."""
    cdf = np.cumsum(law)
    idx = np.minimum(np.searchsorted(cdf / cdf[-1], u, side="right"), len(law) - 1)
    if NOVEL in atoms:
        novel = idx == atoms.index(NOVEL)
        idx = np.where(novel, fresh + np.arange(idx.size).reshape(idx.shape), idx)
    return idx


@dataclass
class PowerCurve:
    """Power of the test against one direction.

    Attributes:
        direction: its name.
        tv_per_t: mean over prompts of TV(law, r): the check's TV at mixture weight t is t
            times it.
        null_rate: flag rate at t = 0 (the test's size, at most alpha up to noise).
        t: smallest mixture weight flagged ``POWER_LEVEL`` of the time (None: not even t = 1).
        tv: t · tv_per_t, the threshold TV in this direction (None: not reached).
        points: (t, flag rate) pairs evaluated.
    """

    direction: str
    tv_per_t: float
    null_rate: float
    t: float | None
    tv: float | None
    points: list[tuple[float, float]]


class _Simulator:
    """Flag rates of the whole test, common random numbers across mixture weights."""

    def __init__(self, laws: Sequence[SimLaw], n_a: int, n_b: int, reps: int,
                 permutations: int, alpha: float, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.laws, self.n_a, self.alpha = laws, n_a, alpha
        self.u_a = [rng.random((reps, n_a)) for _ in laws]  # [R, n_a] per prompt
        self.u_b = [rng.random((reps, n_b)) for _ in laws]  # [R, n_b] per prompt
        self.masks = [_masks(n_a, n_a + n_b, permutations, rng) for _ in laws]
        self.reps = reps

    def flag_rate(self, alts: Sequence[np.ndarray]) -> float:
        """Share of simulated tests flagged, method ~ alts[j], reference ~ laws[j]."""
        total = np.zeros(self.reps)
        null = np.zeros((self.reps, self.masks[0].shape[0]))
        for j, law in enumerate(self.laws):
            a = _draw(alts[j], law.atoms, self.u_a[j], fresh=1 << 40)
            b = _draw(law.probs, law.atoms, self.u_b[j], fresh=1 << 50)
            ids = np.concatenate([a, b], axis=1)  # [R, n]
            for r in range(self.reps):
                cells = cells_of(ids[r].tolist(), self.n_a)
                observed, permuted = _prompt_stats(cells, self.n_a, self.masks[j])
                total[r] += observed
                null[r] += permuted
        exceed = (null >= total[:, None] * (1 - 1e-9)).sum(1)
        pvalues = (1 + exceed) / (1 + null.shape[1])
        return float((pvalues < self.alpha).mean())


def power_threshold(laws: Sequence[SimLaw], dirs: Sequence[dict[str, np.ndarray]], n_a: int,
                    n_b: int, *, reps: int = POWER_REPS, permutations: int = PERMUTATIONS,
                    alpha: float = ALPHA, level: float = POWER_LEVEL,
                    seed: int = 0) -> list[PowerCurve]:
    """Power curves of the test at size (n_a, n_b) per prompt, one per direction present at
    every prompt: ``laws[j]`` is prompt j's reference law, ``dirs[j][name]`` its direction."""
    sim = _Simulator(laws, n_a, n_b, reps, permutations, alpha, seed)
    base = [law.probs for law in laws]
    null_rate = sim.flag_rate(base)
    names = [d for d in dirs[0] if all(d in x for x in dirs)] if dirs else []
    curves = []
    for name in names:
        tv_per_t = float(np.mean([0.5 * np.abs(law.probs - d[name]).sum()
                                  for law, d in zip(laws, dirs, strict=True)]))

        def rate(t: float, name: str = name) -> float:
            return sim.flag_rate([(1 - t) * law.probs + t * d[name]
                                  for law, d in zip(laws, dirs, strict=True)])

        points = [(1.0, rate(1.0))]
        found: float | None = None
        if points[0][1] >= level:
            lo, hi = 0.0, 1.0
            for _ in range(BISECTION_STEPS):
                mid = (lo + hi) / 2
                points.append((mid, rate(mid)))
                lo, hi = (lo, mid) if points[-1][1] >= level else (mid, hi)
            found = hi
        curves.append(PowerCurve(name, tv_per_t, null_rate, found,
                                 None if found is None else found * tv_per_t, sorted(points)))
    return curves
