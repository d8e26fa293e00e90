"""Multi-draft speculative decoding as an engine method (``multidraft``).

Algorithm 4 ("Batch Speculative Sampling") of *A Theoretical Perspective for Speculative
Decoding Algorithm* (Yin et al., NeurIPS 2024), verified by
:func:`verispec.verify.multidraft.multidraft_plan`. Lossless (Theorem 3).

Each iteration the drafter samples M i.i.d. drafts of γ tokens from the shared context; the
engine forks the target and scores all M rows in one batched pass, so the target processes
M·(γ+1) token positions per iteration instead of γ+1 (``Stats.target_tokens_scored``). That
extra compute is the price a fair comparison must charge (*Block Verification Accelerates
Speculative Decoding*, Sun et al., ICLR 2025, Appendix D.1): under query batching it is not
free.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from verispec.checks import check_positive
from verispec.engine.protocols import Method, VerifyBatch
from verispec.methods.registry import MethodInfo
from verispec.sampling import Sampling
from verispec.verify import VerifyResult
from verispec.verify.multidraft import multidraft_draw_rows, multidraft_law, multidraft_plan

__all__ = ["MULTIDRAFT", "MultiDraftMethod", "multidraft_step"]


class MultiDraftMethod(Method):
    """Depth-first verification of M i.i.d. drafts (Algorithm 4; lossless by Theorem 3).

    With M = 1 it is exactly token verification (Algorithm 1 of *Block Verification
    Accelerates Speculative Decoding*, Sun et al., ICLR 2025).

    Args:
        num_drafts: M ≥ 1, drafts per iteration.
    """

    name = "multidraft"
    lossless = True
    matches_at_greedy = True  # at T = 0 the M drafts coincide: plain matching

    def __init__(self, num_drafts: int = 2) -> None:
        self.num_drafts = check_positive("num_drafts", num_drafts)

    def verify(self, batch: VerifyBatch) -> VerifyResult:
        """Verify the M drafts of every row.

        Args:
            batch: target_probs [B, M, γ+1, V], draft q [B, M, γ, V], tokens [B, M, γ].
        Returns:
            num_accepted [B], next_token [B], extras["branch"] [B].
        """
        rows = int(batch.draft_tokens.shape[1])
        if rows != self.num_drafts:
            raise ValueError(f"{self.name}: expected {self.num_drafts} drafts, got {rows}")
        p = batch.target_probs
        plan = multidraft_plan(p, batch.draft_probs.to(p.dtype), batch.draft_tokens,
                               lengths=batch.lengths if batch.ragged else None)
        return multidraft_draw_rows(plan, batch.randoms)


def multidraft_step(target: Any, draft: Any, num_drafts: int, gamma: int,
                    sampling: Sampling) -> Any:
    """The step law of ``multidraft``: every tuple of M i.i.d. drafts and every outcome of
    :func:`~verispec.verify.multidraft.multidraft_law`, with the engine's budget rule."""
    from verispec.engine.exact import Outcome, clamp, draft_blocks

    m = check_positive("num_drafts", num_drafts)

    def step(ctx: tuple[int, ...], room: int, state: Any) -> Iterable[Outcome]:
        g = min(gamma, room - 1)
        rows = m if g > 0 else 1  # the engine drafts nothing (one row) when γ is cut to 0
        blocks = draft_blocks(target, draft, ctx, g, sampling)
        p_blk = torch.stack([b[2] for b in blocks])  # [nb, g+1, V]
        q_blk = torch.stack([b[3] for b in blocks])  # [nb, g, V]
        tok = torch.tensor([b[0] for b in blocks], dtype=torch.int64).reshape(len(blocks), g)
        combos = torch.tensor(list(itertools.product(range(len(blocks)), repeat=rows)),
                              dtype=torch.int64).reshape(-1, rows)  # [C, M] block indices
        weight = torch.tensor([b[1] for b in blocks], dtype=torch.float64)[combos].prod(-1)
        law = multidraft_law(multidraft_plan(p_blk[combos], q_blk[combos], tok[combos]))
        law = law * weight[:, None, None, None]  # [C, M, g+1, V]
        out: dict[tuple[tuple[int, ...], bool], float] = {}
        for j, tau in itertools.product(range(rows), range(g + 1)):
            per_block = torch.zeros((len(blocks), law.shape[-1]), dtype=torch.float64)
            per_block.index_add_(0, combos[:, j], law[:, j, tau])  # [nb, V]
            for bi, y in (per_block > 0).nonzero().tolist():
                key = clamp(list(blocks[bi][0][:tau]) + [y], target.eos_token_ids, room)
                out[key] = out.get(key, 0.0) + float(per_block[bi, y])
        return [(new, stop, w, None) for (new, stop), w in out.items()]

    return step


def _law(method: MultiDraftMethod, target: Any, draft: Any, prompt: Sequence[int], *,
         gamma: int, sampling: Sampling, length: int,
         draft_stop: float | None = None) -> tuple[dict, float | None]:
    from verispec.engine.exact import first_step_tokens, walk

    if draft_stop is not None:
        raise ValueError("draft_stop is not defined for multidraft")
    step = multidraft_step(target, draft, method.num_drafts, gamma, sampling)
    return walk(prompt, length, step), first_step_tokens(step, prompt, length)


MULTIDRAFT = MethodInfo(
    "multidraft", True,
    "multi-draft speculative decoding (Algorithm 4 of Yin et al. 2024): M i.i.d. drafts "
    "(num_drafts, default 2) verified depth-first; lossless, costs M·(γ+1) target tokens",
    MultiDraftMethod, law=_law,
)
