"""Drafters and per-row randomness for the batched engine (:mod:`verispec.engine.batch`).

* :class:`RowRandom` — row r's random decisions come from row r's own ``torch.Generator``, in
  the same order as in the single-request engine: its draft tokens, then its verification.
  Other rows never touch it, so a row's output does not depend on its batch.
* :class:`BatchedModelDrafter` — the draft model's rows advance together: one batched forward
  pass per draft position, each row sampling its own X_i ~ q with its own generator (M i.i.d.
  drafts per row for multi-draft methods, by forking the row into M cache rows).
* :class:`PerRowDrafter` — any single-request :class:`~verispec.drafters.base.Drafter` (the
  model-free n-gram drafter) run once per row.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from verispec.drafters.base import Draft, Drafter
from verispec.engine.methods import Method
from verispec.models.batched import BatchedLM
from verispec.sampling import Sampling, sample_from
from verispec.verify import VerifyResult

__all__ = ["BatchedDrafter", "BatchedModelDrafter", "PerRowDrafter", "RowRandom"]


class RowRandom:
    """The random decisions of each row, drawn from that row's generator only.

    Args:
        generators: one ``torch.Generator`` per request (indexed by request id, not slot).
    """

    def __init__(self, generators: Sequence[torch.Generator]) -> None:
        self.generators = list(generators)

    def generator(self, row: int) -> torch.Generator:
        return self.generators[row]

    def sample(self, row: int, probs: Tensor) -> Tensor:
        """probs: [M, V] q of the row's M drafts -> [M] int64 draft tokens."""
        return sample_from(probs, self.generators[row])

    def verify(self, row: int, method: Method, target_probs: Tensor, draft: Draft) -> VerifyResult:
        """The row's own method on its own slice: target_probs [M, γ+1, V]."""
        return method.verify(target_probs, draft, self.generators[row])


class BatchedDrafter(ABC):
    """Proposes draft blocks for every row of a batch; rows are kept in slot order."""

    def __init__(self) -> None:
        self.row_calls: list[int] = []  # per slot: draft forward passes that included the row

    @property
    def forward_calls(self) -> int:
        """Batched draft forward passes so far (0 for model-free drafters)."""
        return 0

    @abstractmethod
    def admit(self, prompts: Sequence[Sequence[int]]) -> None:
        """Append one slot per new request."""

    @abstractmethod
    def release(self, keep: Sequence[int]) -> None:
        """Keep only the slots ``keep`` (in this order); the others are freed."""

    @abstractmethod
    def propose(
        self,
        contexts: Sequence[Sequence[int]],
        gammas: Sequence[int],
        ids: Sequence[int],
        random: RowRandom,
        *,
        num_drafts: Sequence[int],
        with_next: Sequence[bool],
    ) -> list[Draft | None]:
        """Draft up to γ_b tokens after ``contexts[b]`` for every slot b (None where γ_b = 0).

        ``ids[b]`` is the request id whose randomness slot b uses.
        """

    @abstractmethod
    def feedback(self, contexts: Sequence[Sequence[int]], accepted: Sequence[int],
                 branches: Sequence[int], drafted: Sequence[bool]) -> None:
        """``contexts[b]`` now ends with the accepted tokens; only slots with ``drafted[b]``."""


