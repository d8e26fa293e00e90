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

    The draft model's cache is kept consistent with the context: after ``feedback`` it holds
    the longest prefix of the new context it has already processed, and the next
    ``propose`` feeds the rest (the next token, plus X_γ when the whole block was accepted)
    in one forward pass.
    """

    def __init__(self, model: CausalLM, sampling: Sampling) -> None:
        self.model = model
        self.sampling = sampling
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
        for i in range(gamma):
            x = sample_from(q, generator)  # [M]
            tokens.append(x)
            probs.append(q)
            if i < gamma - 1 or with_next:
                out = model.extend(x.unsqueeze(-1) if m > 1 else x, num_logits=1)
                q = self.sampling.probs(out[:, 0] if m > 1 else out, model.name)  # [M, V]
        self._base = len(context)
        self._fed = gamma if with_next else max(gamma - 1, 0)
        return Draft(
            tokens=torch.stack(tokens, dim=1) if tokens else torch.empty((m, 0), dtype=torch.int64),
            probs=torch.stack(probs, dim=1) if probs else q.new_empty((m, 0, model.vocab_size)),
            next_probs=q if with_next else None,
        )

    def feedback(self, context: Sequence[int], num_accepted: int, branch: int = 0) -> None:
        valid = self._base + min(num_accepted, self._fed)
        if self.model.rows > 1:
            self.model.join(branch, valid)
        else:
            self.model.rollback(min(valid, self.model.length))
