"""Turning logits into the exact distributions that are sampled from.

The same :class:`Sampling` warp (temperature, then top-k, then top-p) is applied to the
target's logits (giving p) and to the draft's logits (giving q). Whatever a verifier
receives as ``q`` is therefore the distribution the draft token really was drawn from,
and whatever it receives as ``p`` is the distribution a lossless method must reproduce.

Temperature 0 means greedy decoding: the warp returns a one-hot distribution on the
first maximal logit, so speculative verification reduces to exact matching.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "NonFiniteLogitsError",
    "Randomness",
    "Sampling",
    "check_finite",
    "choose_rows",
    "inverse_cdf",
    "sample_from",
    "warp_rows",
]


class NonFiniteLogitsError(ValueError):
    """A model produced NaN or +inf logits; nothing sensible can be sampled from them."""


def check_finite(logits: Tensor, who: str) -> None:
    """Raise :class:`NonFiniteLogitsError` if ``logits`` hold NaN or +inf.

    ``-inf`` is allowed: it is how a model (or a toy table) marks an impossible token.
    """
    bad = torch.isnan(logits) | (logits == math.inf)
    if bool(bad.any()):
        where = bad.nonzero()[0].tolist()
        raise NonFiniteLogitsError(
            f"{who} produced non-finite logits (NaN or +inf) at index {where}; "
            "check the model weights and the dtype (float16 overflow is a common cause)"
        )
    if bool((logits == -math.inf).all(dim=-1).any()):
        raise NonFiniteLogitsError(f"{who} produced a row of logits that is -inf everywhere")


def _check_rows(summary: Tensor, logits: Tensor, who: str) -> None:
    """Raise where a per-row ``summary`` [...] of the warped logits is not finite: the
    detailed reason from :func:`check_finite`, else (finite logits that overflowed when
    divided by the temperature) a reason of its own. One cheap check on the hot path."""
    if bool(torch.isfinite(summary).all()):
        return
    check_finite(logits, who)
    raise NonFiniteLogitsError(f"{who}'s logits overflow when divided by the temperature")


@dataclass(frozen=True)
class Sampling:
    """Temperature / top-k / top-p warping, applied identically to p (target) and q (draft).

    Attributes:
        temperature: 0 for greedy (one-hot argmax), otherwise > 0.
        top_k: keep the k most likely tokens (None: all).
        top_p: keep the smallest set of most likely tokens whose mass reaches top_p
            (None or 1.0: all). Must lie in (0, 1].
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: Tensor, who: str = "model") -> Tensor:
        """Warped probabilities.

        Args:
            logits: [..., V] raw logits (float32, bfloat16 or float64).
        Returns:
            [..., V] probabilities; float64 if the logits are float64, else float32.
        """
        dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
        x = logits.to(dtype)
        if self.greedy:
            # One-hot on the first maximal logit: deterministic, identical for p and q. The
            # max is NaN where a row holds a NaN, and not finite for +inf or all -inf.
            top, arg = x.max(dim=-1, keepdim=True)
            _check_rows(top, logits, who)
            return torch.zeros_like(x).scatter_(-1, arg, 1.0)
        if self.temperature != 1.0:
            x = x / self.temperature
        vocab = x.shape[-1]
        if self.top_k is not None and self.top_k < vocab:
            kth = torch.topk(x, self.top_k, dim=-1).values[..., -1:]  # [..., 1]
            x = x.masked_fill(x < kth, -math.inf)
        probs = torch.softmax(x, dim=-1)
        if self.top_p is not None and self.top_p < 1.0:
            sorted_p, order = torch.sort(probs, dim=-1, descending=True)
            mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # [..., V]
            drop_sorted = mass_before >= self.top_p  # the first token is always kept
            drop = torch.zeros_like(drop_sorted).scatter_(-1, order, drop_sorted)
            probs = probs.masked_fill(drop, 0.0)
            probs = probs / probs.sum(dim=-1, keepdim=True)
        # a NaN or +inf logit, or a row that is -inf everywhere, makes its softmax row NaN
        _check_rows(probs.sum(dim=-1), logits, who)
        return probs

    def describe(self) -> str:
        if self.greedy:
            return "greedy (T=0)"
        parts = [f"T={self.temperature:g}"]
        if self.top_k is not None:
            parts.append(f"top-k={self.top_k}")
        if self.top_p is not None:
            parts.append(f"top-p={self.top_p:g}")
        return ", ".join(parts)


CDF_CHUNK = 2048  # ids per chunk of the two-level inverse CDF


