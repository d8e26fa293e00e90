"""Statistics of the two-sample law test (:mod:`verispec.bench.lawtest`): a homogeneity
statistic on first-k-token samples, its permutation null and its power.

* **Nodes.** At one prompt, the n_a samples of a method and the n_b of the reference are
  token sequences of length ≤ k. The pooled sample's prefixes form a tree: the root (the
  empty prefix) holds every sample, a prefix x₁..x_d holds the samples that begin with it
  and go on past it. At each node the table is that of the *next* token: a method that
  draws the first token wrongly shows at the root with the whole sample; one that errs
  later shows at the nodes below, each with the samples that reached it.
* **Cells.** At a node, every next token whose expected count on the smaller side,
  c · min(n_a, n_b) / (n_a + n_b) for its pooled count c, is at least ``MIN_EXPECTED`` is a
  cell; the rarer tokens are pooled into one cell (merged into the smallest kept cell when
  that pool is itself too small). Nodes and cells depend on the pooled sample only, so they
  are the same under every relabelling.
* **Statistic.** Pearson's chi-square of each node's 2 × m table (side × next token),
  X² = Σ_cells (a − t·A/N)² · N² / (t · A · (N − A)) for a cell of pooled count t, A of
  the node's N samples on side a, summed per depth over the nodes and the prompts: S_d.
  Each S_d is ranked within its own permutation null (p_d = #{S_d,perm ≥ S_d} / L), and
  the statistic is T = min_d p_d: the first token's table alone (depth 0) keeps its full
  power when the deviation is there, and a deviation further on is not drowned by the
  degrees of freedom of the other depths. (With k = 1: the first tokens' chi-square.)
* **Null.** ``permutations`` = L relabellings drawn from a seeded generator: within each
  prompt the method/reference labels are shuffled (a uniformly random set of n_a of the n
  samples becomes the method's), and T is computed for each of them in the same way. p =
  (1 + #{T_perm ≤ T}) / (1 + L): under the null (the two samplers have one law at every
  prompt) the observed labelling is exchangeable with the relabellings, so P(p ≤ α) ≤ α
  exactly, no asymptotics.
* **Power.** :func:`power_threshold` simulates the whole test at a given size between a law
  and mixtures (1 − t)·law + t·r of it with a direction r, and finds by bisection the
  smallest t flagged ``POWER_LEVEL`` of the time; the threshold is reported as the mean over
  the prompts of the total-variation distance t·TV(law, r) of the first-k-token laws.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

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
    "Tree",
    "cells_of",
    "directions",
    "empirical_law",
    "permutation_test",
    "power_threshold",
    "tree_of",
]

ALPHA = 0.01  # a comparison is flagged when its permutation p-value is below this
MIN_EXPECTED = 5.0  # smallest expected count of a cell on the smaller side
PERMUTATIONS = 999  # relabellings of the null (p-values in steps of 1/1000)
POWER_LEVEL = 0.8  # the threshold TV is the one flagged this often
POWER_REPS = 100  # simulated checks per point of the power curve
BISECTION_STEPS = 7  # t is found to within 2⁻⁷ of its range
NOVEL = -1  # atom of a simulated law whose every draw is a sequence never seen before


@dataclass
class TestResult:
    """One permutation test over the prompts.

    Attributes:
        statistic: T = min over depths of the per-depth permutation p-value of Σ X².
        pvalue: (1 + #{T_perm ≤ T}) / (1 + permutations).
        flagged: pvalue < alpha.
        per_prompt: Σ_nodes X² of each prompt.
        cells: the number of cells of each prompt (over its nodes).
        nodes: the number of nodes of each prompt (prefixes with two cells or more).
    """

    statistic: float
    pvalue: float
    flagged: bool
    per_prompt: list[float]
    cells: list[int]
    nodes: list[int] = field(default_factory=list)


def _pool(ids: Sequence[Hashable], share: float, min_expected: float) -> np.ndarray:
    """[n] int64 cell of each id at one node, numbered 0..m−1 in order of first appearance
    (every cell non-empty), rare ids pooled; ``share``: min(n_a, n_b) / n of the prompt."""
    counts = Counter(ids)
    keep: dict[Hashable, int] = {}
    for s in ids:
        if s not in keep and counts[s] * share >= min_expected:
            keep[s] = len(keep)
    rare = len(keep)
    cells = np.fromiter((keep.get(s, rare) for s in ids), dtype=np.int64, count=len(ids))
    pooled = int((cells == rare).sum())
    if pooled and keep and pooled * share < min_expected:
        kept = np.bincount(cells, minlength=rare + 1)[:rare]
        cells[cells == rare] = int(np.argmin(kept))  # the first of the smallest kept cells
    return cells


def _share(n_a: int, n: int) -> float:
    if n_a < 1 or n - n_a < 1:
        raise ValueError(f"each side needs at least one sample, got {n_a} and {n - n_a}")
    return min(n_a, n - n_a) / n


def cells_of(ids: Sequence[Hashable], n_a: int, min_expected: float = MIN_EXPECTED) -> np.ndarray:
    """[n] int64 cell of each sample at one node (the first ``n_a`` are the method's)."""
    return _pool(ids, _share(n_a, len(ids)), min_expected)


@dataclass
class Tree:
    """One prompt's nodes and cells, built from the pooled sample (so the same under every
    relabelling), as incidence matrices over the n samples."""

    cells: np.ndarray  # [n, m] float32: 1 where a sample is counted in a cell
    nodes: np.ndarray  # [n, nodes] float32: 1 where a sample lies in a node
    node_of_cell: np.ndarray  # [m] int64
    depth_of_cell: np.ndarray  # [m] int64: length of its node's prefix
    totals: np.ndarray  # [m] float64: pooled count of each cell
    sizes: np.ndarray  # [nodes] float64: samples in each node


def tree_of(seqs: Sequence[Sequence[Hashable]], n_a: int,
            min_expected: float = MIN_EXPECTED) -> Tree:
    """The nodes (prefixes whose next tokens fill two cells or more) and cells of one
    prompt's samples, the first ``n_a`` the method's."""
    share = _share(n_a, len(seqs))
    groups: dict[tuple[Hashable, ...], list[int]] = {}
    for i, s in enumerate(seqs):
        for d in range(len(s)):
            groups.setdefault(tuple(s[:d]), []).append(i)
    kept: list[tuple[int, np.ndarray, np.ndarray]] = []  # (depth, members, cell of each)
    for prefix, members in groups.items():
        cells = _pool([seqs[i][len(prefix)] for i in members], share, min_expected)
        if cells.max() >= 1:  # one cell: X² = 0 under every labelling
            kept.append((len(prefix), np.asarray(members, dtype=np.int64), cells))
    widths = [int(c.max()) + 1 for _, _, c in kept]
    first = np.cumsum([0] + widths)  # first cell of each node
    cell_inc = np.zeros((len(seqs), int(first[-1])), dtype=np.float32)
    node_inc = np.zeros((len(seqs), len(kept)), dtype=np.float32)
    for j, (_, members, cells) in enumerate(kept):
        cell_inc[members, first[j] + cells] = 1.0
        node_inc[members, j] = 1.0
    node_of_cell = np.repeat(np.arange(len(kept)), widths).astype(np.int64)
    depth_of_cell = np.repeat([d for d, _, _ in kept], widths).astype(np.int64)
    return Tree(cell_inc, node_inc, node_of_cell, depth_of_cell,
                cell_inc.sum(0, dtype=np.float64), node_inc.sum(0, dtype=np.float64))


def _masks(n_a: int, n: int, permutations: int, rng: np.random.Generator) -> np.ndarray:
    """[permutations, n] float32: 1 on the samples a relabelling gives to side a."""
    base = np.zeros((permutations, n), dtype=np.float32)
    base[:, :n_a] = 1.0
    return rng.permuted(base, axis=1)


def _depth_chi2(tree: Tree, masks: np.ndarray, depths: int) -> np.ndarray:
    """Σ_nodes X² at each depth for each labelling: masks [L, n] (1 on side a) -> [L, depths]."""
    if len(tree.sizes) == 0:
        return np.zeros((masks.shape[0], depths))
    a = (masks @ tree.cells).astype(np.float64)  # [L, m]: side-a count of each cell
    side = (masks @ tree.nodes).astype(np.float64)[:, tree.node_of_cell]  # [L, m]: A of its node
    size = tree.sizes[tree.node_of_cell]  # [m]: N of its node
    t = tree.totals  # [m]
    den = t * side * (size - side)  # [L, m]; 0 where a labelling leaves a node one-sided
    num = (a - t * side / size) ** 2 * size**2
    terms = np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)  # [L, m]
    return terms @ np.eye(depths)[tree.depth_of_cell]  # [L, depths]


def _prompt_stats(tree: Tree, n_a: int, masks: np.ndarray,
                  depths: int) -> tuple[np.ndarray, np.ndarray]:
    """(observed [depths], relabellings [permutations, depths]) Σ_nodes X² of one prompt."""
    observed = np.zeros((1, masks.shape[1]), dtype=np.float32)
    observed[0, :n_a] = 1.0
    return _depth_chi2(tree, observed, depths)[0], _depth_chi2(tree, masks, depths)


def depth_pvalues(chi2: np.ndarray, null: np.ndarray) -> np.ndarray:
    """Each depth's permutation p-value #{null ≥ X²} / L (ties count against the method) of
    the values chi2 [..., depths] within the null [L, depths] -> [..., depths]."""
    out = np.empty(chi2.shape)
    for d in range(null.shape[1]):
        ordered = np.sort(null[:, d])  # [L]
        below = np.searchsorted(ordered, chi2[..., d] * (1 - 1e-9), side="left")
        out[..., d] = (len(ordered) - below) / len(ordered)
    return out


def min_p_test(chi2: np.ndarray, null: np.ndarray) -> tuple[float, float]:
    """(statistic, p-value) of the combined test: the statistic is the smallest per-depth
    p-value of the observed X² [depths]; its null, the same for each relabelling in null
    [L, depths]; p = (1 + #{null statistic ≤ statistic}) / (1 + L)."""
    stat = float(depth_pvalues(chi2, null).min())
    null_stats = depth_pvalues(null, null).min(-1)  # [L]
    return stat, (1 + int((null_stats <= stat * (1 + 1e-9)).sum())) / (1 + null.shape[0])


def permutation_test(samples: Sequence[tuple[Sequence[Sequence[Hashable]],
                                             Sequence[Sequence[Hashable]]]], *,
                     permutations: int = PERMUTATIONS, seed: int = 0,
                     alpha: float = ALPHA, min_expected: float = MIN_EXPECTED) -> TestResult:
    """The two-sample test over prompts: ``samples[j] = (method's, reference's)`` token
    sequences at prompt j (tuples of any hashable tokens)."""
    rng = np.random.default_rng(seed)
    depths = max((len(x) for a, b in samples for x in (*a, *b)), default=1)
    total, null = np.zeros(depths), np.zeros((permutations, depths))
    per_prompt, cells_n, nodes_n = [], [], []
    for a, b in samples:
        seqs = list(a) + list(b)
        tree = tree_of(seqs, len(a), min_expected)
        masks = _masks(len(a), len(seqs), permutations, rng)
        observed, permuted = _prompt_stats(tree, len(a), masks, depths)
        total += observed
        null += permuted
        per_prompt.append(float(observed.sum()))
        cells_n.append(len(tree.totals))
        nodes_n.append(len(tree.sizes))
    stat, pvalue = min_p_test(total, null)
    return TestResult(stat, pvalue, pvalue < alpha, per_prompt, cells_n, nodes_n)


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
        depths = max((len(x) for law in self.laws for x in law.atoms  # type: ignore[arg-type]
                      if x != NOVEL), default=1)
        total = np.zeros((self.reps, depths))
        null = np.zeros((self.reps, self.masks[0].shape[0], depths))
        for j, law in enumerate(self.laws):
            a = _draw(alts[j], law.atoms, self.u_a[j], fresh=1 << 40)
            b = _draw(law.probs, law.atoms, self.u_b[j], fresh=1 << 50)
            ids = np.concatenate([a, b], axis=1)  # [R, n]
            atoms = law.atoms  # a fresh id (a NOVEL draw) becomes a first token of its own
            for r in range(self.reps):
                seqs = [atoms[i] if i < len(atoms) else (-i,) for i in ids[r].tolist()]
                tree = tree_of(seqs, self.n_a)  # type: ignore[arg-type]
                observed, permuted = _prompt_stats(tree, self.n_a, self.masks[j], depths)
                total[r] += observed
                null[r] += permuted
        pvalues = np.array([min_p_test(total[r], null[r])[1] for r in range(self.reps)])
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
