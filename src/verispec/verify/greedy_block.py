"""Greedy block verification and the distribution modification (Appendix C of
*Block Verification Accelerates Speculative Decoding*, Sun et al., ICLR 2025: Algorithms 4,
5 and 6).

**Algorithm 4 alone is NOT lossless across iterations.** One iteration of it emits
(X^τ, Y) such that (X^τ, Y, Z) follows the target when the next γ−τ−1 tokens Z are drawn
from a *modified* target Mnew (Lemma 8). Algorithm 6 therefore modifies the target after
every iteration (Algorithm 5); only with that modification is the output distribution the
target's. :func:`greedy_block_verify` is the single-iteration verifier; the lossless method
with its cross-iteration state is :mod:`verispec.methods.greedy_block`.

Algorithm 4 (``rule = "last_accept"``). With p_0 = 1 and p_i = p_{i-1} p(X_i)/q(X_i)
(no min: p_i = p(X^i)/q(X^i), the joint ratio):

* h_i = Σ_x max{p_i p(x|X^i) − q(x|X^i), 0} / Σ_x max{q(x|X^i) − p_i p(x|X^i), 0} for
  i < γ, clamped to [0, 1] (a zero denominator accepts); h_γ = min{1, p_γ};
* τ is the largest accepted i (0 if none);
* Y ~ max{p_τ p(·|X^τ) − q(·|X^τ), 0} normalised if τ < γ (equation 30), else p(·|X^γ).

Algorithm 5 (equation 31). After emitting O = (X^τ, Y) from the iteration's start c, the
next γ−τ−1 positions use Mnew(x | c, O, z) ∝ max{Mb(c, O, z, x) − Ms(c, O, z, x), 0} with
*joint* probabilities from c. Dividing by the draft joint Ms(c, O, z) gives the form used
here: Mnew(x | ·) ∝ max{r p(x|·) − q(x|·), 0} with r = Mb(O, z)/Ms(O, z) the joint ratio
along the path, updated r ← r p(x)/q(x) as tokens are appended. r = +inf (the draft joint
is zero, possible with top-k/top-p/greedy warps) means Ms(O, z, ·) = 0, so Mnew = Mb.

Algorithm 6 line 6 modifies the *current* target, which may already be modified: the
state is a stack of layers (:class:`Modifications`), oldest first; each layer modifies the
output of the layers below it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from verispec.verify._core import (
    VerifyPlan,
    VerifyResult,
    check_verifier_inputs,
    draw,
    normalise_or,
    restrict,
    token_prob,
)

__all__ = [
    "Modifications",
    "advance_modifications",
    "greedy_block_plan",
    "greedy_block_verify",
    "modified_targets",
    "modify_layer",
]


def greedy_block_plan(
    target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, *,
    lengths: Tensor | None = None,
) -> VerifyPlan:
    """Acceptance probabilities and residuals of greedy block verification (Algorithm 4).

    Args:
        target_probs: [B, γ+1, V] p (the *current*, possibly modified, target).
        draft_probs: [B, γ, V] q.
        draft_tokens: [B, γ] int64.
        lengths: [B] int64 γ_b ≤ γ for a ragged batch (row b's h_{γ_b} is min{1, p_{γ_b}}).
    """
    check_verifier_inputs(target_probs, draft_probs, draft_tokens)
    b, gamma = draft_tokens.shape
    ratio = token_prob(target_probs, draft_tokens) / token_prob(draft_probs, draft_tokens)  # [B, γ]
    one = torch.ones((b, 1), dtype=target_probs.dtype, device=target_probs.device)
    p_path = torch.cat([one, torch.cumprod(ratio, dim=1)], dim=1)  # [B, γ+1], p_i unclamped
    p_head = target_probs[:, :-1]  # [B, γ, V]
    scaled = p_path[:, :-1, None] * p_head  # [B, γ, V], p_i p(· | X^i)
    weights = (scaled - draft_probs).clamp_min(0)  # [B, γ, V]
    remain = weights.sum(dim=-1)  # [B, γ]  numerator of h_i
    reject = (draft_probs - scaled).clamp_min(0).sum(dim=-1)  # [B, γ]  denominator of h_i
    h_inner = torch.where(reject > 0, remain / torch.where(reject > 0, reject, 1.0), 1.0)
    h_inner = h_inner.clamp(0.0, 1.0)  # [B, γ]
    # h_0 is never used (τ = 0 needs no acceptance); keep h_1..h_{γ-1} and append h_γ.
    h_last = p_path[:, -1:].clamp(max=1.0)  # [B, 1] (p_0 = 1 if γ = 0; then sliced away)
    h = torch.cat([h_inner[:, 1:], h_last], dim=1)[:, :gamma]  # [B, γ]
    residuals = torch.cat([normalise_or(weights, p_head), target_probs[:, -1:]], dim=1)
    return restrict(VerifyPlan(accept_probs=h, residuals=residuals, rule="last_accept"),
                    target_probs, lengths, last_accept=p_path.clamp(max=1.0))


def greedy_block_verify(
    target_probs: Tensor, draft_probs: Tensor, draft_tokens: Tensor, generator: torch.Generator
) -> VerifyResult:
    """One iteration of greedy block verification (Algorithm 4). NOT lossless on its own:
    the next γ−τ−1 tokens must come from the modified target (Algorithms 5 and 6, see
    :class:`verispec.methods.greedy_block.GreedyBlockMethod`). Shapes as in
    :func:`greedy_block_plan`; returns τ [B] and Y [B]."""
    return draw(greedy_block_plan(target_probs, draft_probs, draft_tokens), generator)


@dataclass(frozen=True)
class Modifications:
    """Active distribution modifications (Algorithm 5), oldest layer first.

    Layer l modifies the output of layers 0..l-1 (layer "-1" is the model's target p).

    Attributes:
        ratios: [B, L] float64, r_l = T_{l-1}(path) / q(path): the joint ratio, from the
            start of the iteration that created layer l to the current context, of the
            layer's input target T_{l-1} and the draft q; +inf when q(path) = 0.
        remaining: [B, L] int64, how many upcoming positions layer l still modifies
            (0 = expired; it then acts as the identity).
    """

    ratios: Tensor
    remaining: Tensor

    def __post_init__(self) -> None:
        if self.ratios.dim() != 2 or self.ratios.shape != self.remaining.shape:
            raise ValueError(
                f"ratios and remaining must both be [B, L]; got {tuple(self.ratios.shape)} "
                f"and {tuple(self.remaining.shape)}"
            )
        if self.remaining.dtype != torch.int64:
            raise TypeError(f"remaining must be int64, got {self.remaining.dtype}")

    @staticmethod
    def none(batch: int = 1) -> Modifications:
        """No active modification (the start of a request)."""
        return Modifications(torch.ones((batch, 0), dtype=torch.float64),
                             torch.zeros((batch, 0), dtype=torch.int64))

    @property
    def num_layers(self) -> int:
        return int(self.ratios.shape[1])

    @staticmethod
    def stack(rows: list[Modifications]) -> Modifications:
        """One-row states side by side, padded with expired (identity) layers: [B, L_max]."""
        width = max(m.num_layers for m in rows)
        pad = torch.nn.functional.pad
        return Modifications(
            torch.cat([pad(m.ratios, (0, width - m.num_layers), value=1.0) for m in rows]),
            torch.cat([pad(m.remaining, (0, width - m.num_layers)) for m in rows]))

    def row(self, b: int) -> Modifications:
        """Row b alone, without the layers that expired in it: [1, L_b]."""
        live = self.remaining[b] > 0
        return Modifications(self.ratios[b : b + 1, live], self.remaining[b : b + 1, live])


def _path_ratios(base: Tensor, q_ext: Tensor, tokens: Tensor, ratio: Tensor) -> Tensor:
    """r·base(X^i)/q(X^i) at every position i = 0..G of a draft path: [B, G+1].

    base, q_ext: [B, G+1, V]; tokens: [B, G]; ratio: [B]. A ratio of +inf stays +inf
    (the draft joint stays zero); inf·0 (both joints zero, an unreachable path) gives NaN,
    which the caller treats like inf (falls back to ``base``).
    """
    factors = token_prob(base, tokens) / token_prob(q_ext, tokens)  # [B, G]
    one = torch.ones_like(ratio)[:, None]  # [B, 1]
    return ratio[:, None] * torch.cat([one, torch.cumprod(factors, dim=1)], dim=1)


def modify_layer(
    base: Tensor, q_ext: Tensor, tokens: Tensor, ratio: Tensor, remaining: Tensor
) -> Tensor:
    """One modification layer along a draft path (Algorithm 5, equation 31).

    Row i is Mnew(· | path, X^i) ∝ max{r_i base(·|X^i) − q(·|X^i), 0} with
    r_i = r · base(X^i)/q(X^i), for i < ``remaining``; ``base`` elsewhere.

    Zero-mass rows fall back to ``base``. This is a probability-zero event: if
    max{r_i base − q, 0} = 0 everywhere then, summing, base-joint(path) ≤ q-joint(path), so
    the token that led here had weight max{base-joint − q-joint, 0} = 0 in the previous
    row of this layer (or, at the layer's first position, could not have been drawn as the
    recovered token Y, whose residual weight is that same quantity). The path is therefore
    unreachable under the modified target, whose law does not depend on its conditionals
    there; and any lossless verifier is lossless whatever they are.

    Args:
        base: [B, G+1, V] the layer's input target along the path.
        q_ext: [B, G+1, V] q along the path, row G = q after X_G (only read where modified).
        tokens: [B, G] int64 draft tokens.
        ratio: [B] float64 joint ratio at the current context.
        remaining: [B] int64 positions still modified.
    Returns:
        [B, G+1, V] the layer's output.
    """
    g1 = base.shape[1]
    r = _path_ratios(base, q_ext, tokens, ratio.to(base.dtype))  # [B, G+1]
    finite = torch.isfinite(r)  # inf: q-joint is 0, Mnew = base; NaN: unreachable path
    r_safe = torch.where(finite, r, torch.ones_like(r))
    row = normalise_or((r_safe[..., None] * base - q_ext).clamp_min(0), base)  # [B, G+1, V]
    pos = torch.arange(g1, device=base.device)[None, :]  # [1, G+1]
    active = (pos < remaining[:, None]) & finite  # [B, G+1]
    return torch.where(active[..., None], row, base)


def modified_targets(
    target_probs: Tensor, q_ext: Tensor, tokens: Tensor, mods: Modifications
) -> Tensor:
    """Every layer's target along a draft path: [L+1, B, G+1, V].

    Entry 0 is the model's p, entry l+1 the output of layer l; the last entry is the
    effective target that Algorithm 6 verifies against.

    Args:
        target_probs: [B, G+1, V] p. q_ext: [B, G+1, V] q at positions 0..G (row G only
        read where a layer still modifies position G). tokens: [B, G] int64.
    """
    b, g1, v = target_probs.shape
    if q_ext.shape != (b, g1, v) or tokens.shape != (b, g1 - 1):
        raise ValueError(
            f"modified_targets needs q_ext {(b, g1, v)} and tokens {(b, g1 - 1)} for target_probs "
            f"{tuple(target_probs.shape)}; got {tuple(q_ext.shape)} and {tuple(tokens.shape)}"
        )
    if mods.ratios.shape[0] != b:
        raise ValueError(f"modifications hold {mods.ratios.shape[0]} rows, the batch has {b}")
    layers = [target_probs]
    for j in range(mods.num_layers):
        ratio, remaining = mods.ratios[:, j], mods.remaining[:, j]  # [B], [B]
        layers.append(modify_layer(layers[-1], q_ext, tokens, ratio, remaining))
    return torch.stack(layers)


def advance_modifications(
    mods: Modifications, layers: Tensor, q_ext: Tensor, tokens: Tensor, tau: Tensor, y: Tensor,
    lengths: Tensor | None = None,
) -> Modifications:
    """The state after an iteration emitted X_1..X_τ, Y (Algorithm 6, line 6).

    Every active layer advances its ratio along the emitted tokens (with its own input
    target) and loses τ+1 positions; if τ < G a new layer starts, modifying the current
    effective target for the next G−τ−1 positions, with r_0 = T(X^τ, Y)/q(X^τ, Y).

    Args:
        mods: the state the iteration verified with.
        layers: [L+1, B, G+1, V] from :func:`modified_targets` for that iteration.
        q_ext: [B, G+1, V]; tokens: [B, G]; tau: [B] int64 τ; y: [B] int64 Y.
        lengths: [B] int64 γ_b of a ragged batch (the new layer of row b covers γ_b−τ−1).
    """
    _, b, g1, _ = layers.shape
    gamma = g1 - 1 if lengths is None else lengths.to(tau.device)
    pos = torch.arange(g1, device=tokens.device)[None, :]  # [1, G+1]
    emitted = torch.cat([tokens, y[:, None]], dim=1)  # [B, G+1]; Y placed at column τ below
    emitted = torch.where(pos == tau[:, None], y[:, None], emitted)  # [B, G+1]
    on_path = pos <= tau[:, None]  # [B, G+1] bool: positions 0..τ
    q_e = q_ext.gather(-1, emitted[..., None]).squeeze(-1)  # [B, G+1]
    ratios, remaining = [], []
    for j in range(mods.num_layers + 1):
        t_e = layers[j].gather(-1, emitted[..., None]).squeeze(-1)  # [B, G+1]
        # Π over positions 0..τ of T(x)/q(x); positions after τ contribute a factor 1.
        step = torch.where(on_path, t_e / q_e, torch.ones_like(t_e)).prod(dim=1)  # [B]
        if j < mods.num_layers:
            r, n = mods.ratios[:, j].to(layers.dtype), mods.remaining[:, j] - tau - 1
        else:  # the new layer starts at the iteration's start with ratio 1
            r, n = torch.ones(b, dtype=layers.dtype, device=layers.device), gamma - tau - 1
        r_new = torch.where(torch.isinf(r), r, r * step)  # a zero draft joint stays zero
        alive = n > 0
        ratios.append(torch.where(alive, r_new, torch.ones_like(r_new)))
        remaining.append(n.clamp_min(0))
    ratio_t, rem_t = torch.stack(ratios, dim=1), torch.stack(remaining, dim=1)  # [B, L+1]
    keep = (rem_t > 0).any(dim=0)  # drop layers that expired in every row
    return Modifications(ratio_t[:, keep].to(torch.float64), rem_t[:, keep])
