"""Cache slots allocated once and reused: the row bookkeeping every model kind shares.

A model keeps its rows' caches in P **slots**; row r lives in slot ``slots[r]``.
:class:`SlotPool` holds that map and the free slots:

* admitting a row takes the lowest free slot, which the model fills in place;
* dropping rows (``select_rows`` with a subset, in any order) and reordering them only
  rewrite the map, and dropped slots return to the free list;
* a row repeated by ``select_rows`` (a fork) keeps its slot for its first copy and takes a
  free slot for every other one; the model copies the forked row's cache into those slots,
  the only data ``select_rows`` moves.

So no verb copies another row's cache, except when more rows are live than the pool has
slots: the pool then grows geometrically (to twice its slots, or to the rows needed if more)
and the model moves its slots into the larger storage, O(log rows) times in its life;
:meth:`SlotPool.reserve` sizes the pool ahead of time. Taking the lowest free slot keeps the
live slots packed at the bottom.

:class:`SlotCache` is the storage of the tensor models (native and transformers): per layer
one key and one value tensor [P, H, L, D], where column t of a slot holds its row's token at
position t, so a row's length is all its state (rolling back is bookkeeping too).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["ALIGN", "Allocate", "Layout", "SlotCache", "SlotPool", "round_up", "write_rows"]

ALIGN = 64  # capacities (columns per slot) are multiples of this many positions
#: (slots, capacity) -> uninitialized keys and values, one [P, H, L, D] tensor each per layer
Allocate = Callable[[int, int], tuple[list[Tensor], list[Tensor]]]


def round_up(n: int) -> int:
    """``n`` rounded up to a multiple of :data:`ALIGN`."""
    return -(-n // ALIGN) * ALIGN


class SlotPool:
    """Which slot holds each row, and which slots are free.

    ``grow(size)`` is the owner's: it is called before the pool hands out slots it did not
    have, and must make slots [old size, ``size``) exist (keeping slots below it).
    """

    def __init__(self, grow: Callable[[int], None]) -> None:
        self._grow = grow
        self.slots: list[int] = []  # [R] the slot of each row
        self.size = 0  # P, slots in the pool (live or free)
        self._free: list[int] = []  # free slots, a min-heap

    def reset(self) -> None:
        """Forget every slot (the owner drops its storage)."""
        self.slots, self.size, self._free = [], 0, []

    def reserve(self, rows: int) -> None:
        """Room for ``rows`` live rows; grows to max(rows, 2 P) when the pool is smaller."""
        if rows <= self.size:
            return
        size = max(rows, 2 * self.size)
        self._grow(size)
        for s in range(self.size, size):
            heapq.heappush(self._free, s)
        self.size = size

    def admit(self, count: int) -> list[int]:
        """Slots for ``count`` new rows appended after the live ones (lowest free first)."""
        self.reserve(len(self.slots) + count)
        new = [heapq.heappop(self._free) for _ in range(count)]
        self.slots += new
        return new

    def select(self, indices: Sequence[int]) -> list[tuple[int, int]]:
        """New row r is old row ``indices[r]``: frees the slots of dropped rows and returns
        the (source, destination) slot of every extra copy of a repeated row, to be filled
        by the owner."""
        old = self.slots
        kept = set(indices)
        for row, slot in enumerate(old):
            if row not in kept:
                heapq.heappush(self._free, slot)
        self.reserve(len(indices))
        seen: set[int] = set()
        slots, copies = [], []
        for i in indices:
            if i in seen:
                slot = heapq.heappop(self._free)
                copies.append((old[i], slot))
            else:
                seen.add(i)
                slot = old[i]
            slots.append(slot)
        self.slots = slots
        return copies


class SlotCache:
    """Keys and values of a layered model in the slots of a :class:`SlotPool`.

    Per layer ``keys[i]`` and ``values[i]`` [P, H, L, D]: slot s, column t holds the token
    at position t of the row in slot s. L (``capacity``) grows geometrically with the
    longest row. Memory is allocated uninitialized (pages never written are never touched).
    Attention reads masked columns too (a masked NaN would still poison the output), so
    each slot has a watermark ``clean[s]``: its columns below it are finite (real tokens,
    stale ones, filler, or zeros written ahead of use); a pass first raises the watermarks
    of its own rows' slots to the positions it attends (:meth:`scrub`). Admitting a row or
    forking one writes only the slot it takes.
    """

    def __init__(self, allocate: Allocate) -> None:
        self._allocate = allocate
        self.pool = SlotPool(self._grow)
        self.reset()

    def reset(self) -> None:
        """Drop every row and the storage."""
        self.keys: list[Tensor] = []  # per layer [P, H, L, D]
        self.values: list[Tensor] = []
        self.capacity = 0  # L
        self.clean: list[int] = []  # [P] columns [0, clean[s]) of slot s are finite
        self.pool.reset()

    @property
    def slots(self) -> list[int]:
        """[R] the slot of each row."""
        return self.pool.slots

    def _grow(self, size: int) -> None:
        """More slots (called by the pool)."""
        self.clean += [0] * (size - len(self.clean))
        self._resize(size, self.capacity)

    def _resize(self, size: int, capacity: int) -> None:
        """New storage of ``size`` slots and ``capacity`` columns; the finite columns of
        the slots there were are copied (the one copy of live rows: growth only)."""
        kept = int(self.keys[0].shape[0]) if self.keys else 0
        used = max(self.clean[:kept], default=0)
        keys, values = self._allocate(size, capacity) if size and capacity else ([], [])
        for new, cur in zip(keys + values, self.keys + self.values, strict=False):
            new[:kept, :, :used] = cur[:, :, :used]
        if not keys:  # nothing kept: no slot holds finite columns
            self.clean = [0] * len(self.clean)
        self.keys, self.values, self.capacity = keys, values, capacity

    def reserve(self, positions: int) -> None:
        """Room for ``positions`` columns per slot (grown geometrically)."""
        if positions > self.capacity or (self.pool.size and not self.keys):
            self._resize(self.pool.size,
                         round_up(max(positions, 2 * self.capacity, 1)))

    def scrub(self, slots: Sequence[int], span: int) -> None:
        """Make columns [0, span) of ``slots`` finite (zeros ahead of use, up to a multiple
        of ALIGN), before a pass over their rows attends to them."""
        end = min(self.capacity, round_up(span))
        behind: dict[int, list[int]] = {}  # watermark -> the slots that have it
        for s in slots:
            if self.clean[s] < span:
                behind.setdefault(self.clean[s], []).append(s)
        for start, group in behind.items():
            index = torch.tensor(group, dtype=torch.int64, device=self.keys[0].device)
            for t in self.keys + self.values:
                t[index, :, start:end] = 0
            for s in group:
                self.clean[s] = end

    def admit(self, lengths: Sequence[int]) -> list[int]:
        """Slots for new rows of ``lengths`` tokens, with room for them, to be filled in
        place (their prefills write columns [0, length), the only ones they read)."""
        slots = self.pool.admit(len(lengths))
        self.reserve(max(lengths, default=0))
        for s, n in zip(slots, lengths, strict=True):
            self.clean[s] = n
        return slots

    @torch.inference_mode()
    def select(self, indices: Sequence[int], lengths: Sequence[int]) -> None:
        """Rows ``indices`` of the old rows, whose lengths were ``lengths``: bookkeeping,
        plus a copy of a repeated row's used columns into each extra slot it takes."""
        used = dict(zip(self.pool.slots, lengths, strict=True))  # slot -> its row's length
        for src, dst in self.pool.select(indices):
            n = used[src]
            for t in self.keys + self.values:
                t[dst, :, :n] = t[src, :, :n]
            self.clean[dst] = n


