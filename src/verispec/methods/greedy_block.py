"""Greedy block verification as a method: Algorithm 6 of block-verification.txt (Appendix C).

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
that request, and :meth:`GreedyBlockMethod.verify` refuses a non-empty draft without it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from verispec.drafters.base import Draft
from verispec.engine.methods import Method
from verispec.methods import MethodInfo, register
from verispec.verify import VerifyResult, draw
from verispec.verify.greedy_block import (
    Modifications,
    advance_modifications,
    greedy_block_plan,
    modified_targets,
)

__all__ = ["GreedyBlockMethod"]


class GreedyBlockMethod(Method):
    """Speculative decoding with greedy block verification (Algorithm 6, Appendix C).

    Lossless when ``modify=True`` (Lemma 8); ``modify=False`` drops Algorithm 5 and is
    biased (the paper's counterexample), for demonstrations only.

    State: the active modifications (:class:`~verispec.verify.greedy_block.Modifications`),
    cleared by :meth:`reset`. Under the engine's budget rule (γ_t = min(γ, room − 1)) a layer
    never reaches the bonus position: a new layer covers γ_t−τ−1 positions while room shrinks
    by τ+1, so remaining ≤ γ_{t+1}. ``next_probs`` is still requested so that a shorter
    draft cannot silently need q where none was given.
    """

    needs_next_probs = True

    def __init__(self, *, modify: bool = True) -> None:
        self.modify = modify
        self.name = "greedy-block" if modify else "greedy-block-unmodified"
        self.lossless = modify
        self._mods = Modifications.none(1)

    @property
    def modifications(self) -> Modifications:
        """The active modifications (read-only view for tests and teaching)."""
        return self._mods

    def reset(self) -> None:
        self._mods = Modifications.none(1)

    def verify(
        self, target_probs: Tensor, draft: Draft, generator: torch.Generator
    ) -> VerifyResult:
        """Greedy block verification of one draft against the current (modified) target.

        Args:
            target_probs: [1, γ+1, V] warped p along the draft.
            draft: tokens [1, γ], probs [1, γ, V], next_probs [1, V] (required when γ > 0).
        """
        if target_probs.shape[0] != 1 or draft.tokens.shape[0] != 1:
            raise ValueError(f"{self.name} verifies a single draft per iteration")
        p = target_probs.to(torch.float64)  # [1, γ+1, V]; float64 keeps the ratios exact
        q = draft.probs.to(torch.float64)  # [1, γ, V]
        tokens, g = draft.tokens, draft.gamma
        if not self.modify:
            return draw(greedy_block_plan(p, q, tokens), generator)
        if draft.next_probs is not None:
            q_next = draft.next_probs.to(torch.float64)  # [1, V]
        elif g > 0 or bool((self._mods.remaining > g).any()):
            raise ValueError(
                f"{self.name} needs the draft distribution after the block (next_probs), i.e. a "
                "drafter whose q is a fixed function of the context: use drafter='model'"
            )
        else:  # γ = 0 and no layer reaches position 0: the row is never read
            q_next = p[:, g]
        q_ext = torch.cat([q, q_next[:, None]], dim=1)  # [1, γ+1, V]
        layers = modified_targets(p, q_ext, tokens, self._mods)  # [L+1, 1, γ+1, V]
        result = draw(greedy_block_plan(layers[-1], q, tokens), generator)
        self._mods = advance_modifications(
            self._mods, layers, q_ext, tokens, result.num_accepted, result.next_token
        )
        return result


def _build(modify: bool) -> Callable[[], Method]:
    def build() -> Method:
        return GreedyBlockMethod(modify=modify)

    return build


register(MethodInfo(
    "greedy-block", True,
    "greedy block verification with distribution modification (Algorithms 4-6, App. C; "
    "Sun et al. 2025): lossless, needs the model drafter", _build(True)))
register(MethodInfo(
    "greedy-block-unmodified", False,
    "BIASED: greedy block verification WITHOUT the modification (Algorithm 4 alone), only to "
    "demonstrate the paper's counterexample", _build(False)))
