"""Hugging Face causal LMs behind :class:`~verispec.models.base.CausalLM`.

The cache is a ``transformers.DynamicCache``: rollback is ``crop``, forking is
``batch_repeat_interleave`` and joining is ``batch_select_indices`` + ``crop``. Only the
logits that are needed are materialised (``logits_to_keep``), which matters with a
151,936-token vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from verispec.models.base import CausalLM

__all__ = ["HFCausalLM"]


class HFCausalLM(CausalLM):
    """Wraps a ``transformers`` causal LM and its tokenizer."""

    def __init__(self, model: Any, tokenizer: Any, name: str = "hf") -> None:
        super().__init__()
        from transformers import DynamicCache

        self._cache_cls = DynamicCache
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.vocab_size = int(model.config.vocab_size)
        self.max_length = getattr(model.config, "max_position_embeddings", None)
        self.device = next(model.parameters()).device
        self.eos_token_ids = frozenset(_eos_ids(model, tokenizer))
        self.reset()

    def reset(self) -> None:
        self.cache = self._cache_cls(config=self.model.config)
        self._rows = 1

    @property
    def length(self) -> int:
        return int(self.cache.get_seq_length())

    @property
    def rows(self) -> int:
        return self._rows

    @torch.inference_mode()
    def _extend(self, tokens: Tensor, num_logits: int) -> Tensor:
        out = self.model(
            input_ids=tokens.to(self.device),  # [R, k]
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=num_logits,
        )
        return out.logits[:, -num_logits:]  # [R, n, V] in the model's dtype

    def rollback(self, length: int) -> None:
        if not (0 <= length <= self.length):
            raise ValueError(f"cannot roll back to {length}; cache holds {self.length}")
        if length == 0:
            self.reset()
        elif length < self.length:
            self.cache.crop(length - self.length)  # transformers 5: a negative count removes tokens

    def fork(self, num_branches: int) -> None:
        if self._rows != 1:
            raise RuntimeError("fork() on an already forked model")
        if num_branches > 1:
            self.cache.batch_repeat_interleave(num_branches)
        self._rows = num_branches

    def join(self, branch: int, length: int) -> None:
        if self._rows > 1:
            self.cache.batch_select_indices(torch.tensor([branch], device=self.device))
        self._rows = 1
        self.rollback(length)

    def reorder_rows(self, indices: Tensor) -> None:
        self.cache.reorder_cache(indices.to(device=self.device, dtype=torch.int64))  # [R']
        self._rows = int(indices.shape[0])


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source is not None:
            ids.update(int(i) for i in source)
    return ids
