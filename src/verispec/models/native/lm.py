""":class:`NativeCausalLM`: the native decoder behind the :class:`CausalLM` interface.

The KV cache is a :class:`~verispec.models.slots.SlotCache`: per layer one key and one value
tensor [P, Hkv, L, D], allocated once and reused. Each row lives in one of the P slots, and
column t of a slot holds its row's token at position t. So

* ``add_rows`` takes free slots and prefills each in place (one exact single-row prefill per
  prompt); ``select_rows`` is bookkeeping (dropped rows free their slots, reordering moves
  nothing), except that each extra copy of a repeated row (a fork) copies that row's used
  columns into a free slot. No other row's cache is ever copied, except when more rows are
  live than there are slots: P then grows geometrically, moving the slots into new storage;
* a row's length is all its state: ``rollback`` only changes lengths (no copy);
* ``extend`` writes row b's k_b new tokens at positions lengths[b] + j of its slot; shorter
  rows are padded with filler that lands beyond their new length (to be overwritten later),
  and attention masks by position (query at position p sees positions ≤ p), so filler and
  stale positions are never attended by a real token. The linear layers see the pass's
  rows only, in row order, and attention reads each row's slot where it is
  (:meth:`~verispec.models.native.model.Transformer.attend_slots`), so a row's result does
  not depend on which slot it has;
* the capacity L grows geometrically when a pass needs more positions (copying every slot).

Cache memory is allocated uninitialized. Attention reads masked positions too (a masked NaN
would still poison the output), so every slot has a watermark below which its positions are
finite (real tokens, stale ones, filler, or zeros written ahead of use); a pass raises the
watermarks of its own rows' slots to the positions it attends, and no other slot is touched.

Logits are computed only for the positions asked for: hidden states are gathered before the
final norm and the lm_head.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

import verispec.models.native.cbuild as cbuild
from verispec.models.base import CausalLM
from verispec.models.native.linear import SubsetHead
from verispec.models.native.model import Transformer
from verispec.models.native.vocabulary import ContextIds
from verispec.models.slots import SlotCache

__all__ = ["NativeCausalLM"]

#: Passes over at least this many token rows (rows × tokens) run on ``prefill_net`` when a
#: model has one, does not keep ``exact_passes`` (a draft) and torch's int4 kernel runs its
#: passes: an int4 draft step costs 23 ms at 1 row and 47 ms at 4, its int8 form 32 and
#: 39 ms (0.5B draft, 2-core AVX-512 VNNI Xeon). verispec's own int4 kernel runs passes of
#: up to ``int4_kernel.TILE_ROWS`` rows in one tile (16.4 ms at 1, 21.5 at 4, 27.7 at 8
#: there, against the int8 form's 39.2 and 44.8 at 4 and 8), so where it runs only longer
#: passes go to the int8 form.
PREFILL_ROWS = 4


def prefill_rows() -> int:
    """The fewest token rows of a pass that an int4 draft runs on its int8 form."""
    from verispec.models.native.int4_kernel import TILE_ROWS, available

    return TILE_ROWS + 1 if available() else PREFILL_ROWS


class NativeCausalLM(CausalLM):
    """A Qwen2/Llama-family model run by :class:`Transformer` with a rollback-able KV cache."""

    def __init__(self, net: Transformer, tokenizer: Any = None, name: str = "native", *,
                 eos_token_ids: frozenset[int] = frozenset(), max_length: int | None = None,
                 precision: str = "float32", source: str | None = None,
                 prefill_net: Transformer | None = None, vocabulary: int | None = None,
                 online_rotations: bool = True, exact_passes: bool = False) -> None:
        super().__init__()
        self.source = source  # the directory it was loaded from (None: built in memory)
        # ids scored (:func:`verispec.models.native.subset_ids`; None: the whole vocabulary)
        self.vocabulary = vocabulary
        # int8 built with the run-time rotations of ``int8_state`` (what a reload needs)
        self.online_rotations = online_rotations
        self.net = net
        # reads prompts in ``add_rows`` when set (an int4 model with its int8 form, whose
        # kernel is faster over many rows), and passes over ≥ prefill_rows() token rows
        # unless ``exact_passes``: a target's tokens must score as one at a time would, so
        # every pass after the prompt runs ``net`` (a draft's q is whatever its pass
        # computed). It writes ``net``'s cache, so it attends in that cache's dtype (its own
        # net object, never shared with a decoding model)
        self.exact_passes = exact_passes
        if prefill_net is not None:
            prefill_net.attend_like(net)
        self.prefill_net = prefill_net
        self.tokenizer = tokenizer
        self.name = name
        self.vocab_size = net.config.vocab_size
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_length = max_length if max_length is not None else net.config.max_positions
        self.device = net.device
        self.precision = precision
        self.cache = SlotCache(self._new_cache)
        # a draft over a vocabulary subset also scores each row's context ids, where every
        # net that scores has the rows for them
        heads = [n.head for n in (net, prefill_net) if n is not None]
        self.context = (ContextIds(net.head.ids)  # type: ignore[union-attr]
                        if all(isinstance(h, SubsetHead) and h.rows is not None for h in heads)
                        else None)
        self.reset()

    @property
    def variant(self) -> str:  # type: ignore[override]
        """The quantized format's version and options, and the kernels that set its pass
        costs (see :attr:`CausalLM.variant`)."""
        import verispec.models.native.attention_kernel as attention_kernel
        from verispec.models.native.weights import CACHE_VERSIONS

        kernel = ""
        if self.precision == "int4":  # verispec's own int4 kernel or torch's
            from verispec.models.native.int4_kernel import status

            kernel = (f"|int4={status()}|exact={int(self.exact_passes)}"
                      f"|replay={int(self.net.replay and self.net.replayable)}")
        attends = self.net.attention_dtype in attention_kernel.WIDTHS  # verispec's or torch's
        if attends:
            kernel += (f"|attention={attention_kernel.status()}"
                       f"|cache={str(self.net.attention_dtype).removeprefix('torch.')}")
        if self.precision in ("int8", "int4") or attends:
            kernel += f"|csrc={cbuild.sources_identity()}"  # the C kernels its passes run
        return (f"{CACHE_VERSIONS.get(self.precision, self.precision)}"
                f"|rotations={int(self.online_rotations)}|vocabulary={self.vocabulary}"
                f"|prefill={self.prefill_net is not None}{kernel}")

    def _new_cache(self, slots: int, capacity: int) -> tuple[list[Tensor], list[Tensor]]:
        return self.net.new_cache(slots, capacity)  # per layer [P, Hkv, L, D]

    def spawn(self) -> NativeCausalLM:
        return NativeCausalLM(self.net, self.tokenizer, self.name,
                              eos_token_ids=self.eos_token_ids, max_length=self.max_length,
                              precision=self.precision, source=self.source,
                              prefill_net=self.prefill_net, vocabulary=self.vocabulary,
                              online_rotations=self.online_rotations,
                              exact_passes=self.exact_passes)

    @property
    def weights_key(self) -> int:
        return id(self.net)

    def reset(self) -> None:
        self.cache.reset()
        self._lengths: list[int] = []
        if self.context is not None:
            self.context.reset()

    def reserve(self, rows: int) -> None:
        self.cache.pool.reserve(rows)

    @property
    def lengths(self) -> list[int]:
        return list(self._lengths)

    @property
    def slots(self) -> list[int]:
        return list(self.cache.slots)

    @property
    def capacity(self) -> int:
        """L, cache positions per slot (exposed for tests)."""
        return self.cache.capacity

    # -- rows ----------------------------------------------------------------------------------

    @torch.inference_mode()
    def _add_rows(self, prefixes: list[list[int]]) -> None:
        cache = self.cache
        slots = cache.admit([len(p) for p in prefixes])
        net = self.prefill_net or self.net
        for s, prefix in zip(slots, prefixes, strict=True):  # one exact single-row prefill each
            if prefix:
                ids = torch.tensor([prefix], dtype=torch.int64, device=self.device)  # [1, k]
                step = net.step([0], [len(prefix)], None)
                net.forward(ids, step, [t[s: s + 1] for t in cache.keys],
                            [t[s: s + 1] for t in cache.values], logits=False)
        self._lengths += [len(p) for p in prefixes]
        if self.context is not None:
            self.context.add_rows(prefixes)

    def _select_rows(self, indices: list[int]) -> None:
        self.cache.select(indices, self._lengths)
        self._lengths = [self._lengths[i] for i in indices]
        if self.context is not None:
            self.context.select(indices)

    def _rollback(self, lengths: list[int]) -> None:
        self._lengths = list(lengths)  # stale positions are masked, then overwritten

    # -- forward -------------------------------------------------------------------------------

    @torch.inference_mode()
    def _extend(self, tokens: list[list[int]], num_logits: int) -> Tensor:
        ks = [len(t) for t in tokens]
        k = max(ks)
        self.cache.reserve(max(self._lengths) + k)
        self.cache.scrub(self.cache.slots, max(self._lengths) + k)
        padded = [t + [0] * (k - len(t)) for t in tokens]  # filler: token 0
        ids = torch.tensor(padded, dtype=torch.int64, device=self.device)  # [R, k]
        net = self.net
        if (self.prefill_net is not None and not self.exact_passes
                and len(tokens) * k >= prefill_rows()):
            net = self.prefill_net
        step = net.step(self._lengths, ks, num_logits, self.cache.slots)
        extra = (None if self.context is None
                 else self.context.extend(tokens, num_logits, self.device))
        logits = net.forward(ids, step, self.cache.keys, self.cache.values,
                             extra=extra)  # [R n, V]
        self._lengths = [n + kb for n, kb in zip(self._lengths, ks, strict=True)]
        return logits.view(len(tokens), num_logits, -1)  # [R, n, V]
