"""Verifiers: pure, batched functions over tensors (no model inside).

The single-draft verifiers (:func:`token_verify`, :func:`block_verify`,
:func:`greedy_block_verify`) have the signature of :class:`Verifier`::

    verify(target_probs [B, γ+1, V], draft_probs [B, γ, V], draft_tokens [B, γ] int64,
           generator) -> VerifyResult(num_accepted [B], next_token [B])

Greedy block verification on its own is the BIASED variant: it is lossless only together
with the distribution modification of :class:`verispec.methods.greedy_block.GreedyBlockMethod`.
Verifiers with extra parameters or inputs (``lossy_verify(..., epsilon, residual)``,
``multidraft_verify`` over [B, M, ...], ``mjsd_verify`` over joint draft probabilities) take
them besides.

See :mod:`verispec.verify._core` for the vocabulary (accepted, recovered, bonus).
"""

from __future__ import annotations

from verispec.verify._core import (
    Verifier,
    VerifyPlan,
    VerifyResult,
    draw,
    draw_rows,
    plan_law,
    restrict,
)
from verispec.verify.block import block_plan, block_verify
from verispec.verify.greedy_block import greedy_block_plan, greedy_block_verify
from verispec.verify.lossy import lossy_plan, lossy_verify
from verispec.verify.mjsd import mjsd_verify
from verispec.verify.multidraft import multidraft_law, multidraft_plan, multidraft_verify
from verispec.verify.token import token_plan, token_verify

__all__ = [
    "Verifier",
    "VerifyPlan",
    "VerifyResult",
    "block_plan",
    "block_verify",
    "draw",
    "draw_rows",
    "greedy_block_plan",
    "greedy_block_verify",
    "lossy_plan",
    "lossy_verify",
    "mjsd_verify",
    "multidraft_law",
    "multidraft_plan",
    "multidraft_verify",
    "plan_law",
    "restrict",
    "token_plan",
    "token_verify",
]
