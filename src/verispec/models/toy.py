"""Exact toy models with known probability tables — test doubles shipped with the library.

They compute everything in float64, so exact-enumeration tests can compare whole-sequence
distributions to 1e-12. Each model's "logits" are log-probabilities, so warping with
temperature 1 returns the table itself.

* :class:`ContextIndependentLM` — the same distribution everywhere (the paper's A/B example:
  ``ContextIndependentLM([1/3, 2/3])`` is Mb, ``ContextIndependentLM([2/3, 1/3])`` is Ms).
* :class:`MarkovLM` — the distribution depends on the last token only.
* :class:`RandomContextLM` — a different random distribution for every whole context.

A row's cache is its token list, kept in a slot of a :class:`~verispec.models.slots.SlotPool`
like the tensor models' caches: adding, dropping and reordering rows leaves every list in
place, and a fork copies the forked row's list only.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Sequence

import torch
from torch import Tensor

from verispec.models.base import CausalLM
from verispec.models.slots import SlotPool

__all__ = ["ContextIndependentLM", "MarkovLM", "RandomContextLM", "TableLM", "ToyTokenizer"]


class TableLM(CausalLM):
    """A model defined by ``next_probs(context) -> [V]``; the cache of each row is its token
    list, in slot ``slots[r]`` of ``store``."""

    def __init__(
        self,
        vocab_size: int,
        *,
        eos_token_id: int | None = None,
        max_length: int | None = None,
        name: str = "toy",
    ) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset() if eos_token_id is None else frozenset({eos_token_id})
        self.max_length = max_length
        self.device = torch.device("cpu")
        self.name = name
        self.precision = "float64"
        self.tokenizer = ToyTokenizer(vocab_size) if vocab_size <= 26 else None
        self._weights_key = id(self)  # kept by spawn's copy: twins share their tables
        self.reset()

    @property
    def weights_key(self) -> int:
        return self._weights_key

    def next_probs(self, context: Sequence[int]) -> Tensor:
        """[V] float64 distribution of the token after ``context``."""
        raise NotImplementedError

    @property
    def lengths(self) -> list[int]:
        return [len(self.store[s]) for s in self._pool.slots]

    @property
    def slots(self) -> list[int]:
        return list(self._pool.slots)

    @property
    def _rows(self) -> list[list[int]]:
        """Every row's token list (the cached objects themselves), in row order."""
        return [self.store[s] for s in self._pool.slots]

    def reset(self) -> None:
        self.store: list[list[int]] = []  # [P] token lists, one per slot
        self._pool = SlotPool(self._grow)

    def _grow(self, size: int) -> None:
        self.store += [[] for _ in range(size - len(self.store))]

    def reserve(self, rows: int) -> None:
        self._pool.reserve(rows)

    def spawn(self) -> TableLM:
        twin = copy.copy(self)  # same tables (and memo), a cache of its own
        twin.reset()
        twin.forward_calls = 0
        return twin

    def _add_rows(self, prefixes: list[list[int]]) -> None:
        for s, p in zip(self._pool.admit(len(prefixes)), prefixes, strict=True):
            self.store[s] = list(p)

    def _extend(self, tokens: list[list[int]], num_logits: int) -> Tensor:
        out = []
        for row, new in zip(self._rows, tokens, strict=True):
            row.extend(new)
            n, k = len(row), min(num_logits, len(new))
            dists = [self.next_probs(tuple(row[:end])) for end in range(n - k + 1, n + 1)]
            filler = dists[-1] if dists else torch.full((self.vocab_size,), 1.0 / self.vocab_size,
                                                        dtype=torch.float64)
            out.append(torch.stack(dists + [filler] * (num_logits - k)))
        return torch.stack(out).log()  # [R, n, V] float64, -inf where p = 0

    def _rollback(self, lengths: list[int]) -> None:
        for row, n in zip(self._rows, lengths, strict=True):
            del row[n:]

    def _select_rows(self, indices: list[int]) -> None:
        for src, dst in self._pool.select(indices):
            self.store[dst] = list(self.store[src])  # a fork copies the forked row only


class ContextIndependentLM(TableLM):
    """Every position has the same distribution ``probs`` [V]."""

    def __init__(self, probs: Sequence[float] | Tensor, **kw: object) -> None:
        table = torch.as_tensor(probs, dtype=torch.float64)
        super().__init__(int(table.shape[0]), name="context-independent", **kw)  # type: ignore[arg-type]
        self.table = table / table.sum()

    def next_probs(self, context: Sequence[int]) -> Tensor:
        return self.table


class MarkovLM(TableLM):
    """First-order Markov chain: ``initial`` [V] after an empty context, else ``transition[last]``."""

    def __init__(self, initial: Tensor, transition: Tensor, **kw: object) -> None:
        super().__init__(int(initial.shape[0]), name="markov", **kw)  # type: ignore[arg-type]
        self.initial = initial.to(torch.float64) / initial.sum()
        self.transition = transition.to(torch.float64)
        self.transition = self.transition / self.transition.sum(dim=1, keepdim=True)

    @classmethod
    def random(cls, vocab_size: int, seed: int, **kw: object) -> MarkovLM:
        g = torch.Generator().manual_seed(seed)
        init = torch.rand(vocab_size, generator=g, dtype=torch.float64) + 0.05
        trans = torch.rand((vocab_size, vocab_size), generator=g, dtype=torch.float64) + 0.05
        return cls(init, trans, **kw)

    def next_probs(self, context: Sequence[int]) -> Tensor:
        return self.initial if not context else self.transition[context[-1]]


class RandomContextLM(TableLM):
    """A fresh random distribution for every distinct context (any-context dependence).

    The distribution after ``context`` is a deterministic function of ``(seed, context)``:
    Dirichlet(1) weights raised to ``sharpness`` and renormalised.
    """

    def __init__(self, vocab_size: int, seed: int, sharpness: float = 1.0, **kw: object) -> None:
        super().__init__(vocab_size, name="random-context", **kw)  # type: ignore[arg-type]
        self.seed = seed
        self.sharpness = sharpness
        self._memo: dict[tuple[int, ...], Tensor] = {}

    def next_probs(self, context: Sequence[int]) -> Tensor:
        key = tuple(context)
        if key not in self._memo:
            digest = hashlib.sha256(repr((self.seed, key)).encode()).digest()
            g = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
            u = torch.rand(self.vocab_size, generator=g, dtype=torch.float64)
            w = (-torch.log1p(-u)) ** self.sharpness
            self._memo[key] = w / w.sum()
        return self._memo[key]


class ToyTokenizer:
    """Maps token i to the letter ``chr(ord('A') + i)`` (and back), for demos and CLI tests."""

    def __init__(self, vocab_size: int) -> None:
        if vocab_size > 26:
            raise ValueError("ToyTokenizer supports at most 26 tokens")
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        ids = [ord(c) - ord("A") for c in text]
        if any(not (0 <= i < self.vocab_size) for i in ids):
            raise ValueError(f"text {text!r} has characters outside A..{chr(64 + self.vocab_size)}")
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(ord("A") + int(i)) for i in ids)
