"""Paired ratios of the benchmark scripts: geometric mean with a bootstrap 95% interval."""

from __future__ import annotations

import math
import random
import statistics

BOOTSTRAP = 2000


def geomean_interval(ratios: list[float]) -> tuple[float, float, float]:
    """Geometric mean of paired ratios and a percentile-bootstrap 95% interval."""
    logs = [math.log(r) for r in ratios]
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(BOOTSTRAP))
    lo, hi = means[int(0.025 * BOOTSTRAP)], means[int(0.975 * BOOTSTRAP) - 1]
    return math.exp(statistics.fmean(logs)), math.exp(lo), math.exp(hi)
