"""The one model interface: a causal LM holding R independent rows (sequences).

A prompt is a batch of one: the engine, the drafters, beam search and PEARL's workers all
drive every model through these verbs, whatever the number of rows.

* ``add_rows(prefixes)`` — append one row per prefix, each prefilled with its own tokens
  (a prefix may be empty);
* ``extend(tokens, num_logits)`` — append k_b ≥ 0 tokens to every row b in one forward pass
  and return next-token logits [R, n, V]; entry [b, j] is the distribution of the token
  that follows row b's new token number k_b − n_b + j, with n_b = min(n, k_b) (left
  aligned: entries j ≥ n_b of a shorter row are finite filler, never to be read);
* ``rollback(lengths)`` — truncate row b to its first ``lengths[b]`` tokens;
* ``select_rows(indices)`` — new row r is a copy of old row ``indices[r]``: this frees
  finished rows, forks a row into M drafts, joins back to the kept one and reorders beams;
* ``spawn()`` — an empty model sharing these weights (its own cache), for work that needs
  rows of its own, such as one request's beam search.

Everything ragged (rows of different lengths, padding, masks, positions, per-row cache
rollback) lives in the implementations, never in the engine. The models keep each row's
cache in a slot allocated once and reused (:mod:`verispec.models.slots`), so adding,
dropping, reordering and forking rows copies no other row's cache.

The verbs check their arguments: every token id is converted and range-checked, once per
token. A caller whose tokens are already R lists of valid ids (the engine and its drafters:
prompts are checked once when a request is submitted, :meth:`CausalLM.check_tokens`) passes
``check=False`` to ``extend`` and skips that per-token work on the decoding path.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["CausalLM", "ContextTooLongError", "as_rows"]


class ContextTooLongError(ValueError):
    """The sequence would exceed the model's context window."""


def as_rows(tokens: Tensor | Sequence[Sequence[int]] | Sequence[int]) -> list[list[int]]:
    """Tokens for every row as Python lists: [R, k] tensors, lists of lists, or one flat
    list / [k] tensor meaning a single row."""
    if isinstance(tokens, Tensor):
        rows = tokens.tolist() if tokens.dim() == 2 else [tokens.tolist()]
    else:
        seq = list(tokens)
        rows = [seq] if seq and not isinstance(seq[0], (list, tuple, Tensor)) else seq
    return [[int(t) for t in row] for row in rows]


