"""Draft-model drafter: autoregressive sampling from q for every row at once."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import Tensor

from verispec.drafters.base import Draft, Drafter, DraftRow
from verispec.models.base import CausalLM
from verispec.sampling import choose_rows, warp_rows

__all__ = ["ModelDrafter"]


class ModelDrafter(Drafter):
    """Samples X_i ~ q(· | context, X_<i) for every row, keeping each q exactly as sampled.

    The rows advance together: one batched draft forward pass per draft position, each row
    sampling its own tokens with its own :class:`~verispec.sampling.Randomness` (M i.i.d.
    drafts for multi-draft methods, by forking the row into M cache rows). A row that
    verifies by matching takes the argmax and builds no q.

    ``stop_below`` (optional, in (0, 1]) ends a row's draft early, after at least one token,
    when the draft model's own confidence in its next token, max_x q₁(x | context, X^i)
    under its unwarped (temperature 1) distribution, falls below the threshold: a draft the
    model itself doubts is likely rejected, and every draft forward costs time. The draft
    length is then a stopping time of the draft prefix alone, which keeps token and block
    verification lossless (checked by exact enumeration in the tests).

    Cache discipline: a request joins the draft model's cache at its first proposal (its
    prompt and any tokens decoded before are read then, so a request that never drafts
    never pays the draft's prefill); after ``feedback`` a row holds the longest prefix of
    its new context already processed, and the next ``propose`` feeds the rest (the next
    token, plus X_γ when the whole block was accepted) in its first pass.
    """

    def __init__(self, model: CausalLM, *, stop_below: float | None = None) -> None:
        if stop_below is not None and not 0.0 < stop_below <= 1.0:
            raise ValueError(f"draft stop threshold must be in (0, 1], got {stop_below}")
        self.model = model
        self.stop_below = stop_below
        self._ids: list[int] = []  # request id of each cache row (outside a proposal)
        self._base: dict[int, int] = {}  # context length at the last proposal
        self._fed: dict[int, int] = {}  # draft tokens fed to the model in the last proposal
        self._forks: list[int] = []  # cache rows per slot during a multi-draft proposal
        self._row_calls: dict[int, int] = {}  # draft forward passes that included each row
        self._waiting: set[int] = set()  # admitted requests not yet in the draft's cache

    @property
    def forward_calls(self) -> int:
        return self.model.forward_calls

    @property
    def max_length(self) -> int | None:
        return self.model.max_length

    @property
    def cost_key(self) -> tuple[str, int]:
        return ("model", self.model.weights_key)

    def row_calls(self, row_id: int) -> int:
        return self._row_calls.get(row_id, 0)

    def admit(self, rows: Sequence[DraftRow]) -> None:
        for r in rows:
            self._waiting.add(r.id)
            self._row_calls[r.id] = 0

    def _join(self, rows: Sequence[DraftRow]) -> None:
        """Read the contexts (all but the last token) of waiting requests that now draft."""
        if not rows:
            return
        start = time.perf_counter()
        self.model.add_rows([r.context[:-1] for r in rows])
        self.reading_time_s += time.perf_counter() - start
        for r in rows:
            self._waiting.discard(r.id)
            self._ids.append(r.id)
            self._base[r.id] = self._fed[r.id] = 0
            self._row_calls[r.id] = 1 if len(r.context) > 1 else 0

    def release(self, rows: Sequence[DraftRow]) -> None:
        gone = {r.id for r in rows}
        keep = [s for s, i in enumerate(self._ids) if i not in gone]
        if len(keep) < len(self._ids):
            self.model.select_rows(keep)
        self._ids = [self._ids[s] for s in keep]
        for i in gone:
            self._waiting.discard(i)
            self._base.pop(i, None)
            self._fed.pop(i, None)
            self._row_calls.pop(i, None)

    def propose(self, rows: Sequence[DraftRow], gammas: Sequence[int]) -> list[Draft]:
        self._join([r for r, g in zip(rows, gammas, strict=True)
                    if g > 0 and r.id in self._waiting])
        joined = [b for b, r in enumerate(rows) if r.id not in self._waiting]
        out = [_empty(r, self.model.vocab_size) for r in rows]
        if joined:
            for b, d in zip(joined, self._propose([rows[b] for b in joined],
                                                  [gammas[b] for b in joined]), strict=True):
                out[b] = d
        return out

    def _propose(self, rows: Sequence[DraftRow], gammas: Sequence[int]) -> list[Draft]:
        model = self.model
        slot_of = {i: s for s, i in enumerate(self._ids)}
        slots = [slot_of[r.id] for r in rows]
        lengths = model.lengths
        tails: list[list[int]] = [[] for _ in self._ids]
        for r, g, s in zip(rows, gammas, slots, strict=True):
            if g > 0:
                tails[s] = r.context[lengths[s]:]
        if not any(tails):
            return [_empty(r, model.vocab_size) for r in rows]
        logits = model.extend(tails, num_logits=1, check=False)[:, 0]  # [R, V]
        forks = [1] * len(self._ids)
        for r, g, s in zip(rows, gammas, slots, strict=True):
            forks[s] = r.num_drafts if g > 0 else 1
        start = [sum(forks[:s]) for s in range(len(forks))]
        if any(f > 1 for f in forks):
            model.select_rows([s for s in range(len(forks)) for _ in range(forks[s])])
            logits = logits[torch.tensor([s for s in range(len(forks)) for _ in range(forks[s])],
                                         device=logits.device)]  # [R', V]
        self._forks = forks
        return self._sample(rows, gammas, slots, start, logits, tails)

    def _sample(self, rows: Sequence[DraftRow], gammas: Sequence[int], slots: list[int],
                start: list[int], logits: Tensor, tails: list[list[int]]) -> list[Draft]:
        """The per-position loop: sample every live row, feed them all in one pass."""
        model, n = self.model, len(rows)
        live = [g > 0 for g in gammas]
        spans = [slice(start[s], start[s] + self._forks[s]) for s in slots]  # cache rows per row
        tokens: list[list[Tensor]] = [[] for _ in range(n)]
        probs: list[list[Tensor]] = [[] for _ in range(n)]
        q = self._warp(rows, spans, live, logits)  # per row [M, V] (None when matching)
        for b, r in enumerate(rows):
            self._fed[r.id] = 0
            if tails[slots[b]]:
                self._row_calls[r.id] += 1
        for i in range(max(gammas, default=0)):
            feed: list[list[int]] = [[] for _ in range(logits.shape[0])]
            drawn = [b for b, r in enumerate(rows) if live[b] and i < gammas[b] and not r.matching]
            xs = dict(zip(drawn, choose_rows([rows[b].random for b in drawn],
                                             [q[b] for b in drawn]),  # type: ignore[misc]
                          strict=True))  # b -> [M]
            for b, r in enumerate(rows):
                if not live[b] or i >= gammas[b]:
                    continue
                x = logits[spans[b]].argmax(-1) if r.matching else xs[b]  # [M]
                tokens[b].append(x)
                if not r.matching:
                    probs[b].append(q[b])
                if i < gammas[b] - 1 or r.with_next:
                    for j, t in enumerate(x.tolist()):
                        feed[spans[b].start + j] = [t]
                else:
                    live[b] = False
            if not any(feed):
                break
            logits = model.extend(feed, num_logits=1, check=False)[:, 0]  # [R', V]
            fed = [bool(feed[spans[b].start]) for b in range(n)]
            fresh = self._warp(rows, spans, fed, logits)
            for b, r in enumerate(rows):
                if fed[b]:
                    q[b] = fresh[b]
                    self._row_calls[r.id] += 1
                    self._fed[r.id] = i + 1
                    if i < gammas[b] - 1 and self._doubts(logits[spans[b]], r.num_drafts):
                        live[b] = False  # the draft doubts its next token: X^{i+1} is the draft
        drafts = []
        for b, r in enumerate(rows):
            self._base[r.id] = len(r.context)
            if not tokens[b]:
                drafts.append(_empty(r, model.vocab_size))
                continue
            drafts.append(Draft(
                tokens=torch.stack(tokens[b], dim=1),  # [M, γ]
                probs=None if r.matching else torch.stack(probs[b], dim=1),  # [M, γ, V]
                next_probs=q[b] if r.with_next and q[b] is not None else None))  # [M, V]
        return drafts

    def _warp(self, rows: Sequence[DraftRow], spans: list[slice], wanted: list[bool],
              logits: Tensor) -> list[Tensor | None]:
        """q [M, V] per row whose next token is wanted and sampled (None otherwise)."""
        need = [b for b, r in enumerate(rows) if wanted[b] and not r.matching]
        out: list[Tensor | None] = [None] * len(rows)
        if not need:
            return out
        if len(need) == 1 and len(rows) == 1:
            out[0] = rows[0].sampling.probs(logits[spans[0]], self.model.name)
            return out
        idx = [i for b in need for i in range(spans[b].start, spans[b].stop)]
        samplings = [rows[b].sampling for b in need for _ in range(spans[b].stop - spans[b].start)]
        picked = logits if idx == list(range(logits.shape[0])) else \
            logits[torch.tensor(idx, device=logits.device)]  # [R'', V], a copy only if a subset
        warped = warp_rows(picked, samplings, self.model.name)  # [R'', V]
        at = 0
        for b in need:
            width = spans[b].stop - spans[b].start
            out[b] = warped[at : at + width]
            at += width
        return out

    def _doubts(self, logits: Tensor, num_drafts: int) -> bool:
        """True if max_x q₁(x) < stop_below for one draft's raw next-token logits [1, V]."""
        if self.stop_below is None or num_drafts != 1:
            return False
        return bool(torch.softmax(logits[0].float(), -1).max() < self.stop_below)

    def feedback(self, rows: Sequence[DraftRow], accepted: Sequence[int],
                 branches: Sequence[int]) -> None:
        kept = [b for b, r in enumerate(rows) if r.id not in self._waiting]
        rows, accepted, branches = ([x[b] for b in kept] for x in (rows, accepted, branches))
        model, forks = self.model, self._forks
        if any(f > 1 for f in forks):
            slot_of = {i: s for s, i in enumerate(self._ids)}
            branch_of = {slot_of[r.id]: int(b) for r, b in zip(rows, branches, strict=True)}
            start = [sum(forks[:s]) for s in range(len(forks))]
            model.select_rows([start[s] + (branch_of.get(s, 0) if forks[s] > 1 else 0)
                               for s in range(len(forks))])
        self._forks = [1] * len(self._ids)
        lengths = model.lengths
        slot_of = {i: s for s, i in enumerate(self._ids)}
        target = list(lengths)
        for r, tau in zip(rows, accepted, strict=True):
            s = slot_of[r.id]
            target[s] = min(self._base[r.id] + min(int(tau), self._fed[r.id]), lengths[s])
        model.rollback(target)


def _empty(row: DraftRow, vocab: int) -> Draft:
    m = row.num_drafts
    return Draft(tokens=torch.empty((m, 0), dtype=torch.int64),
                 probs=None if row.matching else torch.empty((m, 0, vocab)))
