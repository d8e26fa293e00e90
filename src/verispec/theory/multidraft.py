"""Exact laws and Theorem 3's closed forms for multi-draft (batch) speculative decoding.

Algorithm 4 / Theorem 3 of theoretical-perspective-speculative-decoding.txt, translated to
p = target, q = draft (the paper uses the opposite letters).

* :func:`multidraft_speculative_law` enumerates every tuple of M i.i.d. drafts and every
  (branch, τ, Y) outcome of :func:`verispec.verify.multidraft.multidraft_law`, with the
  engine's budget rule and :func:`verispec.engine.loop.accept_tokens`; lossless means it
  equals :func:`verispec.theory.exact.target_law`.
* :func:`single_token_rejection` is the exact P(τ = 0) of one iteration, from the library's
  own plan; :func:`theorem3_rejection` is the paper's formula Π_{m=1}^M TV(r^m, q) with
  r^1 = p, r^{m+1} = [r^m - q]_+ normalised, and the batch improvement is
  BI = TV(p, q) - Π_m TV(r^m, q).
* Closed forms of the paper's two examples: Bernoulli (draft Ber(u), target Ber(v), u ≥ v:
  BI = (u - v)(1 - u^{M-1})) and uniform (draft uniform on V tokens, target uniform on a
  subset of V' tokens, r = V / V': BI = (1 - 1/r) - (1 - 1/r)^M).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence

import torch
from torch import Tensor

from verispec.engine.loop import accept_tokens
from verispec.models.toy import TableLM
from verispec.sampling import Sampling
from verispec.theory.exact import Law, warped
from verispec.verify._core import normalise_or
from verispec.verify.multidraft import multidraft_law, multidraft_plan

__all__ = [
    "batch_improvement",
    "bernoulli_batch_improvement",
    "bernoulli_rejection",
    "multidraft_speculative_law",
    "single_token_rejection",
    "theorem3_rejection",
    "uniform_batch_improvement",
    "uniform_rejection",
]


def _num_drafts(num_drafts: int) -> int:
    try:
        m = operator.index(num_drafts)
    except TypeError:
        m = 0
    if isinstance(num_drafts, bool) or m < 1:
        raise ValueError(f"the number of drafts M must be an integer >= 1, got {num_drafts!r}")
    return m


def multidraft_speculative_law(
    target: TableLM,
    draft: TableLM,
    prompt: Sequence[int],
    *,
    num_drafts: int,
    gamma: int,
    sampling: Sampling,
    length: int,
) -> Law:
    """Exact law of the engine's first ``length`` output tokens with ``multidraft``.

    Enumerates V^{γM} draft tuples per iteration: keep V, γ, M and ``length`` tiny.
    """
    m = _num_drafts(num_drafts)
    p, q = warped(target, sampling), warped(draft, sampling)
    v = target.vocab_size
    law: Law = {}

    def walk(ctx: tuple[int, ...], out: tuple[int, ...], prob: float) -> None:
        room = length - len(out)
        g = min(gamma, room - 1)
        rows = m if g > 0 else 1  # the engine drafts nothing (one row) when γ is cut to 0
        blocks = list(itertools.product(range(v), repeat=g))  # every single draft block
        q_blk = torch.stack([torch.stack([q(ctx + b[:i]) for i in range(g)]) if g
                             else torch.zeros((0, v), dtype=torch.float64) for b in blocks])
        p_blk = torch.stack([torch.stack([p(ctx + b[:i]) for i in range(g + 1)]) for b in blocks])
        tok_blk = torch.tensor(blocks, dtype=torch.int64).reshape(len(blocks), g)
        blk_prob = q_blk.gather(-1, tok_blk[..., None]).squeeze(-1).prod(-1)  # [nb]
        combos = torch.tensor(list(itertools.product(range(len(blocks)), repeat=rows)),
                              dtype=torch.int64).reshape(-1, rows)  # [C, M] block indices
        weight = blk_prob[combos].prod(-1)  # [C] probability of the draft tuple
        keep = weight > 0
        combos, weight = combos[keep], weight[keep]
        outcome = multidraft_law(multidraft_plan(p_blk[combos], q_blk[combos], tok_blk[combos]))
        outcome = outcome * weight[:, None, None, None]  # [C, M, g+1, V]
        steps: dict[tuple[tuple[int, ...], str], float] = {}
        for j, tau in itertools.product(range(rows), range(g + 1)):
            per_block = torch.zeros((len(blocks), v), dtype=torch.float64)
            per_block.index_add_(0, combos[:, j], outcome[:, j, tau])  # [nb, V]
            for bi, y in (per_block > 0).nonzero().tolist():
                new, stop = accept_tokens(list(blocks[bi][:tau]) + [y], target.eos_token_ids, room)
                key = (tuple(new), stop)
                steps[key] = steps.get(key, 0.0) + float(per_block[bi, y])
        for (new, stop), step in steps.items():
            if stop:
                law[out + new] = law.get(out + new, 0.0) + prob * step
            else:
                walk(ctx + new, out + new, prob * step)

    walk(tuple(prompt), (), 1.0)
    return law


def single_token_rejection(p: Tensor, q: Tensor, num_drafts: int) -> float:
    """Exact P(τ = 0) of one multi-draft iteration (the first token is rejected by all M
    drafts), for context-independent target p [V] and draft q [V], enumerating the V^M
    first-token tuples through the library's plan (γ = 1)."""
    m = _num_drafts(num_drafts)
    p, q = p.to(torch.float64), q.to(torch.float64)
    v = int(p.shape[0])
    tuples = torch.tensor(list(itertools.product(range(v), repeat=m)), dtype=torch.int64)  # [C, M]
    weight = q[tuples].prod(-1)  # [C]
    c = int(tuples.shape[0])
    plan = multidraft_plan(p.expand(c, m, 2, v), q.expand(c, m, 1, v), tuples[:, :, None])
    law = multidraft_law(plan)  # [C, M, 2, V]
    return float((weight * law[:, 0, 0].sum(-1)).sum())


