""":class:`NativeCausalLM`: the native decoder behind the :class:`CausalLM` interface.

The KV cache is preallocated: per layer one key and one value tensor [R, Hkv, L, D], where
slot t of row b holds the token at position t. So

* a row's length is all its state: ``rollback`` only changes lengths (no copy);
* ``extend`` writes row b's k_b new tokens at slots lengths[b] + j; shorter rows are padded
  with filler that lands beyond their new length (to be overwritten later), and attention
  masks by position (query at position p sees slots ≤ p), so filler and stale slots are
  never attended by a real token;
* ``select_rows`` copies the used slots of the rows kept (a run of consecutive rows, such as
  the one row a join keeps, is kept as a view, without copying);
* the capacity L grows geometrically when a pass needs more slots.

Cache memory is allocated uninitialized; slots below the watermark ``clean`` hold finite
values in every row (real tokens, filler, or zeros written ahead of use), which matters
because attention reads masked slots too (a masked NaN would still poison the output).
Every row's length stays ≤ ``clean``.

Logits are computed only for the positions asked for: hidden states are gathered before the
final norm and the lm_head.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from verispec.models.base import CausalLM
from verispec.models.native.model import Transformer

__all__ = ["NativeCausalLM"]

ALIGN = 64  # capacities are multiples of this many slots
#: Passes over at least this many token rows (rows × tokens) run on ``prefill_net`` when a
#: model has one: an int4 draft step costs 23 ms at 1 row and 47 ms at 4, its int8 form
#: 32 and 39 ms (0.5B draft, 2-core AVX-512 VNNI Xeon).
PREFILL_ROWS = 4


def _round_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class NativeCausalLM(CausalLM):
    """A Qwen2/Llama-family model run by :class:`Transformer` with a rollback-able KV cache."""

    def __init__(self, net: Transformer, tokenizer: Any = None, name: str = "native", *,
                 eos_token_ids: frozenset[int] = frozenset(), max_length: int | None = None,
                 precision: str = "float32", source: str | None = None,
                 prefill_net: Transformer | None = None, vocabulary: int | None = None,
                 ) -> None:
        super().__init__()
        self.source = source  # the directory it was loaded from (None: built in memory)
        # ids scored (:func:`verispec.models.native.subset_ids`; None: the whole vocabulary)
        self.vocabulary = vocabulary
        self.net = net
        # reads prompts in ``add_rows`` and runs passes over ≥ PREFILL_ROWS token rows when
        # set (an int4 draft with its int8 form, whose kernel is faster over many rows); it
        # writes ``net``'s cache, so it attends in that cache's dtype (its own net object,
        # never shared with a decoding model)
        if prefill_net is not None:
            prefill_net.attention_dtype = net.attention_dtype
        self.prefill_net = prefill_net
        self.tokenizer = tokenizer
        self.name = name
        self.vocab_size = net.config.vocab_size
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_length = max_length if max_length is not None else net.config.max_positions
        self.device = net.device
        self.precision = precision
        self.reset()

    def spawn(self) -> NativeCausalLM:
        return NativeCausalLM(self.net, self.tokenizer, self.name,
                              eos_token_ids=self.eos_token_ids, max_length=self.max_length,
                              precision=self.precision, source=self.source,
                              prefill_net=self.prefill_net, vocabulary=self.vocabulary)

    def reset(self) -> None:
        self._keys: list[Tensor] = []  # per layer [R, Hkv, L, D]
        self._values: list[Tensor] = []
        self._lengths: list[int] = []
        self._capacity = 0  # L
        self._clean = 0  # slots [0, clean) are finite in every row

    @property
    def lengths(self) -> list[int]:
        return list(self._lengths)

    @property
    def capacity(self) -> int:
        """L, cache slots per row (exposed for tests)."""
        return self._capacity

    def _reserve(self, slots: int) -> None:
        """Make the cache hold at least ``slots`` slots per row (growing geometrically)."""
        if slots <= self._capacity:
            return
        capacity = _round_up(max(slots, 2 * self._capacity))
        keys, values = self.net.new_cache(len(self._lengths), capacity)
        for new, old in zip(keys + values, self._keys + self._values, strict=True):
            new[:, :, : self._clean] = old[:, :, : self._clean]
        self._keys, self._values, self._capacity = keys, values, capacity
        self.net.rope(capacity)

    def _scrub(self, span: int) -> None:
        """Make slots [0, span) finite in every row (zeros ahead, a multiple of ALIGN)."""
        if span <= self._clean:
            return
        end = min(self._capacity, _round_up(span))
        for t in self._keys + self._values:
            t[:, :, self._clean: end].zero_()
        self._clean = end

    # -- rows ----------------------------------------------------------------------------------

    @torch.inference_mode()
    def _add_rows(self, prefixes: list[list[int]]) -> None:
        old = len(self._lengths)
        lengths = [len(p) for p in prefixes]
        clean = max(self._clean, *lengths)  # the new watermark
        capacity = _round_up(max(self._capacity, clean, 1))
        keys, values = self.net.new_cache(old + len(prefixes), capacity)
        if old:
            for new, cur in zip(keys + values, self._keys + self._values, strict=True):
                new[:old, :, : self._clean] = cur[:, :, : self._clean]
                new[:old, :, self._clean: clean].zero_()
        self.net.rope(capacity)
        net = self.prefill_net or self.net
        for r, prefix in enumerate(prefixes, start=old):  # one exact single-row prefill each
            if prefix:
                ids = torch.tensor([prefix], dtype=torch.int64, device=self.device)  # [1, k]
                step = net.step([0], [len(prefix)], None)
                net.forward(ids, step, [t[r: r + 1] for t in keys],
                            [t[r: r + 1] for t in values], logits=False)
            for t in keys + values:
                t[r, :, len(prefix): clean].zero_()
        self._keys, self._values, self._capacity = keys, values, capacity
        self._lengths += lengths
        self._clean = clean

    @torch.inference_mode()
    def _select_rows(self, indices: list[int]) -> None:
        self._lengths = [self._lengths[i] for i in indices]
        if not indices:
            self._keys, self._values, self._clean = [], [], 0
            return
        first = indices[0]
        if indices == list(range(first, first + len(indices))):  # a run of rows: views
            self._keys = [t[first: first + len(indices)] for t in self._keys]
            self._values = [t[first: first + len(indices)] for t in self._values]
            return
        used = max(self._lengths)  # copy the slots in use only
        idx = torch.tensor(indices, dtype=torch.int64, device=self.device)
        keys, values = self.net.new_cache(len(indices), self._capacity)
        for new, cur in zip(keys + values, self._keys + self._values, strict=True):
            new[:, :, :used] = cur[:, :, :used].index_select(0, idx)
        self._keys, self._values, self._clean = keys, values, used

    def _rollback(self, lengths: list[int]) -> None:
        self._lengths = list(lengths)  # stale slots are masked, then overwritten

    # -- forward -------------------------------------------------------------------------------

    @torch.inference_mode()
    def _extend(self, tokens: list[list[int]], num_logits: int) -> Tensor:
        ks = [len(t) for t in tokens]
        k = max(ks)
        self._reserve(max(self._lengths) + k)
        self._scrub(max(self._lengths) + k)
        padded = [t + [0] * (k - len(t)) for t in tokens]  # filler: token 0
        ids = torch.tensor(padded, dtype=torch.int64, device=self.device)  # [R, k]
        net = self.net
        if self.prefill_net is not None and len(tokens) * k >= PREFILL_ROWS:
            net = self.prefill_net
        step = net.step(self._lengths, ks, num_logits)
        logits = net.forward(ids, step, self._keys, self._values)  # [R n, V]
        self._lengths = [n + kb for n, kb in zip(self._lengths, ks, strict=True)]
        return logits.view(len(tokens), num_logits, -1)  # [R, n, V]
