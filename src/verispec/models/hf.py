"""Hugging Face causal LMs behind :class:`~verispec.models.base.CausalLM`.

The KV cache is a :class:`~verispec.models.slots.SlotCache`, as in the native runtime: per
layer one key and one value tensor [P, Hkv, L, D], allocated once and reused; each row lives
in one of the P slots and column t of a slot holds its row's token at position t. Adding a
row prefills its slot in place, dropping and reordering rows is bookkeeping, a fork copies
the forked row's used columns into a free slot, and rollback only changes lengths.

transformers reads and writes that storage through :class:`_SlotLayer`, the cache layer it
is handed for every pass: it writes the pass's new keys and values at each row's slot and
positions and returns the attended keys and values [R, Hkv, S, D] (S = longest length + k)
— views of the cache when the rows sit in a run of slots in row order, a gathered copy
otherwise (what ``DynamicCache`` pays on every pass, when it concatenates).

* **Uniform** passes (every row of one length, receiving the same number of tokens —
  always true for a single row) are the plain ``model(input_ids, past_key_values=...)``
  call, with transformers' own mask and positions.
* **Ragged** passes pad shorter blocks with filler at the end (written beyond the row's new
  length, never attended by a real token) and pass each row's position ids and a 4-D
  additive mask by position (query at position p sees positions ≤ p).

A pass first zeroes ahead the columns of its rows' slots that it attends and that were
never written (attention reads masked columns too). Only the logits that are needed are computed (``logits_to_keep``), which
matters with a 151,936-token vocabulary. Models with sliding-window or other non-full
attention layers run one row at most (their layers see the whole history, masked).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

from verispec.models.base import CausalLM
from verispec.models.slots import Layout, SlotCache, write_rows

__all__ = ["HFCausalLM"]


@dataclass
class _Pass:
    """Where one forward pass reads and writes the cache."""

    layout: Layout  # the slot of each row
    past: int  # tokens cached per row before the pass (the longest, for ragged rows)
    start: int | None  # rows of one length: new tokens at positions start..start+k-1, or
    positions: Tensor | None  # [R, k] the position of each token (ragged rows)
    span: int  # S: positions attended (longest length + k)


class _SlotLayer(CacheLayerMixin):
    """One attention layer's cache as transformers sees it: the layer ``index`` of the
    owner's :class:`SlotCache`, read and written where the current pass says."""

    is_sliding = False
    supports_early_init = False

    def __init__(self, owner: HFCausalLM, index: int) -> None:
        super().__init__()
        self.owner = owner
        self.index = index
        self.is_initialized = True

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        """Nothing to do: the storage is the owner's."""

    def get_seq_length(self) -> int:
        return self.owner._pass.past

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner._pass.past + query_length, 0  # (kv length, kv offset)

    def get_max_length(self) -> int:
        return -1

    def update(self, key_states: Tensor, value_states: Tensor, *args: Any,
               **kwargs: Any) -> tuple[Tensor, Tensor]:
        """Store key/value states [R, Hkv, k, D]; return the attended [R, Hkv, S, D]."""
        cache, plan = self.owner.cache, self.owner._pass
        keys, values = cache.keys[self.index], cache.values[self.index]
        if key_states.shape[1::2] != keys.shape[1::2] or \
                value_states.shape[1::2] != values.shape[1::2]:
            raise ValueError(f"{self.owner.name}: layer {self.index} caches keys "
                             f"{tuple(key_states.shape)}, the slot cache holds "
                             f"{tuple(keys.shape)} per slot (an unsupported attention layout)")
        write_rows(keys, key_states.transpose(1, 2), plan.layout, plan.start, plan.positions)
        write_rows(values, value_states.transpose(1, 2), plan.layout, plan.start, plan.positions)
        return plan.layout.read(keys, plan.span), plan.layout.read(values, plan.span)


