"""What each model does in a phase — the same code in a worker process and in the reference.

* :class:`CacheMirror` tracks which tokens a model's cache holds, so the coordinator can send
  a worker only ``(keep, feed)``: "roll back to ``keep`` tokens, then feed these".
* :class:`DraftSide` samples n tokens by inverse CDF from uniforms it is given and writes
  each q row (float64) into an output tensor.
* :class:`TargetSide` scores a window and writes the p rows (float64); it keeps the raw
  logits so that the NLL of the tokens finally committed can be asked for afterwards.

Both sides apply the run's :class:`~verispec.sampling.Sampling` warp, so p and q are exactly
the distributions the schedule verifies with and samples from.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from verispec.methods.pearl.schedule import sample_with_uniform
from verispec.models.base import CausalLM
from verispec.sampling import Sampling

__all__ = ["CacheMirror", "DraftSide", "TargetSide"]


class CacheMirror:
    """The token list a model's cache holds, kept on the coordinator's side."""

    def __init__(self) -> None:
        self.tokens: list[int] = []

    def plan(self, sequence: Sequence[int], min_feed: int) -> tuple[int, list[int]]:
        """(keep, feed) so that the model ends up holding ``sequence`` and processes at
        least its last ``min_feed`` tokens (whose logits are wanted)."""
        limit = min(len(self.tokens), len(sequence) - min_feed)
        keep = 0
        while keep < limit and self.tokens[keep] == sequence[keep]:
            keep += 1
        return keep, [int(t) for t in sequence[keep:]]

    def update(self, keep: int, fed: Sequence[int]) -> None:
        del self.tokens[keep:]
        self.tokens.extend(int(t) for t in fed)


class _Side:
    def __init__(self, model: CausalLM, sampling: Sampling) -> None:
        self.model = model
        self.sampling = sampling

    def prefill(self, tokens: Sequence[int]) -> None:
        """Empty the cache, then process ``tokens`` (may be empty)."""
        self.model.reset()
        self.model.add_rows([list(tokens)])

    def probe(self, keep: int, feed: Sequence[int]) -> None:
        """One forward of ``feed`` (logits for every fed token) after ``keep`` cached tokens,
        for timing ``--gamma auto``; the cache is rolled back afterwards."""
        self.model.rollback(keep)
        self.model.extend([list(feed)])
        self.model.rollback(keep)


class DraftSide(_Side):
    """The draft model's work: sample n tokens after a context."""

    def draft(self, keep: int, feed: Sequence[int], uniforms: Tensor, out: Tensor) -> list[int]:
        """Roll back to ``keep`` tokens, feed ``feed``, sample len(uniforms) tokens.

        Args:
            uniforms: [n] float64, one per token (inverse-CDF sampling).
            out: [>= n, V] float64; row i receives the q token i was drawn from.
        Returns:
            the n tokens; the cache then holds ``feed`` and all but the last token.
        """
        model, n = self.model, int(uniforms.shape[0])
        model.rollback(keep)
        logits = model.extend([list(feed)], num_logits=1)[0]  # [1, V]
        tokens: list[int] = []
        for i in range(n):
            q = self.sampling.probs(logits[-1], model.name).to(torch.float64)  # [V]
            out[i].copy_(q)
            tokens.append(sample_with_uniform(out[i], float(uniforms[i])))
            if i < n - 1:
                logits = model.extend([tokens[-1:]], num_logits=1)[0]
        return tokens



class TargetSide(_Side):
    """The target model's work: p after each of the last ``rows`` positions."""

    def __init__(self, model: CausalLM, sampling: Sampling) -> None:
        super().__init__(model, sampling)
        self._raw: Tensor | None = None  # [rows, V] raw logits of the last score

    def prefill(self, tokens: Sequence[int]) -> None:
        self._raw = None
        super().prefill(tokens)

    def score(self, keep: int, feed: Sequence[int], rows: int, out: Tensor) -> None:
        """Roll back to ``keep``, feed ``feed``; out[:rows] = p after its last ``rows`` tokens.

        Args:
            out: [>= rows, V] float64.
        """
        model = self.model
        model.rollback(keep)
        logits = model.extend([list(feed)], num_logits=rows)[0]  # [rows, V]
        out[:rows].copy_(self.sampling.probs(logits, model.name))
        self._raw = logits

    def nll(self, requests: Sequence[tuple[int, int]]) -> float:
        """Σ -log p_raw(token | row) over (row, token) pairs of the last :meth:`score`
        (p_raw: the unwarped target)."""
        if not requests or self._raw is None:
            return 0.0
        rows = torch.tensor([r for r, _ in requests])
        tokens = torch.tensor([t for _, t in requests], device=self._raw.device)
        logp = torch.log_softmax(self._raw[rows.to(self._raw.device)].float(), dim=-1)  # [n, V]
        return -float(logp.gather(-1, tokens[:, None]).sum())

