"""The one small interface every model implements.

A :class:`CausalLM` owns a key/value cache (or, for the toy models, just the token list)
for one sequence. The engine drives it with three verbs:

* ``extend(tokens)`` — append tokens and return next-token logits for the last positions
  (prefill is ``extend(prompt, num_logits=1)``; scoring a draft block is
  ``extend([pending..., X_1..X_γ])``);
* ``rollback(length)`` — forget everything after the first ``length`` tokens;
* ``extend_branches(tokens)`` / ``keep_branch(m, length)`` — score M alternative
  continuations of the same prefix in one batched pass, then keep one of them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor

__all__ = ["CausalLM", "ContextTooLongError"]


class ContextTooLongError(ValueError):
    """The sequence would exceed the model's context window."""


class CausalLM(ABC):
    """A causal language model with a rollback-able cache for one sequence.

    Attributes:
        vocab_size: V, the size of the distributions returned.
        eos_token_ids: tokens that end generation.
        max_length: context window in tokens (None: unbounded).
        device: where logits live.
        name: human-readable identifier.
    """

    vocab_size: int
    eos_token_ids: frozenset[int]
    max_length: int | None
    device: torch.device
    name: str

    def __init__(self) -> None:
        self.forward_calls = 0  # number of extend / extend_branches calls, for statistics

    @property
    @abstractmethod
    def length(self) -> int:
        """Number of tokens currently in the cache (per row when forked)."""

    @property
    @abstractmethod
    def rows(self) -> int:
        """1 normally; M between :meth:`fork` and :meth:`join`."""

    @abstractmethod
    def _extend(self, tokens: Tensor, num_logits: int) -> Tensor:
        """tokens: [R, k] int64 -> logits [R, num_logits, V] for the last num_logits positions."""

    @abstractmethod
    def rollback(self, length: int) -> None:
        """Truncate the cache (every row) to its first ``length`` tokens."""

    @abstractmethod
    def fork(self, num_branches: int) -> None:
        """Replicate the (single-row) cache into ``num_branches`` rows."""

    @abstractmethod
    def join(self, branch: int, length: int) -> None:
        """Keep row ``branch`` only, truncated to ``length`` tokens."""

    @abstractmethod
    def reset(self) -> None:
        """Empty the cache."""

    def reorder_rows(self, indices: Tensor) -> None:
        """Keep/replicate cache rows in this order (beam search).

        Args:
            indices: [R'] int64; new row r is a copy of old row ``indices[r]`` (rows may be
                repeated or dropped, so R' may differ from the current number of rows).
        """
        raise NotImplementedError(f"{self.name} does not support reorder_rows (beam search)")

    def extend(self, tokens: Tensor, num_logits: int | None = None) -> Tensor:
        """Append tokens and return next-token logits for the last ``n`` positions.

        Args:
            tokens: [k] int64 (or [R, k] while forked into R rows).
            num_logits: n, default k.
        Returns:
            [n, V] (or [R, n, V]); entry j is the distribution of the token that follows
            position k - n + j of ``tokens``.
        """
        batched = tokens.dim() == 2
        rows = tokens if batched else tokens.unsqueeze(0)  # [R, k]
        if rows.shape[0] != self.rows:
            raise ValueError(f"{self.name}: got {rows.shape[0]} rows of tokens, cache has {self.rows}")
        k = int(rows.shape[1])
        n = k if num_logits is None else num_logits
        if k == 0 or not (1 <= n <= k):
            raise ValueError(f"extend needs 1 <= num_logits <= len(tokens), got {n} and {k}")
        if self.max_length is not None and self.length + k > self.max_length:
            raise ContextTooLongError(
                f"{self.name}: {self.length} cached + {k} new tokens exceed the context window "
                f"of {self.max_length} tokens"
            )
        self.forward_calls += 1
        logits = self._extend(rows.to(torch.int64), n)
        return logits if batched else logits[0]
