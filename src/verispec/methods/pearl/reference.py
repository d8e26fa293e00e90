"""PEARL's sequential reference schedule and the exact law of its output.

* :func:`reference_generate` runs the schedule of :mod:`.schedule` in this process, one
  model after the other (:class:`LocalExecutor`), with the same sides, the same forward
  passes and the same random numbers as the concurrent engine — the engine's output must be
  identical to it for the same seed.
* :func:`pearl_law` is the exact law of the schedule's first ``length`` output tokens on toy
  models, by enumeration (float64). It is written from Algorithm 2 directly (not by running
  the schedule code) and reuses only the verifiers' plan functions, ``plan_law`` and the
  engine's EOS/budget clamping. Draft tokens that are only used when a verification
  accepts (X_2..X_γ after a pre-verify, X'_2..X'_γ after a post-verify) are enumerated in
  that branch only: they are drawn from q independently of the verification's coins, so
  summing them out in the other branches is exact. States are memoised.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache

import torch
from torch import Tensor

from verispec.engine.request import GenerationOutput, accept_tokens
from verispec.methods.pearl.driver import run_schedule
from verispec.methods.pearl.schedule import PLANS, PearlConfig, Phase
from verispec.methods.pearl.sides import CacheMirror, DraftSide, TargetSide
from verispec.methods.pearl.stats import PearlStats
from verispec.telemetry.timeline import Timeline, now
from verispec.models.base import CausalLM
from verispec.models.loading import check_compatible
from verispec.models.toy import TableLM
from verispec.sampling import Sampling
from verispec.engine.exact import Law, warped
from verispec.verify import VerifyPlan, plan_law

__all__ = ["LocalExecutor", "pearl_law", "reference_generate"]

PlanFn = Callable[[Tensor, Tensor, Tensor], VerifyPlan]


class LocalExecutor:
    """Runs each phase's draft work, then its target work, in this process."""

    def __init__(self, target: CausalLM, draft: CausalLM, sampling: Sampling, gamma: int) -> None:
        self.draft_side, self.target_side = DraftSide(draft, sampling), TargetSide(target, sampling)
        self.gamma, self.vocab = gamma, target.vocab_size
        self.draft_mirror, self.target_mirror = CacheMirror(), CacheMirror()
        self.timeline = Timeline()
        self.draft_forwards = self.target_forwards = self.target_tokens_scored = 0
        self.draft_prefill_calls = self.target_prefill_calls = 0
        self._nll = 0.0

    def prefill(self, prompt: Sequence[int]) -> None:
        head = [int(t) for t in prompt[:-1]]
        for lane, side, mirror in (("target", self.target_side, self.target_mirror),
                                   ("draft", self.draft_side, self.draft_mirror)):
            t0 = now()
            side.prefill(head)
            self.timeline.add(lane, t0, now(), "prefill")
            mirror.update(0, head)
        self.draft_prefill_calls = self.target_prefill_calls = int(bool(head))

    def run_phase(self, phase: Phase, uniforms: Tensor | None) -> tuple[list[int], list[Tensor], Tensor | None]:
        tokens: list[int] = []
        q_rows: list[Tensor] = []
        p_rows = None
        if phase.draft_context is not None:
            assert uniforms is not None
            keep, feed = self.draft_mirror.plan(phase.draft_context, 1)
            out = torch.empty((self.gamma, self.vocab), dtype=torch.float64)
            t0 = now()
            tokens = self.draft_side.draft(keep, feed, uniforms, out)
            self.timeline.add("draft", t0, now(), phase.kind)
            self.draft_mirror.update(keep, feed + tokens[:-1])
            self.draft_forwards += self.gamma
            q_rows = list(out)
        if phase.target_sequence is not None:
            keep, feed = self.target_mirror.plan(phase.target_sequence, phase.target_rows)
            p_rows = torch.empty((phase.target_rows, self.vocab), dtype=torch.float64)
            t0 = now()
            self.target_side.score(keep, feed, phase.target_rows, p_rows)
            self.timeline.add("target", t0, now(), phase.kind)
            self.target_mirror.update(keep, feed)
            self.target_forwards += 1
            self.target_tokens_scored += len(feed)
        return tokens, q_rows, p_rows

    def request_nll(self, requests: list[tuple[int, int]]) -> None:
        self._nll += self.target_side.nll(requests)

    def collect_nll(self) -> float:
        return self._nll


def reference_generate(
    target: CausalLM,
    draft: CausalLM,
    prompt: Sequence[int],
    *,
    cfg: PearlConfig,
    sampling: Sampling,
    max_new_tokens: int,
    generator: torch.Generator,
    on_tokens: Callable[[list[int]], None] | None = None,
) -> GenerationOutput:
    """PEARL's schedule run sequentially in this process (the reference for the engine)."""
    check_compatible(target, draft)
    stats = PearlStats(method="pearl", lossless=True, gamma=cfg.gamma, verifier=cfg.verifier,
                       pre_verify=cfg.pre_verify, post_verify=cfg.post_verify, concurrent=False)
    limits = [m.max_length for m in (target, draft) if m.max_length is not None]
    return run_schedule(
        LocalExecutor(target, draft, sampling, cfg.gamma), prompt, cfg=cfg, stats=stats,
        max_new_tokens=max_new_tokens, generator=generator, eos_token_ids=target.eos_token_ids,
        max_length=min(limits) if limits else None, on_tokens=on_tokens,
    )


