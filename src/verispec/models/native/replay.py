"""A short pass of an int4 net replayed as kernel calls bound once.

A one-token step of the int4 draft makes six C calls per layer (q/k/v with its RMSNorm, the
rotary embedding with the cache store, attention, o_proj added to the residual, gate/up with
its RMSNorm, down with the SwiGLU added to the residual), about 150 in all, and each went
through a Python wrapper that checks its tensors, allocates its output and converts its
arguments: about 10 µs a call around kernels that take 12–170 µs. A :class:`Replay` binds
those calls once for one pass shape (R rows of k tokens) over one cache, with activations
in buffers of its own and the residual stream updated in place; a pass then copies in its
token ids and positions and runs the bound calls in order.

Every call is the one the layer-by-layer pass makes, on the same inputs (the in-place
residual adds what ``add_to`` adds to its copy), so a replayed pass gives the same bits
(``tests/test_replay.py``). It applies where every pass call of the layer-by-layer path
would be verispec's kernel: float32 activations on the CPU, int4 layers in verispec's
layout with its kernel built, and verispec's rotary and attention kernels taking the cache.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol, cast

import torch
import torch.nn.functional as F
from torch import Tensor

import verispec.models.native.attention_kernel as attention_kernel
import verispec.models.native.int4_kernel as int4_kernel
import verispec.models.native.rope_kernel as rope_kernel
from verispec.models.native.config import NativeConfig
from verispec.models.native.linear import LAYER_LINEARS, Int4Linear

__all__ = ["KEPT", "Net", "Replay", "StepLike", "applies", "replay_for", "replayable"]

#: Replays a net keeps (one per pass shape, cache and thread), the least recently used
#: dropped first
KEPT = 16
_KEPT_LOCK = threading.Lock()  # the kept replays of every net (threads may share a net)


class Net(Protocol):
    """What a replay reads of :class:`~verispec.models.native.model.Transformer` (this
    module sits below it)."""

    config: NativeConfig
    blocks: list[Any]  # Block: qkv, o, gate_up, down
    embed: Tensor  # [V, H]
    cos: Tensor  # [N, D]
    sin: Tensor  # [N, D]
    device: torch.device
    dtype: torch.dtype
    libraries: object

    @property
    def replayable(self) -> bool: ...


class StepLike(Protocol):
    """What a replay reads of a pass's :class:`~verispec.models.native.model.Step`."""

    last: Tensor  # [R, k] each token's position
    layout: Any  # Layout: .slots [R]


def applies(net: Net, cache_k: Tensor) -> bool:
    """Whether a pass of ``net`` over a cache like ``cache_k`` ([P, Hkv, L, D]) can be
    replayed: every call of its layer-by-layer pass is one of verispec's kernels."""
    if (net.device.type != "cpu" or net.dtype != torch.float32 or net.libraries is not None
            or not net.replayable or not cache_k.is_contiguous()):
        return False
    probe = torch.empty((0, net.config.head_dim), dtype=torch.float32)  # an activation's kind
    return rope_kernel.takes(probe, net.cos, cache_k) and attention_kernel.takes(probe, cache_k)


def replayable(net: Net) -> bool:
    """Whether every pass call of ``net``'s blocks can be verispec's kernels, whatever the
    cache: int4 layers in the int4 kernel's layout, and the int4, rotary and attention
    kernels built here (the head may be any layer: it is called as it is)."""
    layers = [getattr(b, name) for b in net.blocks for name in LAYER_LINEARS]
    return (int4_kernel.available() and rope_kernel.available() and attention_kernel.available()
            and all(isinstance(x, Int4Linear) and x.lanes is not None for x in layers))


