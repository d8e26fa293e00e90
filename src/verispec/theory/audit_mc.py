"""The sampling path of ``verispec audit``: a user verifier whose randomness is hidden in the
request's ``torch.Generator`` (core signature ``f(p, q, tokens, generator) -> VerifyResult``).

Every draft block is still enumerated with its exact q-probability; only the law of (τ, Y)
given a block is estimated, from ``samples`` rows of one batched call. The decision is
statistical: each sequence's deviation from the target law is divided by its bootstrap
standard error (every node's counts redrawn from its own empirical law, the sequence law
recomposed; floored by √(p(s)(1 − p(s))/samples) for outcomes never drawn), and the largest
z is compared with the Bonferroni critical value for a family-wise error rate α.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import torch
from torch import Tensor

from verispec.engine.exact import Law, Outcome, Step, clamp, draft_blocks, walk
from verispec.models.toy import TableLM
from verispec.sampling import Sampling
from verispec.verify import VerifyResult

__all__ = ["mc_audit"]




@dataclass
class _MCNode:
    blocks: list[tuple[tuple[int, ...], float]]  # (block, q-probability)
    counts: list[Tensor]  # per block: [g+1, V] counts of (τ, Y)


def _mc_nodes(verifier: Callable[..., VerifyResult], target: TableLM, draft: TableLM,
              sampling: Sampling, gamma: int, samples: int,
              generator: torch.Generator) -> Callable[[tuple[int, ...], int], _MCNode]:
    cache: dict[tuple[tuple[int, ...], int], _MCNode] = {}

    def node(ctx: tuple[int, ...], g: int) -> _MCNode:
        key = (ctx, g)
        if key not in cache:
            blocks, counts = [], []
            for block, prob, p_rows, q_rows in draft_blocks(target, draft, ctx, g, sampling):
                v = p_rows.shape[-1]
                p_b = p_rows[None].expand(samples, g + 1, v).contiguous()  # [N, g+1, V]
                q_b = q_rows[None].expand(samples, g, v).contiguous()  # [N, g, V]
                t_b = torch.tensor([block], dtype=torch.int64).reshape(1, g).expand(samples, g)
                res = verifier(p_b, q_b, t_b.contiguous(), generator)
                tau, y = res.num_accepted.reshape(-1).long(), res.next_token.reshape(-1).long()
                if tau.shape != (samples,) or y.shape != (samples,):
                    raise ValueError(f"the verifier returned num_accepted {tuple(res.num_accepted.shape)}"
                                     f" and next_token {tuple(res.next_token.shape)} for {samples} rows")
                if bool(((tau < 0) | (tau > g)).any()) or bool(((y < 0) | (y >= v)).any()):
                    raise ValueError("the verifier returned τ outside [0, γ] or Y outside the vocabulary")
                cnt = torch.zeros((g + 1) * v, dtype=torch.float64)
                cnt.index_add_(0, tau * v + y, torch.ones(samples, dtype=torch.float64))
                blocks.append((block, prob))
                counts.append(cnt.reshape(g + 1, v))
            cache[key] = _MCNode(blocks, counts)
        return cache[key]

    return node


def _mc_step(node_fn: Callable[[tuple[int, ...], int], _MCNode], gamma: int, eos: frozenset[int],
             counts_of: Callable[[tuple[int, ...], int, int, Tensor], Tensor]) -> Step:
    def step(ctx: tuple[int, ...], room: int, state: object) -> list[Outcome]:
        g = min(gamma, room - 1)
        nd = node_fn(ctx, g)
        out: dict[tuple[tuple[int, ...], bool], float] = {}
        for i, ((block, prob), cnt) in enumerate(zip(nd.blocks, nd.counts, strict=True)):
            c = counts_of(ctx, g, i, cnt)
            law = c / c.sum()
            for tau, y in (law > 0).nonzero().tolist():
                key = clamp(list(block[:tau]) + [y], eos, room)
                out[key] = out.get(key, 0.0) + prob * float(law[tau, y])
        return [(new, stop, w, None) for (new, stop), w in out.items()]

    return step



def mc_audit(fn: Callable[..., VerifyResult], target: TableLM, draft: TableLM, prompt: Sequence[int],
              sampling: Sampling, gamma: int, length: int, reference: Law, samples: int, alpha: float,
              bootstrap: int, seed: int) -> tuple[Law, float, float, float]:
    """Law estimate, first-iteration E[tokens], largest bootstrap z, critical z."""
    generator = torch.Generator().manual_seed(seed)
    node_fn = _mc_nodes(fn, target, draft, sampling, gamma, samples, generator)
    eos = target.eos_token_ids
    law = walk(prompt, length, _mc_step(node_fn, gamma, eos, lambda c, g, i, cnt: cnt))
    first = _mc_step(node_fn, gamma, eos, lambda c, g, i, cnt: cnt)(tuple(prompt), length, None)
    expected = sum(len(new) * w for new, _, w, _ in first)
    # Bootstrap: redraw every node's counts from its own empirical law (multinomial, drawn
    # as a chain of binomials for all replicates at once), then recompose each replicate.
    boot_gen = torch.Generator().manual_seed(seed + 1)
    keys = sorted(set(law) | set(reference))
    redrawn: dict[tuple[tuple[int, ...], int, int], Tensor] = {}  # -> [R, g+1, V]

    def replicate(r: int) -> Callable[[tuple[int, ...], int, int, Tensor], Tensor]:
        def counts(ctx: tuple[int, ...], g: int, i: int, cnt: Tensor) -> Tensor:
            if (ctx, g, i) not in redrawn:
                redrawn[(ctx, g, i)] = _multinomial_counts(cnt, bootstrap, boot_gen)
            return redrawn[(ctx, g, i)][r]

        return counts

    reps = []
    for r in range(bootstrap):
        rep = walk(prompt, length, _mc_step(node_fn, gamma, eos, replicate(r)))
        reps.append([rep.get(k, 0.0) for k in keys])
    boot_se = torch.tensor(reps, dtype=torch.float64).std(dim=0)  # [K]
    # The bootstrap sees no variance in outcomes that were never drawn (zero counts), so a rare
    # sequence would get se = 0. Floor: the binomial SE of a frequency with the target's own
    # probability over `samples` draws, a bound on the variance of the weighted node estimates.
    ref = torch.tensor([reference.get(k, 0.0) for k in keys], dtype=torch.float64)  # [K]
    se = torch.maximum(boot_se, (ref * (1 - ref) / samples).sqrt())
    dev = torch.tensor([abs(law.get(k, 0.0) - reference.get(k, 0.0)) for k in keys], dtype=torch.float64)
    z = torch.where(se > 0, dev / torch.where(se > 0, se, torch.ones_like(se)),
                    torch.where(dev > 1e-9, torch.full_like(dev, math.inf), torch.zeros_like(dev)))
    z_crit = NormalDist().inv_cdf(1 - alpha / (2 * max(len(keys), 1)))
    return law, expected, float(z.max()), z_crit


def _multinomial_counts(counts: Tensor, replicates: int, generator: torch.Generator) -> Tensor:
    """``replicates`` draws of Multinomial(n, counts / n), n = counts.sum(): [R, *counts.shape]."""
    flat = counts.flatten()
    n = float(flat.sum())
    out = torch.zeros((replicates, flat.numel()), dtype=torch.float64)
    left = torch.full((replicates,), n, dtype=torch.float64)
    mass = n
    for k in range(flat.numel()):
        share = float(flat[k]) / mass if mass > 0 else 0.0
        if share > 0:
            draw = left if share >= 1 else torch.binomial(left, torch.full_like(left, share),
                                                          generator=generator)
            out[:, k] = draw
            left = left - draw
        mass -= float(flat[k])
    return out.reshape(replicates, *counts.shape)
