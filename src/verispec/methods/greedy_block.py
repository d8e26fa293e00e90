"""Greedy block verification as a method: Algorithm 6 (Appendix C) of *Block Verification
Accelerates Speculative Decoding* (Sun et al., ICLR 2025).

``greedy-block`` is **lossless**: every iteration runs Algorithm 4 (greedy block
verification) against the *current* target, then modifies that target for the next
γ−τ−1 positions (Algorithm 5, equation 31); Lemma 8 makes the output follow the target.
In one iteration it accepts at least as many draft tokens as block verification in
expectation (Theorem 3); across iterations the modified target can lower acceptance, and the
paper measures it below block verification (Table 4), so ``block`` stays the recommendation.

``greedy-block-unmodified`` is **BIASED** (not lossless): Algorithm 4 with the plain
target every iteration. It exists only to reproduce the paper's counterexample (A/B toy
models, γ = 2: P(first two tokens = BA) = 1/3 instead of 2/9).

Drafter requirement: the modification evaluates the draft distribution q beyond the block
it drafted, at later contexts, so q must be one fixed function of the context — the model
drafter. The method asks for ``next_probs`` (q after the block); the n-gram drafter refuses
that request, and :meth:`GreedyBlockMethod.verify` refuses a draft without it wherever a
modification layer reaches the end of the block (the only place it is read).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from verispec.engine.protocols import Method, VerifyBatch
from verispec.methods.registry import MethodInfo
from verispec.sampling import Sampling
from verispec.verify import VerifyResult, draw_rows, plan_law
from verispec.verify.greedy_block import (
    Modifications,
    advance_modifications,
    greedy_block_plan,
    modified_targets,
)

__all__ = ["GREEDY_BLOCK", "GREEDY_BLOCK_UNMODIFIED", "GreedyBlockMethod"]


class GreedyBlockMethod(Method):
    """Speculative decoding with greedy block verification (Algorithm 6, Appendix C).

    Lossless when ``modify=True`` (Lemma 8); ``modify=False`` drops Algorithm 5 and is
    biased (the paper's counterexample), for demonstrations only.

    State per request: the active modifications (:class:`~verispec.verify.greedy_block.
    Modifications`, one row). Under a fixed γ and the engine's budget rule
    (γ_t = min(γ, room − 1)) a layer never reaches the bonus position: a new layer covers
    γ_t−τ−1 positions while room shrinks by τ+1, so remaining ≤ γ_{t+1}. A varying γ can
    reach it, which is why ``next_probs`` (q after the block) is always requested.
    """

    needs_next_probs = True

    def __init__(self, *, modify: bool = True) -> None:
        self.modify = modify
        self.name = "greedy-block" if modify else "greedy-block-unmodified"
        self.lossless = modify
        self.plan = greedy_block_plan

    def new_state(self) -> Modifications:
        return Modifications.none(1)

    def verify(self, batch: VerifyBatch) -> VerifyResult:
        """Greedy block verification of every row against its current (modified) target.

        Args:
            batch: target_probs [B, 1, γ+1, V], draft q [B, 1, γ, V], next_probs [B, 1, V].
        """
        if batch.draft_tokens.shape[1] != 1:
            raise ValueError(f"{self.name} verifies a single draft per iteration")
        p = batch.target_probs[:, 0].to(torch.float64)  # [B, γ+1, V]; float64 keeps ratios exact
        q = batch.draft_probs[:, 0].to(torch.float64)  # [B, γ, V]
        tokens, lengths = batch.draft_tokens[:, 0], batch.lengths  # [B, γ], [B]
        ragged = lengths if batch.ragged else None
        if not self.modify:
            return draw_rows(greedy_block_plan(p, q, tokens, lengths=ragged), batch.randoms)
        mods = Modifications.stack(batch.states)  # [B, L]
        q_ext = self._q_ext(p, q, batch.next_probs, lengths, mods)  # [B, γ+1, V]
        layers = modified_targets(p, q_ext, tokens, mods)  # [L+1, B, γ+1, V]
        result = draw_rows(greedy_block_plan(layers[-1], q, tokens, lengths=ragged), batch.randoms)
        new = advance_modifications(mods, layers, q_ext, tokens, result.num_accepted,
                                    result.next_token, lengths)
        for b in range(len(batch.states)):
            batch.states[b] = new.row(b)
        return result

    def _q_ext(self, p: Tensor, q: Tensor, next_probs: Tensor | None, lengths: Tensor,
               mods: Modifications) -> Tensor:
        """q at positions 0..γ of every row: the draft's q, and q after the block at γ_b."""
        b = p.shape[0]
        rows, ends = torch.arange(b, device=p.device), lengths.to(p.device)
        q_ext = torch.cat([q, p[:, -1:]], dim=1)  # [B, γ+1, V]; positions beyond γ_b unread
        after = torch.zeros_like(p[:, 0]) if next_probs is None else next_probs[:, 0].to(p.dtype)
        have = after.sum(-1) > 0  # [B]
        reach = (mods.remaining.to(p.device) > ends[:, None]).any(dim=1)  # a layer reaches γ_b
        if bool((reach & ~have).any()):
            raise ValueError(
                f"{self.name} needs the draft distribution after the block (next_probs), i.e. "
                "a drafter whose q is a fixed function of the context: use the model drafter")
        q_ext[rows, ends] = torch.where(have[:, None], after, p[rows, ends])  # p: never read
        return q_ext


def _step(method: GreedyBlockMethod, target: Any, draft: Any, gamma: int,
          sampling: Sampling) -> Any:
    """Algorithm 6's step law: every draft block and (τ, Y), carrying the modifications."""
    from verispec.engine.exact import Outcome, clamp, draft_blocks, warped

    q = warped(draft, sampling)

    def step(ctx: tuple[int, ...], room: int, mods: Modifications) -> Iterable[Outcome]:
        g = min(gamma, room - 1)
        for block, prob, p_rows, q_rows in draft_blocks(target, draft, ctx, g, sampling):
            q_ext = torch.cat([q_rows, q(ctx + block)[None]])[None]  # [1, g+1, V]
            tokens = torch.tensor([block], dtype=torch.int64).reshape(1, g)
            layers = modified_targets(p_rows[None], q_ext, tokens, mods) if method.modify \
                else p_rows[None, None]
            outcome = plan_law(greedy_block_plan(layers[-1], q_ext[:, :g], tokens))[0]
            for tau, y in (outcome > 0).nonzero().tolist():
                new, stop = clamp(list(block[:tau]) + [y], target.eos_token_ids, room)
                nxt = mods
                if method.modify and not stop:
                    nxt = advance_modifications(mods, layers, q_ext, tokens,
                                                torch.tensor([tau]), torch.tensor([y]))
                yield new, stop, prob * float(outcome[tau, y]), nxt

    return step


def _law(method: GreedyBlockMethod, target: Any, draft: Any, prompt: Sequence[int], *,
         gamma: int, sampling: Sampling, length: int,
         draft_stop: float | None = None) -> tuple[dict, float | None]:
    """Exact law of Algorithm 6 (or of Algorithm 4 alone, ``modify=False``)."""
    from verispec.engine.exact import expected_accepted, walk

    if draft_stop is not None:
        raise ValueError(f"draft_stop is not defined for {method.name}")
    law = walk(prompt, length, _step(method, target, draft, gamma, sampling), Modifications.none(1))
    first = expected_accepted(target, draft, prompt, plan_fn=greedy_block_plan,
                              gamma=min(gamma, length - 1), sampling=sampling)[0]
    return law, first + 1  # no modification is active at the first iteration


def _build(modify: bool) -> Any:
    def build() -> Method:
        return GreedyBlockMethod(modify=modify)

    return build


GREEDY_BLOCK = MethodInfo(
    "greedy-block", True,
    "greedy block verification with distribution modification (Algorithms 4-6, App. C; "
    "Sun et al. 2025): lossless, needs the model drafter", _build(True), law=_law)
GREEDY_BLOCK_UNMODIFIED = MethodInfo(
    "greedy-block-unmodified", False,
    "BIASED: greedy block verification WITHOUT the modification (Algorithm 4 alone), only to "
    "demonstrate the paper's counterexample", _build(False), law=_law)
