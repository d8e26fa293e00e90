"""A pair's acceptance kept on disk: γ auto's prior for the first request of a process.

:class:`~verispec.engine.gamma.PairHistory` pools the acceptance of the requests a pair has
served, so that a request starts from what the pair usually achieves instead of the generic
prior ``PRIOR_ALPHA``. Held per process only, the first request of every process (each
``verispec generate`` call, each server start) started from that generic prior and drafted
short until its own acceptance caught up. :class:`RecordedHistory` keeps the same counts
under verispec's cache directory, keyed by the two models (name, precision, variant), the
machine, the method and the sampling warp, and reads them back in the next process.

The counts are outcomes of earlier requests only, so a γ chosen from them is still decided
before the block it drafts, and every lossless method stays lossless. Delete
``<cache>/acceptance/`` to start from the generic prior again.
"""

from __future__ import annotations

import atexit
import json
import math
import time
import weakref
from pathlib import Path

from verispec.engine.costs import pair_key
from verispec.engine.gamma import PairHistory
from verispec.models.base import CausalLM

__all__ = ["SAVE_INTERVAL_S", "RecordedHistory", "history_file", "pair_history_for"]

#: A history writes its counts at most this often while requests run (and once at exit).
SAVE_INTERVAL_S = 1.0
RECORD_VERSION = 2

_LIVE: weakref.WeakSet[RecordedHistory] = weakref.WeakSet()


class RecordedHistory(PairHistory):
    """A :class:`PairHistory` that starts from the counts recorded in ``file`` (none, or an
    unreadable record: from nothing) and writes its counts back there."""

    def __init__(self, file: Path) -> None:
        super().__init__()
        self.file = file
        (self.first_accepted, self.first_tested,
         self.rest_accepted, self.rest_tested) = _read(file)
        self.cap()
        self.recorded = self.tested  # positions known from earlier processes
        self._changed = False
        self._saved_at = time.monotonic()
        _LIVE.add(self)

    def observe(self, drafted: int, accepted: int) -> None:
        super().observe(drafted, accepted)
        self._changed = True
        if time.monotonic() - self._saved_at >= SAVE_INTERVAL_S:
            self.save()

    def save(self) -> None:
        """Write the counts (atomically; a cache that cannot be written is skipped)."""
        if not self._changed:
            return
        from verispec.models.fetch import save_record

        save_record(self.file, {"version": RECORD_VERSION,
                                "first": [self.first_accepted, self.first_tested],
                                "rest": [self.rest_accepted, self.rest_tested]})
        self._changed = False
        self._saved_at = time.monotonic()


def _read(file: Path) -> tuple[float, float, float, float]:
    """(first accepted, first tested, rest accepted, rest tested) from a record (the
    :class:`~verispec.engine.gamma.AcceptanceCounts`); zeros where there is none, it is of
    another version or it does not hold finite counts with 0 ≤ accepted ≤ tested."""
    try:
        data = json.loads(file.read_text())
        parts = [[float(x) for x in data[part]] for part in ("first", "rest")]
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0, 0.0, 0.0, 0.0
    if data.get("version") != RECORD_VERSION or any(len(part) != 2 for part in parts):
        return 0.0, 0.0, 0.0, 0.0
    (first_accepted, first_tested), (rest_accepted, rest_tested) = parts
    if not all(math.isfinite(x) for x in parts[0] + parts[1]) or not all(
            0 <= accepted <= tested for accepted, tested in parts):
        return 0.0, 0.0, 0.0, 0.0
    return first_accepted, first_tested, rest_accepted, rest_tested


def history_file(target: CausalLM, draft: CausalLM, method: str, warp: object) -> Path | None:
    """Where the pair's acceptance for ``method`` under the sampling ``warp`` is recorded;
    None for a model not loaded from a directory (toy tables, test doubles: their names do
    not identify their weights)."""
    if not all(getattr(m, "source", None) for m in (target, draft)):
        return None
    from verispec.models.fetch import cache_dir

    key = pair_key(target, draft, method, repr(warp), f"v{RECORD_VERSION}")
    name = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in method) or "method"
    return cache_dir() / "acceptance" / f"{name}-{key}.json"


def pair_history_for(target: CausalLM, draft: CausalLM, method: str,
                     warp: object) -> PairHistory:
    """A fresh history of the pair: recorded on disk where the models are identified by
    their directory (:func:`history_file`), else held in memory only."""
    file = history_file(target, draft, method, warp)
    return PairHistory() if file is None else RecordedHistory(file)


@atexit.register
def _save_all() -> None:
    for history in list(_LIVE):
        history.save()