class CausalLM(ABC):
    """A causal language model with a rollback-able cache for R rows.

    Attributes:
        vocab_size: V, the size of the distributions returned.
        eos_token_ids: tokens that end generation.
        max_length: context window in tokens (None: unbounded).
        device: where logits live.
        name: human-readable identifier.
        tokenizer: the model's tokenizer (``encode``/``decode``), or None.
        precision: the numeric format the weights run in (``"float32"``, ``"int8"``, ...).
        variant: what else decides a pass's cost beside the name and precision (a quantized
            model's format and options; "" where nothing does): recorded pass costs are
            keyed by it.
        forward_calls: forward passes so far (prefills included), for statistics.
    """

    vocab_size: int
    eos_token_ids: frozenset[int]
    max_length: int | None
    device: torch.device
    name: str
    tokenizer: Any = None
    precision: str = "float32"
    variant: str = ""

    def __init__(self) -> None:
        self.forward_calls = 0

    # -- what implementations provide ------------------------------------------------------

    @property
    @abstractmethod
    def lengths(self) -> list[int]:
        """Tokens cached per row ([R] Python ints)."""

    @abstractmethod
    def reset(self) -> None:
        """Drop every row."""

    @abstractmethod
    def _add_rows(self, prefixes: list[list[int]]) -> None:
        """Append prefilled rows (prefixes already checked)."""

    @abstractmethod
    def _extend(self, tokens: list[list[int]], num_logits: int) -> Tensor:
        """Checked ragged tokens, n = ``num_logits`` ≥ 1 -> logits [R, n, V] (left aligned)."""

    @abstractmethod
    def _rollback(self, lengths: list[int]) -> None:
        """Truncate rows (lengths already checked, at least one shorter)."""

    @abstractmethod
    def _select_rows(self, indices: list[int]) -> None:
        """Keep, repeat or reorder rows (indices already checked)."""

    @abstractmethod
    def spawn(self) -> CausalLM:
        """An empty model with the same weights and a cache of its own."""

    @property
    def weights_key(self) -> int:
        """Equal for models that share their weights (a model and its spawned twins), so
        their passes cost alike; this model alone by default."""
        return id(self)

    def reserve(self, rows: int) -> None:
        """Hint: room for ``rows`` rows live at once, allocated now so that admitting and
        forking rows up to that many never grows the cache (a no-op where nothing is
        preallocated)."""

    # -- the verbs, with their checks ---------------------------------------------------------

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def length(self) -> int:
        """Tokens cached in the only row (for single-row users such as beam search)."""
        lengths = self.lengths
        if len(lengths) != 1:
            raise ValueError(f"{self.name} holds {len(lengths)} rows; `length` needs exactly one")
        return lengths[0]

    def add_rows(self, prefixes: Sequence[Sequence[int]]) -> None:
        """Append one row per prefix, with the prefix prefilled (a prefix may be empty)."""
        rows = [self.check_tokens(p) for p in prefixes]
        for p in rows:
            self._check_room(0, len(p))
        if rows:
            self._add_rows(rows)
            self.forward_calls += sum(1 for p in rows if p)  # one prefill pass per prompt

    def extend(self, tokens: Tensor | Sequence[Sequence[int]] | Sequence[int],
               num_logits: int | None = None, *, check: bool = True) -> Tensor:
        """Append ``tokens[b]`` (k_b tokens, possibly none) to every row b in one pass.

        Args:
            tokens: [R, k] int64, or R lists (ragged), or one flat list for a single row.
            num_logits: n, logits wanted per row (default: the longest k_b).
            check: convert and range-check every token (False: ``tokens`` must be R lists
                of valid Python int ids, used as given; the per-row checks still run).
        Returns:
            [R, n, V] logits in the model's dtype; [b, j] follows row b's new token
            k_b − n_b + j, n_b = min(n, k_b), meaningful for j < n_b only.
        """
        if check:
            rows = [self.check_tokens(t) for t in as_rows(tokens)]
        else:
            rows = tokens  # type: ignore[assignment]  # R lists of valid ids, as documented
        if len(rows) != self.rows:
            raise ValueError(f"{self.name}: got tokens for {len(rows)} rows, the cache has {self.rows}")
        k_max = max((len(t) for t in rows), default=0)
        if k_max == 0:
            raise ValueError("extend needs at least one token in some row")
        n = k_max if num_logits is None else int(num_logits)
        if not 1 <= n <= k_max:
            raise ValueError(f"extend needs 1 <= num_logits <= {k_max}, got {n}")
        for cached, new in zip(self.lengths, rows, strict=True):
            self._check_room(cached, len(new))
        self.forward_calls += 1
        return self._extend(rows, n)

    def rollback(self, lengths: Sequence[int] | int) -> None:
        """Truncate row b to its first ``lengths[b]`` tokens (an int: every row to it)."""
        now = self.lengths
        new = [int(lengths)] * len(now) if isinstance(lengths, int) else [int(n) for n in lengths]
        if len(new) != len(now):
            raise ValueError(f"{self.name}: {len(new)} lengths for {len(now)} rows")
        if any(not 0 <= n <= c for n, c in zip(new, now, strict=True)):
            raise ValueError(f"cannot roll back to {new}; rows hold {now}")
        if new != now:
            self._rollback(new)

    def select_rows(self, indices: Sequence[int]) -> None:
        """New row r becomes a copy of old row ``indices[r]`` (rows may repeat or be dropped)."""
        idx = [int(i) for i in indices]
        rows = self.rows
        if any(not 0 <= i < rows for i in idx):
            raise ValueError(f"{self.name}: row index outside [0, {rows}) in {idx}")
        if idx != list(range(rows)):
            self._select_rows(idx)

    def check_tokens(self, tokens: Sequence[int]) -> list[int]:
        """``tokens`` as Python ints; ValueError if one lies outside the vocabulary."""
        out = [int(t) for t in tokens]
        if any(not 0 <= t < self.vocab_size for t in out):
            raise ValueError(f"{self.name}: token id outside [0, {self.vocab_size})")
        return out

    def _check_room(self, cached: int, new: int) -> None:
        if self.max_length is not None and cached + new > self.max_length:
            raise ContextTooLongError(
                f"{self.name}: {cached} cached + {new} new tokens exceed the context window of "
                f"{self.max_length} tokens"
            )
