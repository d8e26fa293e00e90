"""The request loop shared by the sequential reference and the concurrent engine.

The loop asks :func:`~verispec.methods.pearl.schedule.next_phase` what to run, draws the
draft's uniforms, hands the phase to an :class:`Executor` (in-process and sequential for the
reference; two worker processes running at the same time for the engine), verifies with
:func:`~verispec.methods.pearl.schedule.resolve` (drawing the verification's uniforms) and
commits the tokens, clamped at EOS and the budget exactly like the main engine. All random
numbers are drawn here, in the same order whatever the executor, so both executors give the
same output for the same seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch
from torch import Tensor

from verispec.engine.request import GenerationOutput, accept_tokens
from verispec.methods.pearl.schedule import (
    PearlConfig,
    PearlState,
    Phase,
    decide_with_uniforms,
    draft_uniforms,
    next_phase,
    resolve,
    verification_uniforms,
)
from verispec.methods.pearl.stats import PearlStats
from verispec.telemetry.timeline import Timeline, now
from verispec.verify import VerifyPlan

__all__ = ["Executor", "run_schedule"]


class Executor(Protocol):
    """Runs the models' side of each phase.

    Attributes:
        timeline: where busy intervals are recorded.
        draft_forwards, target_forwards: forward passes so far (decoding only).
        draft_prefill_calls, target_prefill_calls: prefill forwards (0 or 1 each).
        target_tokens_scored: token positions the target processed while decoding.
    """

    timeline: Timeline
    draft_forwards: int
    target_forwards: int
    draft_prefill_calls: int
    target_prefill_calls: int
    target_tokens_scored: int

    def prefill(self, prompt: Sequence[int]) -> None:
        """Both models process the prompt but its last token (at the same time if possible)."""

    def run_phase(self, phase: Phase, uniforms: Tensor | None) -> tuple[list[int], list[Tensor], Tensor | None]:
        """Run the phase's draft work (with ``uniforms`` [γ]) and target work.

        Returns:
            draft tokens, their q rows ([V] float64 each), and p rows [target_rows, V]
            float64 (None if the target idled). The rows stay valid until the phase after
            the next one.
        """

    def request_nll(self, requests: list[tuple[int, int]]) -> None:
        """NLL under the raw target of (row, token) pairs of the latest target scoring."""

    def collect_nll(self) -> float:
        """The sum of all requested NLLs (called once, at the end)."""


def run_schedule(
    executor: Executor,
    prompt: Sequence[int],
    *,
    cfg: PearlConfig,
    stats: PearlStats,
    max_new_tokens: int,
    generator: torch.Generator,
    eos_token_ids: frozenset[int],
    max_length: int | None,
    on_tokens: Callable[[list[int]], None] | None = None,
) -> GenerationOutput:
    """Generate up to ``max_new_tokens`` tokens after ``prompt`` with PEARL's schedule.

    ``stats`` is filled in (its timing fields, forward counts and timeline included).
    """
    if not prompt:
        raise ValueError("the prompt is empty: at least one token is needed to condition on")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if max_length is not None and len(prompt) + cfg.gamma + 1 > max_length:
        raise ValueError(f"the prompt has {len(prompt)} tokens; with γ={cfg.gamma} it leaves no room "
                         f"in the context window of {max_length} tokens")
    timeline = executor.timeline
    start = now()
    executor.prefill(prompt)
    stats.prefill_calls = executor.target_prefill_calls
    stats.prefill_time_s = now() - start
    timeline.start = decode_start = now()
    state = PearlState([int(t) for t in prompt])
    emitted: list[int] = []
    open_phase, open_accepted = False, 0

    def decide(plan: VerifyPlan, bonus: bool) -> tuple[int, int | None]:
        u = verification_uniforms(generator, int(plan.accept_probs.shape[1]))
        return decide_with_uniforms(plan, bonus, u)

    while not stats.stop_reason:
        phase = next_phase(cfg, state)
        longest = max(len(phase.draft_context or []) + cfg.gamma, len(phase.target_sequence or []))
        if max_length is not None and longest > max_length:
            stats.stop_reason = "context_window"
            break
        u = draft_uniforms(generator, cfg.gamma) if phase.draft_context is not None else None
        d_tokens, d_q, p_rows = executor.run_phase(phase, u)
        t0 = now()
        res = resolve(cfg, state, phase, d_tokens, d_q, p_rows, decide)
        timeline.add("verify", t0, now(), phase.kind)
        stats.verify_time_s += now() - t0
        stats.phase_counts[phase.kind] = stats.phase_counts.get(phase.kind, 0) + 1
        if phase.kind != "draft-only":
            stats.record_iteration(res.verified, res.accepted)
            open_phase, open_accepted = True, open_accepted + res.accepted
            if res.state.mode == "pre":  # the drafting phase ends
                stats.drafting_phases += 1
                stats.accepted_in_phases += open_accepted
                open_phase, open_accepted = False, 0
        room = max_new_tokens - len(emitted)
        new, stats.stop_reason = accept_tokens(res.commit, eos_token_ids, room)
        if new:
            executor.request_nll(list(enumerate(new)))
        emitted.extend(new)
        stats.tokens_emitted += len(new)
        state = res.state
        if on_tokens is not None and new:
            on_tokens(new)
    if open_phase:
        stats.drafting_phases += 1
        stats.accepted_in_phases += open_accepted
    _finish(executor, stats, start, decode_start)
    return GenerationOutput(tokens=emitted, stats=stats)


def _finish(executor: Executor, stats: PearlStats, start: float, decode_start: float) -> None:
    """Fill in ``stats``' NLL, times, forward counts and timeline at the end of a request."""
    timeline = executor.timeline
    stats.nll_sum = executor.collect_nll()
    timeline.end = end = now()
    stats.wall_time_s = end - start
    stats.decode_time_s = end - decode_start
    stats.target_calls = stats.target_forwards = executor.target_forwards
    stats.draft_forwards = executor.draft_forwards
    stats.draft_calls = executor.draft_forwards + executor.draft_prefill_calls
    stats.target_tokens_scored = executor.target_tokens_scored
    stats.draft_time_s = sum(e - s for ln, s, e, lab in timeline.intervals
                             if ln == "draft" and s >= decode_start)
    stats.target_time_s = sum(e - s for ln, s, e, lab in timeline.intervals
                              if ln == "target" and s >= decode_start)
    stats.timeline = timeline.relative()
    stats.wait_fraction = timeline.wait_fractions()
