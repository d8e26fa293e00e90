"""Paired ratios of the benchmark scripts: geometric mean with a 95% interval over prompts.

Prompts are the unit. A script passes its ratios labelled by prompt, either as
``(prompt_id, ratio)`` pairs or as a mapping prompt → ratios. The ratios of one prompt
(rounds or repeats of the same prompt) are averaged in logs first, d_i = mean log r_ij;
the result is exp(mean_i d_i) with the Student-t interval exp(mean ± t·sd/√n) over the n
prompts (:func:`verispec.bench.metrics.prompt_ratio_ci`, the bench's own). Three rounds of
the same four prompts are four units, not twelve: repeating a prompt narrows the noise of
its d_i but adds no prompt. With a single prompt there is no interval.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

RatiosByPrompt = Mapping[str, Sequence[float]] | Iterable[tuple[str, float]]


def by_prompt(ratios: RatiosByPrompt) -> dict[str, list[float]]:
    """prompt → its ratios, from a mapping or from (prompt_id, ratio) pairs."""
    if isinstance(ratios, Mapping):
        return {str(k): [float(v) for v in vs] for k, vs in ratios.items()}
    out: dict[str, list[float]] = defaultdict(list)
    for prompt, ratio in ratios:
        out[str(prompt)].append(float(ratio))
    return dict(out)


def geomean_interval(ratios: RatiosByPrompt) -> tuple[float, float | None, float | None]:
    """(geometric mean, lower, upper) of paired ratios with prompts as the unit; the bounds
    are None with fewer than two prompts."""
    # Imported here: engine_guard.py's workers import this module under an older verispec.
    from verispec.bench.metrics import prompt_ratio_ci

    logs = {k: [math.log(r) for r in v] for k, v in by_prompt(ratios).items() if v}
    if not logs:
        raise ValueError("no ratios")
    mean, ci = prompt_ratio_ci(logs)
    assert mean is not None
    return (mean, ci[0], ci[1]) if ci else (mean, None, None)


def format_interval(ratios: RatiosByPrompt) -> str:
    """``1.234 [1.100, 1.380] over 4 prompts``, or without the interval for one prompt."""
    units = by_prompt(ratios)
    mean, lo, hi = geomean_interval(units)
    n = len(units)
    if lo is None or hi is None:
        return f"{mean:.3f} (one prompt: no interval)"
    return f"{mean:.3f} [{lo:.3f}, {hi:.3f}] over {n} prompts"