def theorem3_rejection(p: Tensor, q: Tensor, num_drafts: int) -> float:
    """Theorem 3's single-token rejection Π_{m=1}^M TV(r^m, q), r^1 = p,
    r^{m+1} = [r^m - q]_+ normalised (p = target [V], q = draft [V])."""
    m = _num_drafts(num_drafts)
    r, q = p.to(torch.float64), q.to(torch.float64)
    total = 1.0
    for _ in range(m):
        total *= 0.5 * float((r - q).abs().sum())
        r = normalise_or((r - q).clamp_min(0), r)
    return total


def batch_improvement(p: Tensor, q: Tensor, num_drafts: int) -> float:
    """BI(p, q) = TV(p, q) - Π_{m=1}^M TV(r^m, q) (Theorem 3, single token)."""
    tv = 0.5 * float((p.to(torch.float64) - q.to(torch.float64)).abs().sum())
    return tv - theorem3_rejection(p, q, num_drafts)


def _bernoulli(u: float, v: float) -> None:
    if not (0.0 <= v <= u <= 1.0):
        raise ValueError(
            f"the Bernoulli example needs 0 <= v <= u <= 1 (draft Ber(u), target Ber(v)); got "
            f"u={u}, v={v} (swap the labels 0 and 1 for u < v)"
        )


def bernoulli_batch_improvement(u: float, v: float, num_drafts: int) -> float:
    """BI for draft q = Ber(u), target p = Ber(v), u ≥ v: |u - v|·(1 - u^{M-1})."""
    m = _num_drafts(num_drafts)
    _bernoulli(u, v)
    return (u - v) * (1.0 - u ** (m - 1))


def bernoulli_rejection(u: float, v: float, num_drafts: int) -> float:
    """P(reject) = |u - v| - BI = |u - v|·u^{M-1} for draft Ber(u), target Ber(v), u ≥ v."""
    return (u - v) - bernoulli_batch_improvement(u, v, num_drafts)


def _ratio(r: float) -> None:
    if not r >= 1.0:
        raise ValueError(f"the uniform example needs r = V / V' >= 1, got {r}")


def uniform_batch_improvement(r: float, num_drafts: int) -> float:
    """BI for draft uniform on V tokens, target uniform on V' of them, r = V / V':
    (1 - 1/r) - (1 - 1/r)^M."""
    m = _num_drafts(num_drafts)
    _ratio(r)
    return (1.0 - 1.0 / r) - (1.0 - 1.0 / r) ** m


def uniform_rejection(r: float, num_drafts: int) -> float:
    """P(reject) = TV - BI = (1 - 1/r)^M for the uniform example."""
    return (1.0 - 1.0 / r) - uniform_batch_improvement(r, num_drafts)
