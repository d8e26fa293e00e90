"""A compact Qwen2/Llama-family decoder (gpt-fast style) over a preallocated KV cache.

Shapes: R rows, k new tokens per row (ragged rows are padded with filler at the end),
H model width, Hq query heads and Hkv key/value heads of D dims (G = Hq / Hkv), P cache slots
(one per row, see :mod:`verispec.models.slots`), L cache positions per slot, S the positions
attended, V the vocabulary.

Each layer runs four matmuls: fused q/k/v (with the RMSNorm in front), o_proj added to the
residual, fused gate/up (with its RMSNorm), down_proj added to the residual. Attention is
``scaled_dot_product_attention`` with an explicit mask by position (for the quantized
models' float64 cache on an x86-64 CPU, verispec's own kernel,
:mod:`~verispec.models.native.attention_kernel`), and grouped
query heads are folded into the query length (each key/value head serves G·k query rows),
so keys and values are never repeated. A pass reads the cache tensors [P, Hkv, L, D]
directly: its rows may sit in any slots (:class:`~verispec.models.slots.Layout`); the
linear layers see the pass's rows only, in row order. Where every call of a short pass is
one of verispec's kernels (an int4 net on the CPU), the pass runs as those calls bound once
per pass shape and cache (:mod:`~verispec.models.native.replay`), with the same bits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import Tensor

import verispec.models.native.attention_kernel as attention_kernel
import verispec.models.native.replay as replay
import verispec.models.native.rope_kernel as rope_kernel
from verispec.models.native.config import NativeConfig
from verispec.models.native.linear import DenseLinear, Int4Linear, Int8Linear
from verispec.models.native.retime import LibraryClock
from verispec.models.slots import Layout, write_rows

__all__ = ["OWN_ATTENTION_MAX_TOKENS", "Block", "Linear", "Step", "Transformer"]

Linear = DenseLinear | Int4Linear | Int8Linear
#: Tokens per row up to which a model without ``exact_attention`` (a draft, a float32 model)
#: attends with verispec's kernel; longer passes (prompts) run torch's, whose blocked kernel
#: reads long prompts faster than one query at a time (the int4 draft reading 2,000 tokens on
#: an AMD EPYC Zen 4: 6.63 s against 7.40; 200 tokens: 0.311 against 0.305)
OWN_ATTENTION_MAX_TOKENS = 16


@dataclass
class Block:
    """One decoder layer: four (fused) linear layers, the RMSNorms folded into two of them."""

    qkv: Linear  # rmsnorm -> [q | k | v], [M, (Hq + 2 Hkv) D]
    o: Linear  # [M, Hq D] -> residual + [M, H]
    gate_up: Linear  # rmsnorm -> [gate | up], [M, 2 I]
    down: Linear  # [M, I] -> residual + [M, H]


@dataclass
class Step:
    """What one forward pass needs besides the tokens, built once for all layers."""

    cos: Tensor  # [R, k, 1, D] RoPE cosines at each token's position
    sin: Tensor  # [R, k, 1, D] RoPE sines, first half negated (see ``Transformer.rope``)
    start: int | None  # every row writes positions start..start+k-1 (rows of one length),
    positions: Tensor | None  # or [R, k] the position of each token (ragged rows)
    span: int  # S: cache positions attended (max length + k)
    mask: Tensor | None  # [R, 1, G k, S] additive: 0 where a query may attend, else -inf
    # (None: every query sees every position < S)
    pick: Tensor | None  # [R n] flat indices of the hidden states whose logits are wanted
    layout: Layout  # the slot of each row in the cache tensors
    last: Tensor  # [R, k] int64: the last position each token attends


class Transformer:
    """The weights and the forward pass; holds no per-sequence state (the cache is passed in)."""

    def __init__(self, config: NativeConfig, embed: Tensor, blocks: list[Block], head: Linear,
                 *, dtype: torch.dtype, device: torch.device,
                 attention_dtype: torch.dtype | None = None) -> None:
        self.config = config
        self.embed = embed  # [V, H]; float16 storage for int8 models
        self.blocks = blocks
        self.head = head  # final RMSNorm + lm_head, [M, H] -> [M, V]
        self.dtype = dtype  # activations
        # KV cache and attention arithmetic (see ``attend`` and :meth:`exact`)
        self.attention_dtype = attention_dtype or dtype
        #: a token must get the same attention in any pass (the quantized models): every pass
        #: then runs verispec's attention kernel where it takes the cache
        self.exact_attention = False
        self.device = device
        d = config.head_dim
        exponents = torch.arange(0, d, 2, dtype=torch.int64).float() / d
        self.inv_freq = (1.0 / (config.rope_theta ** exponents)).to(device)  # [D/2]
        self.cos = torch.empty((0, d), dtype=dtype, device=device)  # [N, D], N positions
        self.sin = torch.empty((0, d), dtype=dtype, device=device)  # [N, D]
        # int8 on a mixed kernel: which library runs each pass, re-timed as passes run
        self.libraries: LibraryClock | None = None
        #: passes of up to OWN_ATTENTION_MAX_TOKENS tokens per row run as kernel calls bound
        #: once per pass shape and cache where :func:`replay.applies` (False: layer by layer)
        self.replay = True
        self.replays: dict[tuple[int, int, int, int], replay.Replay] = {}

    @cached_property
    def replayable(self) -> bool:
        """Its short passes can run as bound kernel calls (:func:`replay.replayable`)."""
        return replay.replayable(self)

    def rope(self, positions: int) -> tuple[Tensor, Tensor]:
        """cos, sin tables [N, D] for positions 0..N-1 (N ≥ ``positions``), grown on demand.

        Same values as transformers' default rotary embedding; ``sin`` has its first half
        negated so that rotate_half(x) ⊙ sin = flip_halves(x) ⊙ sin_signed.
        """
        if self.cos.shape[0] < positions:
            p = max(positions, 2 * self.cos.shape[0], 256)
            t = torch.arange(p, device=self.device, dtype=torch.float32)
            freqs = t[:, None] * self.inv_freq[None, :]  # [N, D/2]
            emb = torch.cat((freqs, freqs), dim=-1)  # [N, D]
            half = self.config.head_dim // 2
            sign = torch.ones(self.config.head_dim, device=self.device)
            sign[:half] = -1.0
            self.cos = emb.cos().to(self.dtype)
            self.sin = (emb.sin() * sign).to(self.dtype)
        return self.cos, self.sin

    def new_cache(self, slots: int, capacity: int) -> tuple[list[Tensor], list[Tensor]]:
        """Uninitialized keys and values, one [P, Hkv, L, D] tensor each per layer (pages
        that are never written are never touched)."""
        c = self.config
        shape = (slots, c.kv_heads, capacity, c.head_dim)
        dtype = self.attention_dtype
        keys = [torch.empty(shape, dtype=dtype, device=self.device) for _ in self.blocks]
        values = [torch.empty(shape, dtype=dtype, device=self.device) for _ in self.blocks]
        return keys, values

    def exact(self) -> Transformer:
        """This net, attending so that a token gets the same bits in any pass (the quantized
        models, whose layers round their inputs): the cache dtype of
        :func:`~verispec.models.native.attention_kernel.exact_dtype` and verispec's kernel in
        every pass where it takes the cache."""
        self.attention_dtype = attention_kernel.exact_dtype(self.device, self.config.head_dim)
        self.exact_attention = True
        return self

    def attend_like(self, other: Transformer) -> None:
        """Attend as ``other`` does (a net that writes ``other``'s cache: its dtype, and
        whether every pass must be exact)."""
        self.attention_dtype, self.exact_attention = other.attention_dtype, other.exact_attention

    def additive_mask(self, allowed: Tensor) -> Tensor:
        """A boolean mask as 0 / -inf in the activations' dtype (SDPA's faster mask form)."""
        mask = torch.zeros(allowed.shape, dtype=self.attention_dtype, device=self.device)
        return mask.masked_fill_(~allowed, float("-inf"))

    def step(self, lengths: list[int], ks: list[int], num_logits: int | None,
             slots: Sequence[int] | None = None) -> Step:
        """The per-pass tensors for rows of ``lengths`` receiving ``ks`` tokens each, living
        in cache ``slots`` (None: row b in slot b)."""
        dev, g = self.device, self.config.group
        rows, k = len(lengths), max(ks)
        span = max(lengths) + k
        cos, sin = self.rope(span)
        layout = Layout.of(slots, rows, dev)
        uniform = min(lengths) == max(lengths)
        if uniform:  # one write per row, positions shared
            pos = torch.arange(lengths[0], lengths[0] + k, device=dev)  # [k]
            cos_t, sin_t = cos[pos][None, :, None], sin[pos][None, :, None]  # [1, k, 1, D]
            start, positions = lengths[0], None
            last = pos[None].expand(rows, k).contiguous()  # [R, k]
            mask = None
            if k > 1:
                allowed = torch.arange(span, device=dev)[None, :] <= pos[:, None]  # [k, S]
                mask = self.additive_mask(allowed.repeat(g, 1)[None, None])  # [1, 1, G k, S]
        else:
            base = torch.tensor(lengths, dtype=torch.int64, device=dev)  # [R]
            positions = base[:, None] + torch.arange(k, device=dev)  # [R, k]
            cos_t, sin_t = cos[positions][:, :, None], sin[positions][:, :, None]  # [R, k, 1, D]
            start, last = None, positions
            allowed = (torch.arange(span, device=dev)[None, None, :]
                       <= positions[:, :, None])  # [R, k, S]
            mask = self.additive_mask(allowed.repeat(1, g, 1)[:, None])  # [R, 1, G k, S]
        pick = None
        if num_logits is not None and (num_logits < k or min(ks) < k):
            # row b's logits j follow its token k_b - n_b + j; filler entries clamp to k - 1
            cols = [[min(kb - min(num_logits, kb) + j, k - 1) for j in range(num_logits)]
                    for kb in ks]
            pick = torch.tensor([[b * k + c for c in row] for b, row in enumerate(cols)],
                                dtype=torch.int64, device=dev).view(-1)  # [R n]
        return Step(cos_t, sin_t, start, positions, span, mask, pick, layout, last)

    def forward(self, ids: Tensor, step: Step, keys: list[Tensor], values: list[Tensor],
                logits: bool = True, extra: tuple[Tensor, Tensor] | None = None,
                ) -> Tensor | None:
        """ids [R, k] -> logits [R n, V] for ``step.pick`` (all R k when None), or None.

        ``keys`` / ``values``: the cache, one [P, Hkv, L, D] tensor each per layer; the new
        keys/values are written in place at the step's slots and positions. ``extra``: ids
        [U] and allowed [R n, U] that a subset head scores besides its subset
        (:meth:`~verispec.models.native.linear.SubsetHead.score`).
        """
        if self.libraries is None:
            return self._forward(ids, step, keys, values, logits, extra)
        scored = 0 if not logits else ids.numel() if step.pick is None else step.pick.numel()
        return self.libraries.run(ids.numel(), scored,
                                  lambda: self._forward(ids, step, keys, values, logits, extra))

    def _forward(self, ids: Tensor, step: Step, keys: list[Tensor], values: list[Tensor],
                 logits: bool, extra: tuple[Tensor, Tensor] | None = None) -> Tensor | None:
        rows, k = ids.shape
        if (self.replay and keys and k <= OWN_ATTENTION_MAX_TOKENS
                and replay.applies(self, keys[0])):  # the same calls, bound once
            x = replay.replay_for(self, self.replays, rows, k, keys, values).run(ids, step)
        else:
            x = F.embedding(ids.reshape(-1), self.embed).to(self.dtype)  # [R k, H]
            # the rotary kernel's choice holds for every layer: one activation dtype and
            # device, and caches made alike by ``new_cache``
            fused = bool(keys) and rope_kernel.takes(x, self.cos, keys[0])
            for block, cache_k, cache_v in zip(self.blocks, keys, values, strict=True):
                x = self.layer(block, x, rows, k, step, cache_k, cache_v, fused)
        if not logits:
            return None
        if step.pick is not None:
            x = x.index_select(0, step.pick)  # [R n, H]
        if extra is not None:
            return self.head.score(x, extra)  # type: ignore[union-attr]  # [R n, V]
        return self.head(x)  # [R n, V]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """SDPA of q [R, Hkv, G k, D] over the cache's k, v [R, Hkv, S, D] -> [R, Hkv, G k, D].

        The attention kernel's float32 rounding depends on how many queries a pass holds
        (a few ulps). An int8 layer after it rounds its input to 255 levels, and such a
        difference can cross a rounding boundary, so a token's distribution would depend
        on how many tokens were scored with it. Quantized models therefore attend with
        verispec's attention kernel where it runs (:meth:`attend_slots`: each query alone,
        the same bits always, over a float32 cache), and otherwise here in float64 (their
        KV cache is then float64), rounded once to float32: torch's result is the same for
        1 or k queries barring a float32 rounding tie
        (:func:`~verispec.models.native.attention_kernel.exact_dtype`).
        """
        out = F.scaled_dot_product_attention(q.to(k.dtype), k, v, attn_mask=mask)
        return out.to(self.dtype)

    def attend_slots(self, q: Tensor, cache_k: Tensor, cache_v: Tensor, step: Step) -> Tensor:
        """:meth:`attend` of q [R, Hkv, G k, D] over the rows' slots of the cache's
        [P, Hkv, L, D] tensors, wherever they are -> [R, Hkv, G k, D].

        A float32 or float64 cache on a CPU where verispec's attention kernel runs is read
        by it (:mod:`~verispec.models.native.attention_kernel`: each query alone, in one
        fixed order, in the cache's dtype, each row's keys and values where its slot is) in
        every pass of a model with ``exact_attention``, and in passes of up to
        :data:`OWN_ATTENTION_MAX_TOKENS` tokens per row of the others. Otherwise:

        Rows in a run of slots in row order are read as views. Scattered rows: in float64
        (the int8 models) one call per run of consecutive slots, over views, which is exact
        because float64 attention gives a row the same result whatever the batch around it
        (see :meth:`attend`); float32 / bfloat16 attention rounds a row differently with its
        place in the batch (a few ulps, with several threads), so their rows' attended keys
        and values are gathered into the compact batch a pass over rows in slots 0..R-1
        reads.
        """
        lay, s, mask = step.layout, step.span, step.mask
        own = self.exact_attention or step.last.shape[1] <= OWN_ATTENTION_MAX_TOKENS
        if own and attention_kernel.takes(q, cache_k):  # every query alone, each row in its slot
            return attention_kernel.attend(q, cache_k, cache_v, lay.slots, step.last,
                                           check=False).to(self.dtype)
        if lay.first is not None or self.attention_dtype != torch.float64:
            return self.attend(q, lay.read(cache_k, s), lay.read(cache_v, s), mask)
        out = torch.empty(q.shape, dtype=self.dtype, device=q.device)  # [R, Hkv, G k, D]
        for a, b, rows in lay.runs:  # one call per run of consecutive slots, over views
            part = mask if mask is None or mask.shape[0] == 1 else mask.index_select(0, rows)
            out.index_copy_(0, rows, self.attend(q.index_select(0, rows), cache_k[a:b, :, :s],
                                                 cache_v[a:b, :, :s], part))
        return out

    def rope_store(self, qkv: Tensor, step: Step, cache_k: Tensor, cache_v: Tensor) -> Tensor:
        """RoPE on the queries and keys of qkv [R, k, Hq + 2 Hkv, D]; the keys and values
        written in the cache at the step's slots and positions -> q [R, Hkv, G k, D] (the G
        query heads of a kv head in a row, token-minor)."""
        c = self.config
        hq, hkv, d, g = c.heads, c.kv_heads, c.head_dim, c.group
        rows, k = qkv.shape[:2]
        qk = qkv[:, :, : hq + hkv]  # [R, k, Hq + Hkv, D], a view
        swapped = qk.unflatten(-1, (2, d // 2)).flip(-2).flatten(-2)  # halves swapped
        qk = torch.addcmul(qk * step.cos, swapped, step.sin)  # RoPE on q and k at once
        new_k, new_v = qk[:, :, hq:], qkv[:, :, hq + hkv:]  # [R, k, Hkv, D] each
        write_rows(cache_k, new_k, step.layout, step.start, step.positions)
        write_rows(cache_v, new_v, step.layout, step.start, step.positions)
        # [R, k, Hkv, G, D] -> [R, Hkv, G k, D]
        return qk[:, :, :hq].unflatten(2, (hkv, g)).permute(0, 2, 3, 1, 4).reshape(
            rows, hkv, g * k, d)

    def layer(self, block: Block, x: Tensor, rows: int, k: int, step: Step, cache_k: Tensor,
              cache_v: Tensor, fused: bool = False) -> Tensor:
        """One decoder layer: x [R k, H] -> [R k, H]; writes the rows' new positions in
        this layer's cache. ``fused``: RoPE and the cache writes run as one call of
        :mod:`~verispec.models.native.rope_kernel` (where its ``takes`` says so)."""
        c = self.config
        hq, hkv, d, g = c.heads, c.kv_heads, c.head_dim, c.group
        qkv = block.qkv(x).view(rows, k, hq + 2 * hkv, d)  # [R, k, Hq + 2 Hkv, D]
        if fused:  # the same, in one call
            q = rope_kernel.rope_store(qkv, hq, hkv, self.cos, self.sin, step.last,
                                       step.layout.slots, cache_k, cache_v, check=False)
        else:
            q = self.rope_store(qkv, step, cache_k, cache_v)  # [R, Hkv, G k, D]
        att = self.attend_slots(q, cache_k, cache_v, step)  # [R, Hkv, G k, D]
        att = att.unflatten(2, (g, k)).permute(0, 3, 1, 2, 4).reshape(rows * k, hq * d)
        x = block.o.add_to(x, att)  # [R k, H]
        gu = block.gate_up(x)  # [R k, 2 I]
        if isinstance(block.down, Int4Linear):  # the SwiGLU inside the down call, where it runs
            out = block.down.add_gated_to(x, gu)
            if out is not None:
                return out
        return block.down.add_to(x, F.silu(gu[:, : c.intermediate]) * gu[:, c.intermediate:])