def inverse_cdf(probs: Tensor, u: Tensor) -> Tensor:
    """Row b's first id whose cumulative weight exceeds ``u[b]`` times the row's total.

    Two levels, so no cumulative sum runs over the whole vocabulary: the sums of chunks of
    :data:`CDF_CHUNK` ids locate the chunk, a cumulative sum inside it (float64) the id. Exact
    up to float rounding (closer than one float32 cumulative sum over 151,936 ids), and a
    token with zero weight is never returned: the returned chunk and id are the first whose
    cumulative weight exceeds the uniform, so they add weight.

    Args:
        probs: [B, V] non-negative weights (need not be exactly normalised).
        u: [B] uniforms in [0, 1).
    Returns:
        [B] int64 token ids.
    """
    b, vocab = probs.shape
    width = min(CDF_CHUNK, vocab)  # a small vocabulary is one chunk
    full = vocab - vocab % width
    sums = probs[:, :full].reshape(b, -1, width).sum(-1)  # [B, C]
    if full < vocab:
        sums = torch.cat([sums, probs[:, full:].sum(-1, keepdim=True)], dim=1)  # [B, C+1]
    cdf = sums.double().cumsum(-1)  # [B, C']
    total = cdf[:, -1:]  # [B, 1]
    if not bool((total > 0).all()) or not bool(torch.isfinite(total).all()):
        raise ValueError("cannot sample from a row with no finite positive mass")
    zero = torch.zeros_like(total)
    x = torch.minimum(u[:, None].double() * total, torch.nextafter(total, zero))  # [B, 1] < total
    chunk = torch.searchsorted(cdf, x, right=True)  # [B, 1], the first chunk with cdf > x
    below = torch.where(chunk > 0, cdf.gather(1, (chunk - 1).clamp_min(0)), zero)  # [B, 1]
    ids = chunk * width + torch.arange(width, device=probs.device)  # [B, width]
    inner = torch.where(ids < vocab, probs.gather(1, ids.clamp(max=vocab - 1)), 0.0)
    inner = inner.double().cumsum(-1)  # [B, width]
    # the chunk's cumulative sum may round below its sum: keep the rest under its last entry
    rest = torch.minimum(x - below, torch.nextafter(inner[:, -1:], zero))  # [B, 1]
    return ids.gather(1, torch.searchsorted(inner, rest, right=True))[:, 0]


def sample_from(probs: Tensor, generator: torch.Generator) -> Tensor:
    """One token per row, by inverting the cumulative distribution with one uniform per row
    (:func:`inverse_cdf`).

    Exact up to float rounding, like ``torch.multinomial``, and about ten times faster on a
    151,936-token vocabulary; a token with zero probability is never drawn.

    Args:
        probs: [B, V] non-negative weights (need not be exactly normalised).
    Returns:
        [B] int64 token ids.
    """
    u = torch.rand(probs.shape[:1], generator=generator, dtype=probs.dtype, device=probs.device)
    return inverse_cdf(probs, u)


class Randomness:
    """The random decisions of one request, all drawn from its own ``torch.Generator``.

    Every random choice the engine makes for a request goes through one of these two calls,
    in a fixed order (its draft tokens, then its verification's coins, then Y), so a
    request's output with a seed does not depend on the other requests of its batch. Tests
    substitute a subclass that enumerates every outcome with its probability
    (:mod:`verispec.theory.replay`), proving the engine itself exact.
    """

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def coins(self, accept_probs: Tensor) -> Tensor:
        """accept_probs [n] -> [n] bool, True with probability accept_probs[i] (independent)."""
        u = torch.rand(accept_probs.shape, generator=self.generator, dtype=accept_probs.dtype,
                       device=accept_probs.device)
        return u < accept_probs  # P(u < h) = h exactly for u in [0, 1)

    def choose(self, probs: Tensor) -> Tensor:
        """probs [M, V] -> [M] int64, one token drawn from each row (M uniforms)."""
        return sample_from(probs, self.generator)


def choose_rows(randoms: Sequence[Randomness], probs: Sequence[Tensor]) -> list[Tensor]:
    """Row k's tokens drawn from ``probs[k]`` [M_k, V] by ``randoms[k]``: the same draws as
    ``randoms[k].choose(probs[k])`` (M_k uniforms from its generator, in row order), with one
    inverse-CDF pass over all rows. A :class:`Randomness` subclass (the exact replay's) is
    asked row by row.

    Returns:
        R tensors [M_k] int64.
    """
    if len(randoms) != len(probs):
        raise ValueError(f"{len(randoms)} random sources for {len(probs)} rows")
    if len(randoms) < 2 or any(type(r).choose is not Randomness.choose for r in randoms):
        return [r.choose(p) for r, p in zip(randoms, probs, strict=True)]
    u = torch.cat([torch.rand(p.shape[:1], generator=r.generator, dtype=p.dtype,
                              device=p.device) for r, p in zip(randoms, probs, strict=True)])
    tokens = inverse_cdf(_stacked(probs), u)  # [ΣM_k]
    return list(tokens.split([p.shape[0] for p in probs]))


def _stacked(parts: Sequence[Tensor]) -> Tensor:
    """[ΣM_k, V]: a view when the parts are consecutive rows of one tensor, else a copy."""
    first = parts[0]
    rows = sum(p.shape[0] for p in parts)
    offset, step = first.storage_offset(), first.stride(0)
    for p in parts:
        if (p.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
                or p.stride() != first.stride() or p.storage_offset() != offset
                or p.dtype != first.dtype):
            return torch.cat(list(parts))
        offset += p.shape[0] * step
    return first.as_strided((rows, first.shape[1]), first.stride(), first.storage_offset())


def warp_rows(logits: Tensor, samplings: Sequence[Sampling], who: str = "model") -> Tensor:
    """Warped probabilities with a :class:`Sampling` per row.

    Args:
        logits: [R, ..., V] raw logits.
        samplings: R warps (rows sharing one warp are warped in one call).
    Returns:
        [R, ..., V] probabilities (float64 for float64 logits, else float32).
    """
    if len(samplings) != logits.shape[0]:
        raise ValueError(f"{len(samplings)} warps for {logits.shape[0]} rows")
    first = samplings[0]
    if all(s == first for s in samplings):
        return first.probs(logits, who)
    out = torch.empty(logits.shape, dtype=torch.float64 if logits.dtype == torch.float64
                      else torch.float32, device=logits.device)
    for s in dict.fromkeys(samplings):
        rows = torch.tensor([i for i, t in enumerate(samplings) if t == s], device=logits.device)
        out[rows] = s.probs(logits[rows], who)
    return out
