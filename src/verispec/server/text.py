"""A request's text as its tokens arrive: incremental decoding and stop strings.

The whole output is decoded again at every block (so multi-byte characters and merges come
out exactly as the final decode), and only the text that can no longer change is released:
an incomplete UTF-8 character at the end (decoded as U+FFFD) and any tail that could still
grow into a stop string are held back. A stop string ends the text just before it (it is
never emitted). A trailing EOS token is not part of the text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["TextStream"]

REPLACEMENT = "\ufffd"


class TextStream:
    """Turns token blocks into text deltas; ``stopped`` once a stop string appears."""

    def __init__(self, decode: Callable[[list[int]], str], stops: Sequence[str],
                 eos_token_ids: frozenset[int]) -> None:
        self.decode = decode
        self.stops = [s for s in stops if s]
        self.eos = eos_token_ids
        self.ids: list[int] = []
        self.sent = ""  # the text released so far
        self.stopped = False

    def feed(self, new: Sequence[int]) -> str:
        """Add a block of tokens; returns the text it releases (possibly empty)."""
        if self.stopped:
            return ""
        self.ids.extend(int(t) for t in new)
        text = self._text()
        cut = self._first_stop(text)
        if cut is not None:
            self.stopped = True
            return self._release(text[:max(cut, len(self.sent))])
        end = len(text)
        while end > len(self.sent) and text[end - 1] == REPLACEMENT:
            end -= 1
        end -= self._held_tail(text[:end])
        return self._release(text[:max(end, len(self.sent))])

    def finish(self) -> str:
        """The generation ended (EOS, budget, window, cancel): release everything left."""
        if self.stopped:
            return ""
        return self._release(self._text())

    def _text(self) -> str:
        ids = self.ids[:-1] if self.ids and self.ids[-1] in self.eos else self.ids
        return self.decode(ids) if ids else ""

    def _release(self, text: str) -> str:
        delta = text[len(self.sent):] if text.startswith(self.sent) else ""
        self.sent = text if text.startswith(self.sent) else self.sent
        return delta

    def _first_stop(self, text: str) -> int | None:
        start = max(0, len(self.sent) - max((len(s) for s in self.stops), default=0))
        hits = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
        return min(hits) if hits else None

    def _held_tail(self, text: str) -> int:
        """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
        best = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:k]):
                    best = k
                    break
        return best
