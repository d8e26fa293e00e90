"""Does a method's (or peer's) output follow the target's law? A check for every bench row.

For each emitted token x_i, under the target's tempered distribution p_T at its context:

* z_i = −log p_T(x_i) − H(p_T) and v_i = Var_{p_T}(−log p_T). For an exact sampler the z_i
  are martingale differences, so Z = Σ z_i / √Σ v_i is approximately N(0, 1) over many
  tokens; a sampler that is too confident (too low a temperature, a greedy-biased draft)
  gives Z ≪ 0, one that is too diffuse Z ≫ 0.
* u_i = P_T(rank < rank(x_i)) + U·p_T(x_i), the randomised probability integral transform
  with the vocabulary sorted by decreasing p_T: exactly i.i.d. uniform on [0, 1) for an exact
  sampler (a Kolmogorov–Smirnov test catches departures that do not move the mean).

A config is flagged when |Z| > ``Z_LIMIT`` or the KS p-value is below ``KS_LIMIT``. The
standard error of the mean NLL is about 1.2/√n nats per token on the embedded pair, so a
bias of 0.1 nats per token is detected with ~2,000 tokens. The target's logits come from
the same one-pass re-scoring that gives the perplexity, so the check costs no extra pass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["KS_LIMIT", "Z_LIMIT", "LawCheck", "law_check", "token_terms"]

Z_LIMIT = 3.3  # two-sided p ≈ 1e-3
KS_LIMIT = 1e-3


def token_terms(logits: Tensor, tokens: Sequence[int], temperature: float,
                generator: torch.Generator) -> tuple[float, float, list[float]]:
    """Σ z_i, Σ v_i and the PIT values u_i of ``tokens`` under the tempered target.

    Args:
        logits: [n, V] raw target logits; row i is the distribution of tokens[i].
        tokens: the n emitted tokens.
        temperature: T > 0 the tokens were sampled at.
        generator: randomises the PIT within a token's probability.
    """
    logp = torch.log_softmax(logits.double() / temperature, dim=-1)  # [n, V]
    p = logp.exp()
    ent = -(p * logp).sum(-1)  # [n] H(p_T)
    var = (p * logp.square()).sum(-1) - ent.square()  # [n] Var(−log p_T)
    idx = torch.tensor(list(tokens), device=logp.device)[:, None]
    nll = -logp.gather(-1, idx)[:, 0]  # [n]
    p_x = p.gather(-1, idx)[:, 0]
    order = torch.sort(p, dim=-1, descending=True, stable=True)  # rank by decreasing p
    rank = torch.empty_like(order.indices)
    rank.scatter_(-1, order.indices, torch.arange(p.shape[-1], device=p.device).expand_as(rank))
    before = torch.cumsum(order.values, dim=-1) - order.values  # mass strictly before
    u0 = before.gather(-1, rank.gather(-1, idx))[:, 0]
    jitter = torch.rand(len(tokens), generator=generator, dtype=torch.float64)
    u = (u0 + jitter.to(p.device) * p_x).clamp(0.0, 1.0)
    return float((nll - ent).sum()), float(var.sum()), u.tolist()


@dataclass
class LawCheck:
    """The check over all tokens of one config."""

    tokens: int
    z: float
    ks_pvalue: float
    excess_nll: float  # mean (−log p_T − H) per token
    flagged: bool


def law_check(z_sum: float, v_sum: float, pits: Sequence[float]) -> LawCheck:
    """Combine the per-row sums and PIT values of one config."""
    n = len(pits)
    z = z_sum / math.sqrt(v_sum) if v_sum > 0 else 0.0
    ks = _ks_pvalue(sorted(pits)) if n else 1.0
    return LawCheck(n, z, ks, z_sum / n if n else 0.0, abs(z) > Z_LIMIT or ks < KS_LIMIT)


def _ks_pvalue(sorted_u: Sequence[float]) -> float:
    """Kolmogorov–Smirnov test of uniformity on [0, 1) (asymptotic p-value)."""
    n = len(sorted_u)
    d = max(max((i + 1) / n - u, u - i / n) for i, u in enumerate(sorted_u))
    lam = (math.sqrt(n) + 0.12 + 0.11 / math.sqrt(n)) * d
    total = sum(2 * (-1) ** (k - 1) * math.exp(-2 * k * k * lam * lam) for k in range(1, 101))
    return min(1.0, max(0.0, total))
