"""The engine's bookkeeping between the target pass and the verifiers.

:func:`score_blocks` runs the one target pass of an iteration over every row's pending
token and draft block(s) (forking a multi-draft row into M cache rows), and returns a
:class:`Scored` that knows where each row's logits are. :func:`gather_verify_batch` cuts a
method's rows out of it as one padded :class:`~verispec.engine.protocols.VerifyBatch`;
:func:`greedy_verdict` is the temperature-0 fast path, which compares draft tokens with the
target's argmax without building any distribution.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from verispec.drafters.base import Draft
from verispec.engine.protocols import Method, VerifyBatch
from verispec.engine.request import Row
from verispec.models.base import CausalLM
from verispec.sampling import warp_rows
from verispec.verify import VerifyResult

__all__ = ["Scored", "gather_verify_batch", "greedy_verdict", "score_blocks"]


@dataclass
class Scored:
    """The target pass of one iteration.

    Attributes:
        logits: [R', k, V] raw logits of every cache row (M_b consecutive rows per row b).
        starts: first cache row of each row.
        forks: cache rows of each row (M_b if it drafted M blocks, else 1).
        offsets: position in ``logits`` of the distribution after row b's pending tokens,
            i.e. of p at draft position 0.
        block_sizes: tokens scored per cache row of row b (pending + γ_b).
    """

    logits: Tensor
    starts: list[int]
    forks: list[int]
    offsets: list[int]
    block_sizes: list[int]

    def keep_branches(self, target: CausalLM, branches: Sequence[int]) -> None:
        """Join every forked row back to its kept draft."""
        if any(f > 1 for f in self.forks):
            target.select_rows([s + (b if f > 1 else 0)
                                for s, f, b in zip(self.starts, self.forks, branches, strict=True)])

    def nll(self, branches: Sequence[int], news: Sequence[Sequence[int]]) -> list[float]:
        """−log p_raw of each row's emitted tokens under the *unwarped* target (every
        row's positions in one flat pass)."""
        owner, rows, pos, tok = [], [], [], []
        for b, new in enumerate(news):
            for j, t in enumerate(new):
                owner.append(b)
                rows.append(self.starts[b] + branches[b])
                pos.append(self.offsets[b] + j)
                tok.append(t)
        if not tok:
            return [0.0] * len(news)
        dev = self.logits.device
        raw = self.logits[torch.tensor(rows, device=dev), torch.tensor(pos, device=dev)]
        # log_softmax is faster than logsumexp on CPU (one fused pass)
        logp = torch.log_softmax(raw.float(), dim=-1)  # [N, V]
        per = -logp.gather(-1, torch.tensor(tok, device=dev)[:, None])[:, 0].double().cpu()  # [N]
        out = torch.zeros(len(news), dtype=torch.float64).index_add_(0, torch.tensor(owner), per)
        return out.tolist()


def score_blocks(target: CausalLM, rows: Sequence[Row], drafts: Sequence[Draft]) -> Scored:
    """Append every row's pending tokens and draft block(s) in one target pass."""
    lengths = target.lengths
    blocks: list[list[int]] = []
    starts, forks, offsets, sizes = [], [], [], []
    for row, n, d in zip(rows, lengths, drafts, strict=True):
        pending = row.context[n:]
        fork = int(d.tokens.shape[0]) if d.gamma > 0 else 1
        starts.append(len(blocks))
        forks.append(fork)
        offsets.append(len(pending) - 1)
        sizes.append(len(pending) + d.gamma)
        tokens = d.tokens.tolist() if d.gamma > 0 else [[]]
        blocks.extend(pending + tokens[m] for m in range(fork))
    if any(f > 1 for f in forks):
        target.select_rows([b for b, f in enumerate(forks) for _ in range(f)])
    logits = target.extend(blocks, check=False)  # [R', k_max, V]; ids checked at submission
    return Scored(logits, starts, forks, offsets, sizes)


def gather_verify_batch(scored: Scored, idx: Sequence[int], rows: Sequence[Row],
                        drafts: Sequence[Draft], method: Method) -> VerifyBatch:
    """The rows ``idx`` of an iteration as one padded batch for ``method``.

    p is warped here, only at the cache rows and positions the rows need."""
    m = method.num_drafts
    gamma = max(d.gamma for d in drafts)
    logits = scored.logits
    dev, vocab = logits.device, logits.shape[-1]
    lengths = torch.tensor([d.gamma for d in drafts], dtype=torch.int64)  # [B]
    simple = len(idx) == 1 and scored.offsets[idx[0]] == 0 and scored.forks[idx[0]] == m
    offset = scored.offsets[idx[0]]
    starts = [scored.starts[i] for i in idx]
    if simple:  # one row, nothing to pad: views only
        s = scored.starts[idx[0]]
        raw = logits[s : s + m, : gamma + 1][None]  # [1, M, γ+1, V]
    elif (m == 1 and offset + gamma + 1 <= logits.shape[1]
          and starts == list(range(starts[0], starts[0] + len(idx)))
          and all(scored.forks[i] == 1 and scored.offsets[i] == offset for i in idx)):
        # consecutive single cache rows with the same offset: a view, no gathered copy
        # (positions past a row's γ_b hold its filler's logits, never read)
        raw = logits[starts[0] : starts[0] + len(idx), offset : offset + gamma + 1, None]
        raw = raw.transpose(1, 2)  # [B, 1, γ+1, V]
    else:
        cache_rows = torch.tensor([[scored.starts[i] + (j if scored.forks[i] > 1 else 0)
                                    for j in range(m)] for i in idx], device=dev)  # [B, M]
        pos = torch.tensor([[min(scored.offsets[i] + t, logits.shape[1] - 1)
                             for t in range(gamma + 1)] for i in idx], device=dev)  # [B, γ+1]
        raw = logits[cache_rows[:, :, None], pos[:, None, :]]  # [B, M, γ+1, V]
    p = warp_rows(raw, [r.sampling for r in rows], rows[0].method.name)
    if simple and drafts[0].probs is not None:
        q = drafts[0].probs[None].to(device=dev, dtype=p.dtype)  # [1, M, γ, V]
        tokens = drafts[0].tokens[None].to(dev)  # [1, M, γ]
    else:
        q, tokens = _pad_drafts(drafts, m, gamma, vocab, p.dtype, dev)
    next_probs = joint = None
    if method.needs_next_probs:
        next_probs = torch.stack([d.next_probs.to(dev, p.dtype) if d.next_probs is not None
                                  else torch.zeros((m, vocab), dtype=p.dtype, device=dev)
                                  for d in drafts])  # [B, M, V]
    if any(d.joint is not None for d in drafts):
        joint = torch.stack([_pad(d.joint.expand(m, -1) if d.joint is not None else
                                  torch.ones((m, 0), dtype=torch.float64), gamma, 1.0)
                             for d in drafts]).to(dev)  # [B, M, γ]
    return VerifyBatch(p, q, tokens, lengths.to(dev), next_probs, joint,
                       [r.random for r in rows], [r.state for r in rows])


def _pad_drafts(drafts: Sequence[Draft], m: int, gamma: int, vocab: int, dtype: torch.dtype,
                device: torch.device) -> tuple[Tensor, Tensor]:
    """q [B, M, γ, V] and tokens [B, M, γ], padded past each γ_b with token 0 drawn from a
    one-hot q (finite ratios in positions that are never read)."""
    q = torch.empty((len(drafts), m, gamma, vocab), dtype=dtype, device=device)
    tokens = torch.zeros((len(drafts), m, gamma), dtype=torch.int64, device=device)
    for b, d in enumerate(drafts):
        g = d.gamma if d.probs is not None else 0  # no q: one-hot everywhere
        if g < gamma:  # written once: zeros and the one-hot at token 0
            q[b, :, g:] = 0.0
            q[b, :, g:, 0] = 1.0
        if d.gamma == 0:
            continue
        # copy_ converts device and dtype while it writes: no intermediate copy of q
        tokens[b, :, :d.gamma].copy_(d.tokens.expand(m, d.gamma))
        if d.probs is not None:
            q[b, :, :g].copy_(d.probs.expand(m, g, vocab))
    return q, tokens


def _pad(x: Tensor, width: int, value: float) -> Tensor:
    return torch.nn.functional.pad(x, (0, width - x.shape[-1]), value=value)


def greedy_verdict(scored: Scored, idx: Sequence[int], drafts: Sequence[Draft]) -> VerifyResult:
    """Temperature 0 for a matching method: τ = the longest prefix of draft tokens equal to
    the target's argmax, Y = the argmax after it. Identical, token for token, to verifying
    one-hot p and q."""
    logits = scored.logits
    gamma = max(d.gamma for d in drafts)
    rows = torch.tensor([scored.starts[i] for i in idx], device=logits.device)
    pos = torch.tensor([[min(scored.offsets[i] + t, logits.shape[1] - 1) for t in range(gamma + 1)]
                        for i in idx], device=logits.device)  # [B, γ+1]
    best = logits[rows[:, None], pos].argmax(dim=-1)  # [B, γ+1]
    tokens = torch.zeros((len(idx), gamma), dtype=torch.int64, device=logits.device)
    for b, d in enumerate(drafts):
        tokens[b, : d.gamma] = d.tokens[0].to(logits.device)
    lengths = torch.tensor([d.gamma for d in drafts], device=logits.device)[:, None]  # [B, 1]
    within = torch.arange(gamma, device=logits.device)[None] < lengths  # [B, γ]
    match = (tokens == best[:, :gamma]) & within
    tau = match.to(torch.int64).cumprod(dim=1).sum(dim=1)  # [B]
    return VerifyResult(num_accepted=tau, next_token=best.gather(1, tau[:, None])[:, 0])