def _add(acc: Law, weight: float, law: Law, prefix: tuple[int, ...] = ()) -> None:
    """acc += weight · law, every sequence prefixed by ``prefix``."""
    for key, value in law.items():
        acc[prefix + key] = acc.get(prefix + key, 0.0) + weight * value


def _outcomes(p: Callable[[tuple[int, ...]], Tensor], q: Callable[[tuple[int, ...]], Tensor],
              plan_fn: PlanFn, vocab: int, ctx: tuple[int, ...], block: tuple[int, ...],
              bonus: bool) -> Tensor:
    """[k+1, V] P(τ, Y) of verifying ``block`` after ``ctx`` (row k: full acceptance, with Y
    only if ``bonus``; without it the row's mass is all that matters)."""
    k = len(block)
    p_rows = [p(ctx + block[:i]) for i in range(k + 1 if bonus else k)]
    if not bonus:
        p_rows.append(p_rows[-1])  # never used: full acceptance draws no Y
    q_rows = [q(ctx + block[:i]) for i in range(k)]
    q_t = torch.stack(q_rows)[None] if k else torch.empty((1, 0, vocab), dtype=torch.float64)
    return plan_law(plan_fn(torch.stack(p_rows)[None], q_t,
                            torch.tensor([list(block)], dtype=torch.int64)))[0]


def _drafts(q: Callable[[tuple[int, ...]], Tensor], vocab: int, ctx: tuple[int, ...],
            n: int) -> list[tuple[tuple[int, ...], float]]:
    """Every n-token draft from q after ``ctx`` with its probability."""
    found: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
    for _ in range(n):
        found = [(b + (x,), pr * float(q(ctx + b)[x])) for b, pr in found
                 for x in range(vocab) if float(q(ctx + b)[x]) > 0]
    return found


def pearl_law(
    target: TableLM,
    draft: TableLM,
    prompt: Sequence[int],
    *,
    gamma: int,
    sampling: Sampling,
    length: int,
    verifier: str | PlanFn = "block",
    pre_verify: bool = True,
    post_verify: bool = True,
) -> Law:
    """Exact law of PEARL's first ``length`` output tokens (fewer if EOS comes first).

    ``verifier`` is ``"token"``, ``"block"`` or any plan function (negative controls).
    """
    p, q = warped(target, sampling), warped(draft, sampling)
    plan_fn = PLANS[verifier] if isinstance(verifier, str) else verifier
    vocab, eos = target.vocab_size, target.eos_token_ids

    def then(ctx: tuple[int, ...], room: int, tokens: Sequence[int],
             rest: Callable[[tuple[int, ...], int], Law]) -> Law:
        """Commit ``tokens`` (clamped); the law of what is emitted from here on."""
        new, stop = accept_tokens(tokens, eos, room)
        if stop:
            return {tuple(new): 1.0}
        out: Law = {}
        _add(out, 1.0, rest(ctx + tuple(new), room - len(new)), tuple(new))
        return out

    def verified(ctx: tuple[int, ...], room: int, block: tuple[int, ...], bonus: bool,
                 on_full: Callable[[tuple[int, ...], int], Law]) -> Law:
        """Verify ``block``: a rejection (or a bonus) goes back to pre-verify mode; full
        acceptance without a bonus continues with ``on_full``."""
        law = _outcomes(p, q, plan_fn, vocab, ctx, block, bonus)
        k, out = len(block), {}
        for tau, y in (law > 0).nonzero().tolist():
            if tau == k and not bonus:
                continue
            _add(out, float(law[tau, y]), then(ctx, room, block[:tau] + (y,), pre))
        if not bonus and float(law[k].sum()) > 0:
            _add(out, float(law[k].sum()), then(ctx, room, block, on_full))
        return out

    @cache
    def fresh_window(ctx: tuple[int, ...], room: int, n: int) -> Law:
        """Post-verify mode with a window of n tokens drawn from q after ``ctx``."""
        out: Law = {}
        for window, prob in _drafts(q, vocab, ctx, n):
            _add(out, prob, post(ctx, window, room))
        return out

    @cache
    def post(ctx: tuple[int, ...], window: tuple[int, ...], room: int) -> Law:
        if not post_verify:  # the draft idles; the block gets a bonus token, as in SD
            return verified(ctx, room, window, True, pre)
        out: Law = {}
        for (x,), prob in _drafts(q, vocab, ctx + window, 1):  # X'_1, drafted during the verification
            _add(out, prob, verified(ctx, room, window + (x,), False,
                                     lambda c, r: fresh_window(c, r, gamma - 1)))
        return out

    @cache
    def pre(ctx: tuple[int, ...], room: int) -> Law:
        if not pre_verify:  # the target idles while the draft drafts a fresh window
            return fresh_window(ctx, room, gamma)
        out: Law = {}
        for (x,), prob in _drafts(q, vocab, ctx, 1):
            _add(out, prob, verified(ctx, room, (x,), False,
                                     lambda c, r: fresh_window(c, r, gamma - 1)))
        return out

    if gamma < 1 or length < 1:
        raise ValueError(f"need gamma >= 1 and length >= 1, got {gamma} and {length}")
    return pre(tuple(int(t) for t in prompt), length)
