"""A dependency-free progress bar with an ETA, written to the error stream.

On a terminal the bar redraws in place; otherwise (logs, pipes, tests) it prints one line
per step. The ETA is the mean time per step *in this run* times the steps left, so a
resumed run does not count the steps it skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Progress", "format_duration"]


def format_duration(seconds: float) -> str:
    whole = max(0, round(seconds))
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """``Progress(total, stream)``; call :meth:`step` after each unit of work."""

    def __init__(self, total: int, stream: TextIO, *, done: int = 0, width: int = 24,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.stream, self.width, self.clock = total, stream, width, clock
        self.done = done
        self.run_done = 0
        self.start = clock()
        isatty = getattr(stream, "isatty", None)
        self.tty = bool(isatty and isatty())

    def line(self, label: str = "") -> str:
        frac = self.done / self.total if self.total else 1.0
        filled = round(frac * self.width)
        elapsed = self.clock() - self.start
        if self.run_done:
            eta = format_duration(elapsed / self.run_done * (self.total - self.done))
        else:
            eta = "?"
        bar = "#" * filled + "-" * (self.width - filled)
        text = (f"[{bar}] {self.done}/{self.total} {100 * frac:3.0f}% "
                f"elapsed {format_duration(elapsed)} ETA {eta}")
        return f"{text} | {label}" if label else text

    def step(self, label: str = "") -> None:
        self.done += 1
        self.run_done += 1
        self.show(label)

    def show(self, label: str = "") -> None:
        if self.tty:
            self.stream.write("\r\033[K" + self.line(label))
            if self.done >= self.total:
                self.stream.write("\n")
        else:
            self.stream.write(self.line(label) + "\n")
        self.stream.flush()
