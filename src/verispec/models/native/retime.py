"""Which library of a mixed int8 kernel runs each pass, re-timed from the passes themselves.

A mixed kernel (:class:`~verispec.models.native.kernels.Int8Kernel` with a ``wide``
library) computes every layer bit for bit alike on either library, so which one runs a pass
is a question of speed only. :func:`~verispec.models.native.linear.split_pass_sizes` answers
it once, at the first load; but a shared host's speed drifts, and not alike for both
libraries (on a KVM guest of a Xeon with AMX, oneDNN's AMX code ran 2.4× slower two hours
after the split was timed while fbgemm ran 1.4× slower, so the recorded split then ran
two-row passes 1.6× slower than fbgemm would). :class:`LibraryClock` keeps choosing from
the passes' own times:

* passes are grouped by size (token rows through the layers, and rows through the lm_head);
  each group keeps the last :data:`KEEP` times per token row of each library, and its
  pass runs on the library whose median is lower (the recorded split until both are known);
* now and then a pass runs on the other library to see whether it has become faster: the
  group's first look once its current library has :data:`KEEP` times, later ones once the
  group has spent :data:`EXPLORE_EVERY` times the other library's last price on its
  current library since the last look. A look costs at most the difference between the libraries'
  passes, so looking takes at most 1 / :data:`EXPLORE_EVERY` of the time of the group's
  passes (2%), and a change of the host is seen within a few of those budgets.

The choice never changes a result: both libraries compute exact integer products with one
shared float epilogue (the kernels' self-test refuses a mixed kernel whose libraries
differ), so a pass's logits are the same whichever library runs it.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import verispec.models.native.kernels as kernels
from verispec.models.native.linear import Int8Linear

__all__ = ["EXACT_ROWS", "EXPLORE_EVERY", "KEEP", "LibraryClock", "size_group"]

T = TypeVar("T")

#: pass sizes up to this many rows form a group each; larger ones a group per power of two
EXACT_ROWS = 16
#: a look at the other library once a group has spent this many times its price
EXPLORE_EVERY = 50
#: times per library and group kept (their median decides)
KEEP = 3


def size_group(rows: int) -> int:
    """The group of a pass of ``rows`` rows: itself up to :data:`EXACT_ROWS`, else the
    next power of two (times are compared per row, so a group's sizes are comparable)."""
    return rows if rows <= EXACT_ROWS else 1 << (rows - 1).bit_length()


@dataclass
class _Group:
    """The recent times of one pass-size group, per library, in seconds per token row."""

    current: str  # the library its passes run on
    times: dict[str, deque[float]] = field(default_factory=dict)
    spent: float = 0.0  # seconds on ``current`` since the last look at the other library

    def median(self, library: str) -> float | None:
        kept = self.times.get(library)
        return statistics.median(kept) if kept else None


class LibraryClock:
    """Chooses the library of each pass of one model's int8 ``layers`` (all of one mixed
    kernel, both libraries packed) from the passes' own times (module doc).

    ``clock``: the time source (``time.perf_counter``; tests pass their own).
    """

    def __init__(self, layers: list[Int8Linear],
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if not self.applies(layers):
            raise ValueError("re-timing needs a mixed int8 kernel with both libraries packed")
        kernel = layers[0].kernel
        self.layers = layers
        self.narrow, self.wide = kernel.library, kernel.wide
        self.wide_from = layers[0].wide_from  # the recorded split: each group's first choice
        self.clock = clock
        self.groups: dict[tuple[int, int], _Group] = {}

    @staticmethod
    def applies(layers: list[Int8Linear]) -> bool:
        """The layers are of one mixed kernel and every one keeps both libraries packed."""
        if not layers or layers[0].kernel.wide is None:
            return False
        return all(set(x.packed) == set(layers[0].kernel.libraries) for x in layers)

    def run(self, rows: int, head_rows: int, forward: Callable[[], T]) -> T:
        """``forward()`` (a pass of ``rows`` token rows, ``head_rows`` of them through the
        lm_head) on the library chosen for its size, timed and remembered."""
        key = (size_group(rows), size_group(head_rows) if head_rows else 0)
        library = self.choose(key)
        self._use(library)
        t0 = self.clock()
        out = forward()
        self.observe(key, library, (self.clock() - t0) / rows)
        return out

    def choose(self, key: tuple[int, int]) -> str:
        """The library of the next pass of group ``key``: the group's current one, or the
        other when a look is due."""
        group = self.groups.get(key)
        if group is None:
            first = self.wide if key[0] >= self.wide_from else self.narrow
            group = self.groups[key] = _Group(first)
        other = self.wide if group.current == self.narrow else self.narrow
        price = group.median(other)  # per row
        if price is None:  # never seen here: one look as soon as the current one is known
            look = len(group.times.get(group.current, ())) >= KEEP
        else:
            look = group.spent >= EXPLORE_EVERY * price * key[0]
        return other if look else group.current

    def observe(self, key: tuple[int, int], library: str, per_row: float) -> None:
        """Remember a pass of group ``key`` on ``library`` that took ``per_row`` seconds per
        token row; the group's passes move to the library with the lower median."""
        group = self.groups[key]
        group.times.setdefault(library, deque(maxlen=KEEP)).append(per_row)
        if library == group.current:
            group.spent += per_row * key[0]
        else:  # a look at the other library
            group.spent = 0.0
        medians = {lib: m for lib in (self.narrow, self.wide)
                   if (m := group.median(lib)) is not None}
        if len(medians) == 2:
            group.current = min(medians, key=medians.__getitem__)

    def _use(self, library: str) -> None:
        wide_from = kernels.ALL_ROWS if library == self.wide else kernels.NO_ROWS
        for layer in self.layers:
            layer.wide_from = wide_from

    def describe(self) -> str:
        """Each group's current library and medians (ms per token row), as text."""
        parts = []
        for (rows, head), g in sorted(self.groups.items()):
            shown = ", ".join(f"{lib} {m * 1e3:.2f}" for lib in (self.narrow, self.wide)
                              if (m := g.median(lib)) is not None)
            parts.append(f"{rows} rows ({head} scored): {g.current} [{shown}]")
        return "int8 passes re-timed: " + ("; ".join(parts) or "no pass yet")