class HFCausalLM(CausalLM):
    """Wraps a ``transformers`` causal LM and its tokenizer."""

    def __init__(self, model: Any, tokenizer: Any, name: str = "hf", *,
                 eos_token_ids: frozenset[int] | None = None, max_length: int | None = None,
                 precision: str | None = None) -> None:
        super().__init__()
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        config = model.config
        self.vocab_size = int(config.vocab_size)
        self.max_length = max_length if max_length is not None else getattr(
            config, "max_position_embeddings", None)
        param = next(model.parameters())
        self.device = param.device
        self.dtype = param.dtype
        self.precision = precision or str(param.dtype).removeprefix("torch.")
        self.eos_token_ids = eos_token_ids if eos_token_ids is not None else frozenset(
            _eos_ids(model, tokenizer))
        self._sliding = bool(getattr(config, "use_sliding_window", False)) or any(
            t != "full_attention" for t in (getattr(config, "layer_types", None) or []))
        self._shape = _kv_shape(config)  # (layers, kv heads, head dim)
        self._kv = Cache(layers=[_SlotLayer(self, i) for i in range(self._shape[0])])
        self._pass = _Pass(Layout.of(None, 0, self.device), 0, 0, None, 0)
        self.cache = SlotCache(self._new_cache)
        self.reset()

    def spawn(self) -> HFCausalLM:
        return HFCausalLM(self.model, self.tokenizer, self.name, eos_token_ids=self.eos_token_ids,
                          max_length=self.max_length, precision=self.precision)

    @property
    def weights_key(self) -> int:
        return id(self.model)

    def reset(self) -> None:
        self.cache.reset()
        self._lengths: list[int] = []

    def reserve(self, rows: int) -> None:
        self.cache.pool.reserve(rows)

    def _new_cache(self, slots: int, capacity: int) -> tuple[list[Tensor], list[Tensor]]:
        layers, heads, dim = self._shape
        shape = (slots, heads, capacity, dim)  # [P, Hkv, L, D]
        new = [torch.empty(shape, dtype=self.dtype, device=self.device) for _ in range(2 * layers)]
        return new[:layers], new[layers:]

    @property
    def lengths(self) -> list[int]:
        return list(self._lengths)

    @property
    def slots(self) -> list[int]:
        return list(self.cache.slots)

    # -- rows ----------------------------------------------------------------------------------

    @torch.inference_mode()
    def _add_rows(self, prefixes: list[list[int]]) -> None:
        if self._sliding and self.rows + len(prefixes) > 1:
            raise ValueError(f"{self.name}: more than one row needs a full-attention model "
                             "(this one has sliding-window layers)")
        slots = self.cache.admit([len(p) for p in prefixes])
        for s, prefix in zip(slots, prefixes, strict=True):  # one unpadded prefill per row
            if prefix:
                self._forward([prefix], [0], [s], keep=1)
        self._lengths += [len(p) for p in prefixes]

    def _select_rows(self, indices: list[int]) -> None:
        if self._sliding and len(indices) > 1:
            raise ValueError(f"{self.name}: more than one row needs a full-attention model "
                             "(this one has sliding-window layers)")
        self.cache.select(indices, self._lengths)
        self._lengths = [self._lengths[i] for i in indices]

    def _rollback(self, lengths: list[int]) -> None:
        self._lengths = list(lengths)  # stale positions are masked, then overwritten

    # -- forward -------------------------------------------------------------------------------

    @torch.inference_mode()
    def _extend(self, tokens: list[list[int]], num_logits: int) -> Tensor:
        ks = [len(t) for t in tokens]
        k_max = max(ks)
        # Row b's wanted logits sit at columns k_b - n_b .. k_b - 1; keep the span covering all.
        firsts = [k - min(num_logits, k) for k in ks]
        keep = k_max - min(firsts)
        logits = self._forward(tokens, self._lengths, self.cache.slots, keep)  # [R, keep, V]
        self._lengths = [n + k for n, k in zip(self._lengths, ks, strict=True)]
        offset = k_max - keep
        if all(f == firsts[0] for f in firsts) and keep == num_logits:
            return logits
        cols = torch.tensor([[min(f - offset + j, keep - 1) for j in range(num_logits)]
                             for f in firsts], device=logits.device)  # [R, n]
        return logits.gather(1, cols[..., None].expand(-1, -1, logits.shape[-1]))  # [R, n, V]

    def _forward(self, tokens: list[list[int]], lengths: list[int], slots: list[int],
                 keep: int) -> Tensor:
        """One pass of rows in ``slots`` holding ``lengths`` tokens, reading ``tokens`` (left
        aligned, filler 0): logits [R, keep, V] of the last ``keep`` columns."""
        ks = [len(t) for t in tokens]
        rows, k = len(tokens), max(ks)
        span = max(lengths) + k
        self.cache.reserve(span)
        self.cache.scrub(slots, span)
        ids = torch.tensor([t + [0] * (k - len(t)) for t in tokens], dtype=torch.int64,
                           device=self.device)  # [R, k]
        layout = Layout.of(slots, rows, self.device)
        if min(lengths) == max(lengths) and min(ks) == k:  # the plain call
            self._pass = _Pass(layout, lengths[0], lengths[0], None, span)
            out = self.model(input_ids=ids, past_key_values=self._kv, use_cache=True,
                             logits_to_keep=keep)
            return out.logits[:, -keep:]
        base = torch.tensor(lengths, dtype=torch.int64, device=self.device)  # [R]
        positions = base[:, None] + torch.arange(k, device=self.device)  # [R, k]
        allowed = torch.arange(span, device=self.device)[None, None] <= positions[:, :, None]
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)  # [R, k, S]
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        self._pass = _Pass(layout, max(lengths), None, positions, span)
        if self.max_length is not None:  # filler may run past the window; never read
            positions = positions.clamp(max=self.max_length - 1)
        out = self.model(input_ids=ids, attention_mask=mask[:, None], position_ids=positions,
                         past_key_values=self._kv, use_cache=True, logits_to_keep=keep)
        return out.logits[:, -keep:]


def _kv_shape(config: Any) -> tuple[int, int, int]:
    """(layers, key/value heads, head dim) of a transformers config."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return int(text.num_hidden_layers), kv_heads, int(head_dim)


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source is not None:
            ids.update(int(i) for i in source)
    return ids
