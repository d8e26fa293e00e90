"""Draft-model drafter: autoregressive sampling from q with the run's warp."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from verispec.drafters.base import Draft, Drafter
from verispec.models.base import CausalLM
from verispec.sampling import Sampling, sample_from

__all__ = ["ModelDrafter"]


class ModelDrafter(Drafter):
    """Samples X_i ~ q(· | context, X_<i) and keeps each q exactly as sampled.

    ``stop_below`` (optional, in (0, 1]) ends the draft early, after at least one token, when
    the draft model's own confidence in its next token, max_x q₁(x | context, X^i) under its
    unwarped (temperature 1) distribution, falls below the threshold; a draft the model itself
    doubts is likely rejected, and every draft forward costs time. The draft length is then a
    stopping time of the draft prefix alone, which keeps token and block verification
    lossless (checked by exact enumeration in the tests).

    The draft model's cache is kept consistent with the context: after ``feedback`` it holds
    the longest prefix of the new context it has already processed, and the next
    ``propose`` feeds the rest (the next token, plus X_γ when the whole block was accepted)
    in one forward pass.
    """

    def __init__(self, model: CausalLM, sampling: Sampling, *,
                 stop_below: float | None = None) -> None:
        if stop_below is not None and not 0.0 < stop_below <= 1.0:
            raise ValueError(f"draft stop threshold must be in (0, 1], got {stop_below}")
        self.model = model
        self.sampling = sampling
        self.stop_below = stop_below
        self._base = 0
        self._fed = 0  # draft tokens fed to the model in the last proposal

    @property
    def forward_calls(self) -> int:
        return self.model.forward_calls

    def begin(self, prompt: Sequence[int]) -> None:
        self.model.reset()

    def propose(
        self,
        context: Sequence[int],
        gamma: int,
        generator: torch.Generator,
        *,
        num_drafts: int = 1,
        with_next: bool = False,
    ) -> Draft:
        model, m = self.model, num_drafts
        tail = torch.tensor(list(context[model.length :]), dtype=torch.int64, device=model.device)
        logits = model.extend(tail, num_logits=1)  # [1, V]
        q = self.sampling.probs(logits, model.name).expand(m, -1)  # [M, V]
        if m > 1:
            model.fork(m)
        tokens, probs = [], []
        fed = 0  # draft tokens fed back into the model
        for i in range(gamma):
            x = sample_from(q, generator)  # [M]
            tokens.append(x)
            probs.append(q)
            if i < gamma - 1 or with_next:
                out = model.extend(x.unsqueeze(-1) if m > 1 else x, num_logits=1)
                fed += 1
                logits = out[:, 0] if m > 1 else out  # [M, V]
                q = self.sampling.probs(logits, model.name)  # [M, V]
                if i < gamma - 1 and m == 1 and self._doubts(logits):
                    break  # the draft doubts its next token: stop here (X^{i+1} is the draft)
        self._base = len(context)
        self._fed = fed
        return Draft(
            tokens=torch.stack(tokens, dim=1) if tokens else torch.empty((m, 0), dtype=torch.int64),
            probs=torch.stack(probs, dim=1) if probs else q.new_empty((m, 0, model.vocab_size)),
            next_probs=q if with_next else None,
        )

    def _doubts(self, logits: torch.Tensor) -> bool:
        """True if max_x q₁(x) < stop_below for the raw next-token logits [1, V]."""
        if self.stop_below is None:
            return False
        return bool(torch.softmax(logits[0].float(), -1).max() < self.stop_below)

    def feedback(self, context: Sequence[int], num_accepted: int, branch: int = 0) -> None:
        valid = self._base + min(num_accepted, self._fed)
        if self.model.rows > 1:
            self.model.join(branch, valid)
        else:
            self.model.rollback(min(valid, self.model.length))