@dataclass
class Layout:
    """The slot of each row of a forward pass, for reading and writing the cache tensors
    [P, H, L, D] where the rows are."""

    first: int | None  # row b is slot first + b (None: the rows are scattered)
    slots: Tensor  # [R] each row's slot
    runs: list[tuple[int, int, Tensor]]  # scattered rows: per run of consecutive slots
    # [a, b), the rows [b - a] of the pass that sit there, in slot order

    @classmethod
    def of(cls, slots: Sequence[int] | None, rows: int, device: torch.device) -> Layout:
        """The layout of rows in ``slots`` (None: row b is slot b)."""
        slots = list(range(rows)) if slots is None else list(slots)
        index = torch.tensor(slots, dtype=torch.int64, device=device)  # [R]
        first = slots[0] if slots else 0
        if slots == list(range(first, first + rows)):
            return cls(first, index, [])
        order = sorted(range(rows), key=lambda b: slots[b])
        runs: list[tuple[int, int, Tensor]] = []
        start = 0
        for i in range(1, rows + 1):
            if i == rows or slots[order[i]] != slots[order[i - 1]] + 1:
                group = order[start:i]
                runs.append((slots[group[0]], slots[group[-1]] + 1,
                             torch.tensor(group, dtype=torch.int64, device=device)))
                start = i
        return cls(None, index, runs)

    def read(self, cache: Tensor, span: int) -> Tensor:
        """[R, H, S, D]: the rows' first S = ``span`` positions of ``cache`` [P, H, L, D], a
        view for rows in a run of slots in row order, else a gathered copy."""
        if self.first is not None:
            return cache[self.first: self.first + self.slots.shape[0], :, :span]
        return cache[:, :, :span].index_select(0, self.slots)


def write_rows(cache: Tensor, new: Tensor, layout: Layout, start: int | None,
               positions: Tensor | None) -> None:
    """Store a pass's keys or values ``new`` [R, k, H, D] in ``cache`` [P, H, L, D]: row b's
    token j at row b's slot, position ``start`` + j (rows of one length) or
    ``positions[b, j]`` ([R, k], ragged rows)."""
    rows, k = new.shape[0], new.shape[1]
    if start is None:
        token_slots = layout.slots[:, None].expand(rows, k)  # [R, k]
        cache.transpose(1, 2).index_put_((token_slots, positions), new.to(cache.dtype))
    elif layout.first is not None:
        cache[layout.first: layout.first + rows, :, start: start + k] = new.transpose(1, 2)
    else:
        cache[layout.slots, :, start: start + k] = new.transpose(1, 2).to(cache.dtype)
