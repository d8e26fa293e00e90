"""Batched models: many independent sequences (rows) of different lengths in one forward pass.

The single-sequence :class:`~verispec.models.base.CausalLM` stays as it is; a
:class:`BatchedLM` is its counterpart for :mod:`verispec.engine.batch`. Every row has its own
length, and everything ragged is handled here, not in the engine:

* ``add_rows(prefixes)`` — admit new rows (prefilled with their own tokens) at the end;
* ``extend(tokens)`` — append k_b ≥ 0 tokens to row b (ragged) in one forward pass and return
  logits [R, k_max, V]; entry [b, j] is the distribution of the token after row b's
  j-th new token, meaningful for j < k_b only (the rest is finite filler);
* ``rollback(lengths)`` — truncate every row to its own length;
* ``select_rows(indices)`` — keep, reorder or replicate rows (freeing finished slots, forking a
  row into M drafts, joining back to the kept draft).

Implementations: :class:`BatchedTableLM` (the exact toy tables, float64) and
:class:`BatchedHFLM` (Hugging Face models with one ``DynamicCache`` for all rows). Use
:func:`as_batched` to get the batched counterpart of a loaded single-sequence model.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from verispec.models.base import CausalLM, ContextTooLongError
from verispec.models.toy import TableLM

__all__ = ["BatchedHFLM", "BatchedLM", "BatchedTableLM", "as_batched"]


class BatchedLM(ABC):
    """A causal LM holding R independent rows, each with its own cached length.

    Attributes:
        vocab_size, eos_token_ids, max_length, device, name: as for :class:`CausalLM`.
        tokenizer: the wrapped model's tokenizer (or None).
        forward_calls: number of forward passes (prefills included).
    """

    vocab_size: int
    eos_token_ids: frozenset[int]
    max_length: int | None
    device: torch.device
    name: str
    tokenizer: Any

    def __init__(self) -> None:
        self.forward_calls = 0

    @property
    @abstractmethod
    def lengths(self) -> list[int]:
        """Tokens cached per row ([R] Python ints)."""

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @abstractmethod
    def reset(self) -> None:
        """Drop every row."""

    @abstractmethod
    def _add_rows(self, prefixes: list[list[int]]) -> None: ...

    @abstractmethod
    def _extend(self, tokens: list[list[int]], k_max: int) -> Tensor: ...

    @abstractmethod
    def _rollback(self, lengths: list[int]) -> None: ...

    @abstractmethod
    def select_rows(self, indices: Sequence[int]) -> None:
        """New row r becomes a copy of old row ``indices[r]`` (rows may repeat or be dropped)."""

    def add_rows(self, prefixes: Sequence[Sequence[int]]) -> None:
        """Append one row per prefix, with the prefix prefilled (a prefix may be empty)."""
        rows = [self._check_tokens(p) for p in prefixes]
        for p in rows:
            self._check_room(len(p), 0)
        if rows:
            self._add_rows(rows)

    def extend(self, tokens: Sequence[Sequence[int]]) -> Tensor:
        """Append ``tokens[b]`` (k_b tokens, possibly none) to every row b in one pass.

        Returns:
            [R, k_max, V] logits; [b, j] follows row b's j-th new token (valid for j < k_b).
        """
        if len(tokens) != self.rows:
            raise ValueError(f"{self.name}: got tokens for {len(tokens)} rows, batch has {self.rows}")
        rows = [self._check_tokens(t) for t in tokens]
        k_max = max((len(t) for t in rows), default=0)
        if k_max == 0:
            raise ValueError("extend needs at least one token in some row")
        for n, t in zip(self.lengths, rows, strict=True):
            self._check_room(n, len(t))
        self.forward_calls += 1
        return self._extend(rows, k_max)

    def rollback(self, lengths: Sequence[int]) -> None:
        """Truncate row b to its first ``lengths[b]`` tokens."""
        now = self.lengths
        if len(lengths) != len(now):
            raise ValueError(f"{self.name}: {len(lengths)} lengths for {len(now)} rows")
        new = [int(n) for n in lengths]
        if any(not (0 <= n <= c) for n, c in zip(new, now, strict=True)):
            raise ValueError(f"cannot roll back to {new}; rows hold {now}")
        if new != now:
            self._rollback(new)

    def _check_tokens(self, tokens: Sequence[int]) -> list[int]:
        out = [int(t) for t in tokens]
        if any(not (0 <= t < self.vocab_size) for t in out):
            raise ValueError(f"{self.name}: token id outside [0, {self.vocab_size})")
        return out

    def _check_room(self, cached: int, new: int) -> None:
        if self.max_length is not None and cached + new > self.max_length:
            raise ContextTooLongError(
                f"{self.name}: {cached} cached + {new} new tokens exceed the context window of "
                f"{self.max_length} tokens"
            )


class BatchedTableLM(BatchedLM):
    """Batched view of an exact toy :class:`~verispec.models.toy.TableLM` (float64 log-probs)."""

    def __init__(self, table: TableLM) -> None:
        super().__init__()
        self.table = table
        self.vocab_size = table.vocab_size
        self.eos_token_ids = table.eos_token_ids
        self.max_length = table.max_length
        self.device = table.device
        self.name = table.name
        self.tokenizer = getattr(table, "tokenizer", None)
        self._rows: list[list[int]] = []

    @property
    def lengths(self) -> list[int]:
        return [len(r) for r in self._rows]

    def reset(self) -> None:
        self._rows = []

    def _add_rows(self, prefixes: list[list[int]]) -> None:
        self._rows.extend(list(p) for p in prefixes)
        if any(prefixes):
            self.forward_calls += 1

    def _extend(self, tokens: list[list[int]], k_max: int) -> Tensor:
        out = []
        for row, new in zip(self._rows, tokens, strict=True):
            row.extend(new)
            n = len(row)
            dists = [self.table.next_probs(tuple(row[:end])) for end in range(n - len(new) + 1, n + 1)]
            filler = dists[-1] if dists else torch.full((self.vocab_size,), 1.0 / self.vocab_size,
                                                        dtype=torch.float64)
            dists += [filler] * (k_max - len(new))
            out.append(torch.stack(dists))
        return torch.stack(out).log()  # [R, k_max, V] float64, -inf where p = 0

    def _rollback(self, lengths: list[int]) -> None:
        for row, n in zip(self._rows, lengths, strict=True):
            del row[n:]

    def select_rows(self, indices: Sequence[int]) -> None:
        self._rows = [list(self._rows[int(i)]) for i in indices]


class BatchedHFLM(BatchedLM):
    """A Hugging Face causal LM with one ``DynamicCache`` shared by all rows.

    Layout: the cache has L physical slots per row; ``_valid`` [R, L] marks which slots hold
    row b's tokens (in order). Rows differ in length, so the rest are masked holes: new
    tokens are appended at slot L for every row, each row's position ids continue from its
    own length, and the attention mask hides the holes. Rollback only clears validity bits;
    columns that no row uses any more are cropped, and when holes waste more than a quarter
    of the cache the valid slots are packed to the right by one gather per layer. Attention
    is invariant to the order of past keys (RoPE positions are baked in at write time), so
    packing changes nothing but the memory used. Sliding-window layers are refused.
    """

    def __init__(self, model: Any, tokenizer: Any, *, name: str = "hf",
                 eos_token_ids: frozenset[int] = frozenset(), max_length: int | None = None) -> None:
        super().__init__()
        from transformers import DynamicCache

        self._cache_cls = DynamicCache
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.vocab_size = int(model.config.vocab_size)
        self.max_length = max_length
        self.device = next(model.parameters()).device
        self.eos_token_ids = eos_token_ids
        self.packs = 0  # times the cache was packed (see the class docstring)
        if getattr(model.config, "use_sliding_window", False) or any(
            t != "full_attention" for t in (getattr(model.config, "layer_types", None) or [])
        ):
            raise ValueError(f"{name}: batched decoding supports full-attention models only "
                             "(this one has sliding-window layers)")
        self.reset()

    @classmethod
    def from_causal_lm(cls, lm: Any) -> BatchedHFLM:
        """The batched counterpart of an :class:`~verispec.models.hf.HFCausalLM` (same weights)."""
        return cls(lm.model, lm.tokenizer, name=lm.name, eos_token_ids=lm.eos_token_ids,
                   max_length=lm.max_length)

    def reset(self) -> None:
        self.cache = self._cache_cls(config=self.model.config)
        self._valid = torch.zeros((0, 0), dtype=torch.bool, device=self.device)  # [R, L]

    @property
    def lengths(self) -> list[int]:
        return self._valid.sum(dim=1).tolist()

    @property
    def physical_length(self) -> int:
        """L, slots per row in the cache (≥ max(lengths)); exposed for tests."""
        return int(self._valid.shape[1])

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

    @torch.inference_mode()
    def _add_rows(self, prefixes: list[list[int]]) -> None:
        # parts: (per-layer (keys, values) [r, H, n, D] or None if nothing is cached, r, valid [r, n])
        parts: list[tuple[list[tuple[Tensor, Tensor]] | None, int, Tensor]] = []
        if self.rows:
            parts.append(([(lay.keys, lay.values) for lay in self._layers()] or None,
                          self.rows, self._valid))
        for prefix in prefixes:  # one unpadded prefill per row, exactly as the single model does
            ones = torch.ones((1, len(prefix)), dtype=torch.bool, device=self.device)
            if not prefix:
                parts.append((None, 1, ones))
                continue
            cache = self._cache_cls(config=self.model.config)
            ids = torch.tensor([prefix], dtype=torch.int64, device=self.device)
            self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            self.forward_calls += 1
            parts.append(([(lay.keys, lay.values) for lay in cache.layers], 1, ones))
        length = max(int(v.shape[1]) for _, _, v in parts)
        pad = torch.nn.functional.pad
        self._valid = torch.cat([pad(v, (0, length - int(v.shape[1]))) for _, _, v in parts])
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

    @torch.inference_mode()
    def _extend(self, tokens: list[list[int]], k_max: int) -> Tensor:
        rows = len(tokens)
        lengths = torch.tensor(self.lengths, dtype=torch.int64, device=self.device)  # [R]
        ids = torch.zeros((rows, k_max), dtype=torch.int64, device=self.device)  # [R, k]
        new_valid = torch.zeros((rows, k_max), dtype=torch.bool, device=self.device)
        for b, t in enumerate(tokens):
            ids[b, : len(t)] = torch.tensor(t, dtype=torch.int64)
            new_valid[b, : len(t)] = True
        positions = lengths[:, None] + torch.arange(k_max, device=self.device)  # [R, k]
        if self.max_length is not None:  # filler slots may run past the window; never read
            positions = positions.clamp(max=self.max_length - 1)
        mask = torch.cat([self._valid, torch.ones_like(new_valid)], dim=1)  # [R, L + k]
        if self.physical_length == 0:
            self.cache = self._cache_cls(config=self.model.config)
        out = self.model(
            input_ids=ids,
            attention_mask=mask.to(torch.int64),
            position_ids=positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=k_max,
        )
        self._valid = torch.cat([self._valid, new_valid], dim=1)  # filler slots become holes
        self._tidy()
        return out.logits[:, -k_max:]  # [R, k_max, V] in the model's dtype

    @torch.inference_mode()
    def _rollback(self, lengths: list[int]) -> None:
        keep = torch.tensor(lengths, dtype=torch.int64, device=self.device)[:, None]  # [R, 1]
        self._valid = self._valid & (torch.cumsum(self._valid.to(torch.int64), dim=1) <= keep)
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
        longest = max(self.lengths, default=0)
        if self.physical_length > 8 and 4 * (self.physical_length - longest) > self.physical_length:
            self._pack(longest)

    def _pack(self, length: int) -> None:
        """Move row b's valid slots to the last n_b of ``length`` columns (one gather per layer)."""
        rows, phys = self._valid.shape
        n = self._valid.sum(dim=1)  # [R]
        rank = torch.cumsum(self._valid.to(torch.int64), dim=1) - 1  # [R, L] order among valid
        dest = rank + (length - n)[:, None]  # [R, L] new column of each valid slot
        src = torch.zeros((rows, length), dtype=torch.int64, device=self.device)  # [R, L']
        cols = torch.arange(phys, device=self.device).expand(rows, phys)
        flat_b, flat_c = self._valid.nonzero(as_tuple=True)
        src[flat_b, dest[flat_b, flat_c]] = cols[flat_b, flat_c]
        new_valid = torch.arange(length, device=self.device)[None] >= (length - n)[:, None]
        for layer in self._layers():
            idx = src[:, None, :, None]  # [R, 1, L', 1]
            layer.keys = layer.keys.gather(2, idx.expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3]))
            layer.values = layer.values.gather(
                2, idx.expand(-1, layer.values.shape[1], -1, layer.values.shape[3]))
        self._valid = new_valid
        self.packs += 1

    @torch.inference_mode()
    def select_rows(self, indices: Sequence[int]) -> None:
        idx = torch.tensor([int(i) for i in indices], dtype=torch.int64, device=self.device)
        self._valid = self._valid[idx]
        for layer in self._layers():
            layer.keys, layer.values = layer.keys[idx], layer.values[idx]
        if idx.numel() == 0:
            self.reset()
        else:
            self._tidy()


def as_batched(model: CausalLM | BatchedLM) -> BatchedLM:
    """The batched counterpart of a loaded model (toy tables and Hugging Face models)."""
    if isinstance(model, BatchedLM):
        return model
    if isinstance(model, TableLM):
        return BatchedTableLM(model)
    from verispec.models.hf import HFCausalLM

    if isinstance(model, HFCausalLM):
        return BatchedHFLM.from_causal_lm(model)
    raise TypeError(f"no batched counterpart for {type(model).__name__}; batched decoding supports "
                    "toy table models and Hugging Face models")