class BatchedModelDrafter(BatchedDrafter):
    """Autoregressive sampling from a batched draft model, q kept exactly as sampled.

    Per slot it keeps :class:`~verispec.drafters.model.ModelDrafter`'s cache discipline:
    after ``feedback`` the row holds the longest prefix of its context already processed, and
    the next ``propose`` feeds the rest (1 or 2 tokens) in the first pass.
    """

    def __init__(self, model: BatchedLM, sampling: Sampling) -> None:
        super().__init__()
        self.model = model
        self.sampling = sampling
        self._base: list[int] = []
        self._fed: list[int] = []
        self._forks: list[int] = []

    @property
    def forward_calls(self) -> int:
        return self.model.forward_calls

    def admit(self, prompts: Sequence[Sequence[int]]) -> None:
        self.model.add_rows([list(p)[:-1] for p in prompts])
        for p in prompts:
            self._base.append(0)
            self._fed.append(0)
            self._forks.append(1)
            self.row_calls.append(1 if len(p) > 1 else 0)

    def release(self, keep: Sequence[int]) -> None:
        self.model.select_rows(keep)
        for name in ("_base", "_fed", "_forks", "row_calls"):
            old = getattr(self, name)
            setattr(self, name, [old[i] for i in keep])

    def propose(
        self,
        contexts: Sequence[Sequence[int]],
        gammas: Sequence[int],
        ids: Sequence[int],
        random: RowRandom,
        *,
        num_drafts: Sequence[int],
        with_next: Sequence[bool],
    ) -> list[Draft | None]:
        model, slots = self.model, len(contexts)
        lengths = model.lengths
        tails = [list(c[n:]) if g > 0 else [] for c, n, g in zip(contexts, lengths, gammas, strict=True)]
        logits = model.extend(tails)  # [R, k, V]
        for b in range(slots):
            self.row_calls[b] += 1 if tails[b] else 0
        last = torch.tensor([max(len(t) - 1, 0) for t in tails], device=logits.device)
        q = self.sampling.probs(logits[torch.arange(slots, device=logits.device), last], model.name)
        forks = [m if g > 0 else 1 for m, g in zip(num_drafts, gammas, strict=True)]  # [R]
        start = [sum(forks[:b]) for b in range(slots)]
        if any(f > 1 for f in forks):
            model.select_rows([b for b in range(slots) for _ in range(forks[b])])
        q_rows = [q[b].expand(forks[b], -1) for b in range(slots)]  # per slot [M_b, V]
        tokens: list[list[Tensor]] = [[] for _ in range(slots)]
        probs: list[list[Tensor]] = [[] for _ in range(slots)]
        for i in range(max(gammas, default=0)):
            feed: list[list[int]] = [[] for _ in range(sum(forks))]
            for b in range(slots):
                if i >= gammas[b]:
                    continue
                x = random.sample(ids[b], q_rows[b])  # [M_b], from slot b's own generator
                tokens[b].append(x)
                probs[b].append(q_rows[b])
                if i < gammas[b] - 1 or with_next[b]:
                    for j in range(forks[b]):
                        feed[start[b] + j] = [int(x[j])]
            if not any(feed):
                continue
            out = self.sampling.probs(model.extend(feed)[:, 0], model.name)  # [R', V]
            for b in range(slots):
                if feed[start[b]]:
                    q_rows[b] = out[start[b] : start[b] + forks[b]]
                    self.row_calls[b] += 1
        drafts: list[Draft | None] = []
        for b in range(slots):
            g = gammas[b]
            self._forks[b] = forks[b]
            if g <= 0:
                drafts.append(None)
                continue
            self._base[b] = len(contexts[b])
            self._fed[b] = g if with_next[b] else g - 1
            drafts.append(Draft(tokens=torch.stack(tokens[b], dim=1),  # [M, γ]
                                probs=torch.stack(probs[b], dim=1),  # [M, γ, V]
                                next_probs=q_rows[b] if with_next[b] else None))  # [M, V]
        return drafts

    def feedback(self, contexts: Sequence[Sequence[int]], accepted: Sequence[int],
                 branches: Sequence[int], drafted: Sequence[bool]) -> None:
        if any(f > 1 for f in self._forks):
            start = [sum(self._forks[:b]) for b in range(len(self._forks))]
            self.model.select_rows([start[b] + (branches[b] if self._forks[b] > 1 else 0)
                                    for b in range(len(self._forks))])
            self._forks = [1] * len(self._forks)
        lengths = self.model.lengths
        self.model.rollback([
            min(self._base[b] + min(int(accepted[b]), self._fed[b]), n) if drafted[b] else n
            for b, n in enumerate(lengths)
        ])


class PerRowDrafter(BatchedDrafter):
    """One single-request drafter per slot (for model-free drafters such as n-gram lookup)."""

    def __init__(self, make: Callable[[], Drafter]) -> None:
        super().__init__()
        self.make = make
        self._drafters: list[Drafter] = []

    def admit(self, prompts: Sequence[Sequence[int]]) -> None:
        for p in prompts:
            d = self.make()
            d.begin(p)
            self._drafters.append(d)
            self.row_calls.append(0)

    def release(self, keep: Sequence[int]) -> None:
        self._drafters = [self._drafters[i] for i in keep]
        self.row_calls = [self.row_calls[i] for i in keep]

    def propose(
        self,
        contexts: Sequence[Sequence[int]],
        gammas: Sequence[int],
        ids: Sequence[int],
        random: RowRandom,
        *,
        num_drafts: Sequence[int],
        with_next: Sequence[bool],
    ) -> list[Draft | None]:
        out: list[Draft | None] = []
        for b, d in enumerate(self._drafters):
            if gammas[b] <= 0:
                out.append(None)
                continue
            calls = d.forward_calls
            out.append(d.propose(contexts[b], gammas[b], random.generator(ids[b]),
                                 num_drafts=num_drafts[b], with_next=with_next[b]))
            self.row_calls[b] += d.forward_calls - calls
        return out

    def feedback(self, contexts: Sequence[Sequence[int]], accepted: Sequence[int],
                 branches: Sequence[int], drafted: Sequence[bool]) -> None:
        for b, d in enumerate(self._drafters):
            if drafted[b]:
                d.feedback(contexts[b], int(accepted[b]), int(branches[b]))
