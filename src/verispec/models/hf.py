"""Hugging Face causal LMs behind :class:`~verispec.models.base.CausalLM`.

One ``transformers.DynamicCache`` holds every row. Layout: the cache has L physical slots
per row; ``_valid`` [R, L] (on the host) marks which slots hold row b's tokens, in order.

* **Dense** (every row holds exactly the L slots — always true for a single row): a forward
  pass is the plain ``model(input_ids, past_key_values=cache)`` call, with no mask and the
  default positions, and rollback is a crop.
* **Ragged** (rows of different lengths): new tokens are appended at slot L for every row,
  each row's position ids continue from its own length, and the attention mask hides the
  holes. Rollback clears validity bits; columns no row uses any more are cropped, and when
  holes waste more than a quarter of the cache the valid slots are packed to the right by
  one gather per layer. Attention is invariant to the order of past keys (RoPE positions are
  baked in at write time), so packing changes nothing but the memory used.

Only the logits that are needed are computed (``logits_to_keep``), which matters with a
151,936-token vocabulary. Sliding-window models are refused for more than one row.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from verispec.models.base import CausalLM

__all__ = ["HFCausalLM"]

PACK_WASTE = 4  # pack the cache when holes take more than 1/PACK_WASTE of its slots
PACK_MIN_SLOTS = 8  # never pack a cache shorter than this


class HFCausalLM(CausalLM):
    """Wraps a ``transformers`` causal LM and its tokenizer."""

    def __init__(self, model: Any, tokenizer: Any, name: str = "hf", *,
                 eos_token_ids: frozenset[int] | None = None, max_length: int | None = None,
                 precision: str | None = None) -> None:
        super().__init__()
        from transformers import DynamicCache

        self._cache_cls = DynamicCache
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        config = model.config
        self.vocab_size = int(config.vocab_size)
        self.max_length = max_length if max_length is not None else getattr(
            config, "max_position_embeddings", None)
        param = next(model.parameters())
        self.device = param.device
        self.precision = precision or str(param.dtype).removeprefix("torch.")
        self.eos_token_ids = eos_token_ids if eos_token_ids is not None else frozenset(
            _eos_ids(model, tokenizer))
        self._sliding = bool(getattr(config, "use_sliding_window", False)) or any(
            t != "full_attention" for t in (getattr(config, "layer_types", None) or []))
        self.packs = 0  # times the cache was packed (see the module docstring)
        self.reset()

    def spawn(self) -> HFCausalLM:
        return HFCausalLM(self.model, self.tokenizer, self.name, eos_token_ids=self.eos_token_ids,
                          max_length=self.max_length, precision=self.precision)

    def reset(self) -> None:
        self.cache = self._cache_cls(config=self.model.config)
        self._valid = torch.zeros((0, 0), dtype=torch.bool)  # [R, L] on the host
        self._lengths: list[int] = []

    @property
    def lengths(self) -> list[int]:
        return list(self._lengths)

    @property
    def physical_length(self) -> int:
        """L, slots per row in the cache (≥ max(lengths)); exposed for tests."""
        return int(self._valid.shape[1])

    def _dense(self) -> bool:
        return all(n == self.physical_length for n in self._lengths)

    def _layers(self) -> list[Any]:
        layers = list(getattr(self.cache, "layers", []))
        if any(not getattr(layer, "is_initialized", False) for layer in layers):
            return []
        return layers

    def _set_kv(self, kv: list[tuple[Tensor, Tensor]]) -> None:
        """Replace the cache contents with per-layer (keys, values) [R, H, L, D]."""
        cache = self._cache_cls(config=self.model.config)
        for i, (k, v) in enumerate(kv):
            cache.update(k, v, i)
        self.cache = cache

    # -- adding rows -------------------------------------------------------------------------

    @torch.inference_mode()
    def _add_rows(self, prefixes: list[list[int]]) -> None:
        if self._sliding and self.rows + len(prefixes) > 1:
            raise ValueError(f"{self.name}: more than one row needs a full-attention model "
                             "(this one has sliding-window layers)")
        if not self.rows and len(prefixes) == 1:  # the common case: adopt the prefill's cache
            self._prefill_into(self.cache, prefixes[0])
            self._valid = torch.ones((1, len(prefixes[0])), dtype=torch.bool)
            self._lengths = [len(prefixes[0])]
            return
        # parts: (per-layer (keys, values) [r, H, n, D] or None if nothing cached, r, valid [r, n])
        parts: list[tuple[list[tuple[Tensor, Tensor]] | None, int, Tensor]] = []
        if self.rows:
            parts.append(([(lay.keys, lay.values) for lay in self._layers()] or None,
                          self.rows, self._valid))
        for prefix in prefixes:  # one unpadded prefill per row, exactly as a single row does
            cache = self._cache_cls(config=self.model.config)
            self._prefill_into(cache, prefix)
            ones = torch.ones((1, len(prefix)), dtype=torch.bool)
            parts.append(([(lay.keys, lay.values) for lay in cache.layers] if prefix else None,
                          1, ones))
        length = max(int(v.shape[1]) for _, _, v in parts)
        pad = torch.nn.functional.pad
        self._valid = torch.cat([pad(v, (0, length - int(v.shape[1]))) for _, _, v in parts])
        self._lengths = [int(n) for n in self._valid.sum(dim=1).tolist()]
        ref = next((kv for kv, _, _ in parts if kv is not None), None)
        if ref is None or length == 0:
            self._set_kv([])
            return
        merged = []
        for layer, (k_ref, v_ref) in enumerate(ref):
            ks, vs = [], []
            for kv, rows, _ in parts:
                if kv is None:  # nothing cached yet: zeros, all masked
                    ks.append(k_ref.new_zeros((rows, k_ref.shape[1], length, k_ref.shape[3])))
                    vs.append(v_ref.new_zeros((rows, v_ref.shape[1], length, v_ref.shape[3])))
                else:
                    k, v = kv[layer]
                    ks.append(pad(k, (0, 0, 0, length - k.shape[2])))
                    vs.append(pad(v, (0, 0, 0, length - v.shape[2])))
            merged.append((torch.cat(ks), torch.cat(vs)))
        self._set_kv(merged)

    def _prefill_into(self, cache: Any, prefix: list[int]) -> None:
        if not prefix:
            return
        ids = torch.tensor([prefix], dtype=torch.int64, device=self.device)
        self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)

    # -- forward -----------------------------------------------------------------------------

    @torch.inference_mode()
    def _extend(self, tokens: list[list[int]], num_logits: int) -> Tensor:
        ks = [len(t) for t in tokens]
        if self._dense() and min(ks) == max(ks):  # no holes, no padding: the plain call
            ids = torch.tensor(tokens, dtype=torch.int64, device=self.device)  # [R, k]
            if self.physical_length == 0:
                self.cache = self._cache_cls(config=self.model.config)
            out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True,
                             logits_to_keep=num_logits)
            self._valid = torch.ones((len(tokens), self.physical_length + ks[0]), dtype=torch.bool)
            self._lengths = [n + ks[0] for n in self._lengths]
            return out.logits[:, -num_logits:]  # [R, n, V]
        return self._extend_ragged(tokens, ks, num_logits)

    def _extend_ragged(self, tokens: list[list[int]], ks: list[int], num_logits: int) -> Tensor:
        rows, k_max = len(tokens), max(ks)
        ids = torch.zeros((rows, k_max), dtype=torch.int64)  # [R, k], left aligned
        new_valid = torch.zeros((rows, k_max), dtype=torch.bool)
        for b, t in enumerate(tokens):
            ids[b, : len(t)] = torch.tensor(t, dtype=torch.int64)
            new_valid[b, : len(t)] = True
        lengths = torch.tensor(self._lengths, dtype=torch.int64)  # [R]
        positions = lengths[:, None] + torch.arange(k_max)  # [R, k]
        if self.max_length is not None:  # filler slots may run past the window; never read
            positions = positions.clamp(max=self.max_length - 1)
        mask = torch.cat([self._valid, torch.ones_like(new_valid)], dim=1)  # [R, L + k]
        if self.physical_length == 0:
            self.cache = self._cache_cls(config=self.model.config)
        # Row b's wanted logits sit at columns k_b - n_b .. k_b - 1; keep the span covering all.
        firsts = [k - min(num_logits, k) for k in ks]
        keep = k_max - min(firsts)
        out = self.model(input_ids=ids.to(self.device),
                         attention_mask=mask.to(self.device, torch.int64),
                         position_ids=positions.to(self.device), past_key_values=self.cache,
                         use_cache=True, logits_to_keep=keep)
        logits = out.logits[:, -keep:]  # [R, keep, V]
        self._valid = torch.cat([self._valid, new_valid], dim=1)  # filler slots become holes
        self._lengths = [n + k for n, k in zip(self._lengths, ks, strict=True)]
        self._tidy()
        offset = k_max - keep
        if all(f == firsts[0] for f in firsts) and keep == num_logits:
            return logits
        cols = torch.tensor([[min(f - offset + j, keep - 1) for j in range(num_logits)]
                             for f in firsts], device=logits.device)  # [R, n]
        return logits.gather(1, cols[..., None].expand(-1, -1, logits.shape[-1]))  # [R, n, V]

    # -- rollback and rows -------------------------------------------------------------------

    @torch.inference_mode()
    def _rollback(self, lengths: list[int]) -> None:
        if self._dense() and min(lengths) == max(lengths):
            cut = self.physical_length - lengths[0]
            if lengths[0] == 0:
                self.reset()
                self._valid = torch.zeros((len(lengths), 0), dtype=torch.bool)
                self._lengths = [0] * len(lengths)
                return
            self.cache.crop(-cut)  # transformers 5: a negative count removes tokens
            self._valid = self._valid[:, : lengths[0]]
            self._lengths = list(lengths)
            return
        keep = torch.tensor(lengths, dtype=torch.int64)[:, None]  # [R, 1]
        self._valid = self._valid & (torch.cumsum(self._valid.to(torch.int64), dim=1) <= keep)
        self._lengths = list(lengths)
        self._tidy()

    @torch.inference_mode()
    def _select_rows(self, indices: list[int]) -> None:
        if self._sliding and len(indices) > 1:
            raise ValueError(f"{self.name}: more than one row needs a full-attention model "
                             "(this one has sliding-window layers)")
        self._valid = self._valid[indices]
        self._lengths = [self._lengths[i] for i in indices]
        if not indices:
            self.reset()
            return
        idx = torch.tensor(indices, dtype=torch.int64, device=self.device)
        for layer in self._layers():
            layer.keys, layer.values = layer.keys[idx], layer.values[idx]
        self._tidy()

    def _tidy(self) -> None:
        """Crop columns no row uses; pack rows when holes waste over a quarter of the cache."""
        used = self._valid.any(dim=0).nonzero()
        end = int(used.max()) + 1 if used.numel() else 0
        if end < self.physical_length:
            self._valid = self._valid[:, :end]
            if end == 0:
                self._set_kv([])
            else:
                for layer in self._layers():
                    layer.keys, layer.values = layer.keys[:, :, :end], layer.values[:, :, :end]
        longest = max(self._lengths, default=0)
        phys = self.physical_length
        if phys > PACK_MIN_SLOTS and PACK_WASTE * (phys - longest) > phys:
            self._pack(longest)

    def _pack(self, length: int) -> None:
        """Move row b's valid slots to the last n_b of ``length`` columns (one gather per layer)."""
        rows, phys = self._valid.shape
        n = self._valid.sum(dim=1)  # [R]
        rank = torch.cumsum(self._valid.to(torch.int64), dim=1) - 1  # [R, L] order among valid
        dest = rank + (length - n)[:, None]  # [R, L] new column of each valid slot
        src = torch.zeros((rows, length), dtype=torch.int64)  # [R, L']
        cols = torch.arange(phys).expand(rows, phys)
        flat_b, flat_c = self._valid.nonzero(as_tuple=True)
        src[flat_b, dest[flat_b, flat_c]] = cols[flat_b, flat_c]
        self._valid = torch.arange(length)[None] >= (length - n)[:, None]
        idx = src.to(self.device)[:, None, :, None]  # [R, 1, L', 1]
        for layer in self._layers():
            layer.keys = layer.keys.gather(
                2, idx.expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3]))
            layer.values = layer.values.gather(
                2, idx.expand(-1, layer.values.shape[1], -1, layer.values.shape[3]))
        self.packs += 1


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source is not None:
            ids.update(int(i) for i in source)
    return ids
