"""Busy/idle timeline of the draft model, the target model and the coordinator.

An interval is ``(lane, start_s, end_s, label)``: ``lane`` is ``"draft"``, ``"target"`` or
``"verify"`` (the coordinator's verification), times are seconds on the system-wide
monotonic clock (comparable across processes on Linux), ``label`` the phase kind or
``"prefill"`` / ``"probe"``. A model *waits* whenever it is not busy; the wait fraction of a
lane is 1 - busy / span over the decoding span (prefill and probes excluded) — the paper's
"mutual waiting" (Figure 2a) made measurable.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["LANES", "Interval", "Timeline", "draw_timeline", "now", "wait_fractions"]

LANES = ("draft", "target", "verify")
Interval = tuple[str, float, float, str]

_COLOURS = {
    "pre-verify": "#1f77b4", "post-verify": "#d62728", "draft-only": "#9ecae1",
    "verify-only": "#ff9896", "prefill": "#7f7f7f", "probe": "#bcbd22",
}


def now() -> float:
    """Seconds on the system-wide monotonic clock (CLOCK_MONOTONIC on Linux)."""
    return time.monotonic()


@dataclass
class Timeline:
    """Intervals recorded during one request; ``start``/``end`` bound the decoding span."""

    intervals: list[Interval] = field(default_factory=list)
    start: float = 0.0
    end: float = 0.0

    def add(self, lane: str, start: float, end: float, label: str) -> None:
        self.intervals.append((lane, float(start), float(end), label))

    def relative(self) -> list[Interval]:
        """Intervals with times relative to the decoding start."""
        return [(lane, s - self.start, e - self.start, label) for lane, s, e, label in self.intervals]

    def wait_fractions(self) -> dict[str, float]:
        return wait_fractions(self.intervals, self.start, self.end)


def wait_fractions(intervals: Sequence[Interval], start: float, end: float) -> dict[str, float]:
    """Per lane, the fraction of [start, end] during which it was not busy."""
    span = end - start
    out: dict[str, float] = {}
    for lane in LANES:
        busy = sum(max(0.0, min(e, end) - max(s, start)) for ln, s, e, _ in intervals if ln == lane)
        out[lane] = 1.0 - busy / span if span > 0 else 0.0
    return out


def draw_timeline(intervals: Sequence[Interval], path: str, *, title: str = "",
                  start: float = 0.0, end: float | None = None) -> None:
    """Write the timeline as a PNG: one row per lane, one bar per busy interval.

    Args:
        intervals: as in :class:`Timeline` (any time origin; ``start`` is subtracted).
        path: output file (PNG).
        title: figure title (e.g. the wait fractions).
        start, end: the decoding span to mark; end defaults to the last interval's end.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if end is None:
        end = max((e for _, _, e, _ in intervals), default=start)
    fig, ax = plt.subplots(figsize=(12, 3.2))
    used: dict[str, str] = {}
    for row, lane in enumerate(LANES):
        for ln, s, e, label in intervals:
            if ln != lane:
                continue
            colour = _COLOURS.get(label, "#2ca02c")
            used[label] = colour
            ax.broken_barh([((s - start) * 1e3, max((e - s) * 1e3, 1e-3))], (row - 0.4, 0.8),
                           facecolors=colour)
    ax.axvline(0.0, color="black", linewidth=0.6)
    ax.axvline((end - start) * 1e3, color="black", linewidth=0.6)
    ax.set_yticks(range(len(LANES)), list(LANES))
    ax.set_ylim(-0.6, len(LANES) - 0.4)
    ax.set_xlabel("time since decoding started (ms); white = waiting")
    ax.legend(handles=[Patch(color=c, label=label) for label, c in used.items()],
              loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=max(1, len(used)), fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