class Replay:
    """The calls of a pass of R rows of k tokens over one cache, bound once."""

    def __init__(self, net: Net, rows: int, k: int, keys: list[Tensor],
                 values: list[Tensor]) -> None:
        c = net.config
        hq, hkv, d, g = c.heads, c.kv_heads, c.head_dim, c.group
        m = rows * k
        self.net, self.rows, self.k = net, rows, k
        self.cos, self.sin = net.cos, net.sin  # [N, D]: a longer pass regrows them
        self.caches = [weakref.ref(t) for t in keys + values]
        self.threads = torch.get_num_threads()
        self.x = torch.empty((m, c.hidden), dtype=torch.float32)  # the residual stream
        self.qkv = torch.empty((rows, k, hq + 2 * hkv, d), dtype=torch.float32)
        self.q = torch.empty((rows, hkv, g * k, d), dtype=torch.float32)
        self.att = torch.empty((rows, hkv, g * k, d), dtype=torch.float32)
        # o_proj's input [R k, Hq D]: the attention's output itself where k = 1
        self.heads = (self.att.view(m, hq * d) if k == 1
                      else torch.empty((m, hq * d), dtype=torch.float32))
        self.gate_up = torch.empty((m, 2 * c.intermediate), dtype=torch.float32)
        self.positions = torch.empty((rows, k), dtype=torch.int64)  # [R, k] the tokens'
        self.slots = torch.empty((rows,), dtype=torch.int64)  # [R] the rows' slots
        self.calls: list[Callable[[], int]] = []
        for block, cache_k, cache_v in zip(net.blocks, keys, values, strict=True):
            self.calls += self._layer(block, cache_k, cache_v)

    def _layer(self, block: Any, cache_k: Tensor, cache_v: Tensor) -> list[Callable[[], int]]:
        c, t = self.net.config, self.threads
        # int4 layers in verispec's layout (:func:`applies`)
        qkv, o, gate_up, down = (cast(Int4Linear, x)
                                 for x in (block.qkv, block.o, block.gate_up, block.down))
        m = self.rows * self.k
        calls = [
            int4_kernel.bind(self.x, _lanes(qkv), self.qkv.view(m, -1), qkv.bias, qkv.norm,
                             qkv.eps, threads=t),
            rope_kernel.bind(self.qkv, c.heads, c.kv_heads, self.cos, self.sin, self.positions,
                             self.slots, cache_k, cache_v, self.q, threads=t),
            attention_kernel.bind(self.q, cache_k, cache_v, self.slots, self.positions,
                                  self.att, threads=t)]
        if self.k > 1:
            calls.append(self._heads_by_token)
        return calls + [
            int4_kernel.bind(self.heads, _lanes(o), self.x, o.bias, accumulate=True, threads=t),
            int4_kernel.bind(self.x, _lanes(gate_up), self.gate_up, gate_up.bias, gate_up.norm,
                             gate_up.eps, threads=t),
            int4_kernel.bind(self.gate_up, _lanes(down), self.x, down.bias, accumulate=True,
                             glu=True, threads=t)]

    def _heads_by_token(self) -> int:
        """The attention's output [R, Hkv, G k, D] (query i of a kv head: query head i // k
        of its group, token i % k) as o_proj's input, [R k, Hq D]."""
        c = self.net.config
        r, k, hkv, g, d = self.rows, self.k, c.kv_heads, c.group, c.head_dim
        self.heads.view(r, k, hkv, g, d).copy_(self.att.view(r, hkv, g, k, d)
                                               .permute(0, 3, 1, 2, 4))
        return 0

    def fits(self, keys: list[Tensor], values: list[Tensor]) -> bool:
        """Whether the bound calls still read this cache and the net's rotary tables, with
        torch's thread count of now."""
        return (self.cos is self.net.cos and self.threads == torch.get_num_threads()
                and len(self.caches) == len(keys) + len(values)
                and all(ref() is t for ref, t in zip(self.caches, keys + values, strict=True)))

    def run(self, ids: Tensor, step: StepLike) -> Tensor:
        """ids [R, k] -> the hidden states after the last layer, [R k, H] (a buffer that the
        next replayed pass overwrites); writes the cache as the layer-by-layer pass does."""
        self.positions.copy_(step.last)
        self.slots.copy_(step.layout.slots)
        flat = ids.reshape(-1)  # [R k]
        if self.net.embed.dtype == torch.float32:
            torch.index_select(self.net.embed, 0, flat, out=self.x)
        else:
            self.x.copy_(F.embedding(flat, self.net.embed))
        for call in self.calls:
            rc = call()
            if rc != 0:
                raise ValueError(f"a replayed kernel call refused its tensors (code {rc})")
        return self.x


def _lanes(layer: Int4Linear) -> tuple[Tensor, Tensor, Tensor]:
    return cast(tuple[Tensor, Tensor, Tensor], layer.lanes)


def replay_for(net: Net, kept: dict[tuple[int, int, int, int], Replay], rows: int,
               k: int, keys: list[Tensor], values: list[Tensor]) -> Replay:
    """The replay of ``kept`` for this shape, cache and thread, bound now if it is missing or
    stale (least recently used dropped beyond :data:`KEPT`)."""
    key = (rows, k, id(keys[0]), threading.get_ident())  # a thread's replays are its own
    with _KEPT_LOCK:
        found = kept.pop(key, None)
    if found is None or not found.fits(keys, values):
        found = Replay(net, rows, k, keys, values)
    with _KEPT_LOCK:
        kept[key] = found  # most recently used last
        while len(kept) > KEPT:
            kept.pop(next(iter(kept)))
    return found
