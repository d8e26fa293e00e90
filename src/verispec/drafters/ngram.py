"""Prompt-lookup drafter: copy what followed the latest earlier match of the context's tail.

Model-free and deterministic: q is one-hot on each proposed token, so verification with a
lossless verifier stays exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from verispec.drafters.base import Draft, Drafter, DraftRow

__all__ = ["NgramDrafter"]


class NgramDrafter(Drafter):
    """Finds the most recent earlier occurrence of the last n context tokens
    (n = ``max_ngram`` down to ``min_ngram``) and proposes the tokens that followed it.
    Proposes nothing (γ = 0, a plain target step) when there is no match."""

    def __init__(self, vocab_size: int, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not (1 <= min_ngram <= max_ngram):
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.vocab_size = vocab_size
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def lookup(self, context: Sequence[int], gamma: int) -> list[int]:
        ctx = list(context)
        for n in range(min(self.max_ngram, len(ctx) - 1), self.min_ngram - 1, -1):
            tail = ctx[-n:]
            for start in range(len(ctx) - n - 1, -1, -1):  # latest match first
                if ctx[start : start + n] == tail:
                    return ctx[start + n : start + n + gamma]
        return []

    def propose(self, rows: Sequence[DraftRow], gammas: Sequence[int]) -> list[Draft]:
        drafts = []
        for r, g in zip(rows, gammas, strict=True):
            if r.num_drafts != 1 or r.with_next:
                raise ValueError("the n-gram drafter proposes a single deterministic draft only")
            proposal = self.lookup(r.context, g) if g > 0 else []
            tokens = torch.tensor([proposal], dtype=torch.int64).reshape(1, len(proposal))
            probs = None
            if not r.matching:  # q is one-hot on each proposed token
                probs = torch.zeros((1, len(proposal), self.vocab_size), dtype=torch.float64)
                probs.scatter_(-1, tokens.unsqueeze(-1), 1.0)
            drafts.append(Draft(tokens=tokens, probs=probs))
        return drafts

    def feedback(self, rows: Sequence[DraftRow], accepted: Sequence[int],
                 branches: Sequence[int]) -> None:
        return None
