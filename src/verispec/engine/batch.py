"""Batched speculative decoding: many requests at once, ragged acceptance per row.

The same iteration as :func:`verispec.engine.loop.speculative_generate` (Algorithm 3 of
block-verification.txt), for a batch of ``batch_size`` slots:

1. **Admit** waiting requests into free slots (each prompt prefilled on its own).
2. **Draft** γ_b = min(γ, room_b − 1) tokens for every row in one batched pass per position.
3. **Score** every row's pending token and block (M forks per row for multi-draft methods)
   with the target in one batched forward pass.
4. **Verify** each row with its own method instance and its own generator (τ_b, Y_b).
5. **Accept** X_1..X_τ_b, Y_b per row, clamped at EOS and the row's budget; roll back each
   row of both caches to its own accepted prefix. Finished rows free their slot.

Rows never influence each other's tokens: row b draws its randomness only from request b's
``torch.Generator`` (via :class:`~verispec.engine.batch_drafters.RowRandom`), in the same
order as the single-request engine, so a row's output with seed s is the same alone, in any
batch, and under :func:`~verispec.engine.loop.speculative_generate` (up to the float noise
of batched kernels on real models; exactly, on the float64 toy models).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from verispec.drafters.base import Draft
from verispec.engine.batch_drafters import (
    BatchedDrafter,
    BatchedModelDrafter,
    PerRowDrafter,
    RowRandom,
)
from verispec.engine.loop import GenerationOutput, accept_tokens, now
from verispec.engine.methods import Method
from verispec.engine.stats import Stats
from verispec.models.base import ContextTooLongError
from verispec.models.batched import BatchedLM
from verispec.sampling import Sampling

__all__ = [
    "BatchOutput",
    "BatchStats",
    "BatchedDrafter",
    "BatchedModelDrafter",
    "PerRowDrafter",
    "RowRandom",
    "batched_generate",
]


@dataclass
class BatchStats:
    """Statistics of a whole batched run; per-row :class:`Stats` live in ``BatchOutput.rows``.

    Conventions (per-row ones are those of :mod:`verispec.engine.stats`):

    * ``iterations`` / ``target_calls`` count *batched* iterations / target forward passes;
      ``row_iterations`` sums the rows active in each iteration, so ``mean_batch_rows`` =
      ``row_iterations / iterations`` is the average number of rows per pass.
    * ``block_efficiency`` = ``tokens_emitted / row_iterations`` (tokens per row per target
      call, comparable to the single-request figure); ``mean_accepted`` is per row iteration.
    * ``target_positions_computed`` counts every slot the target computed, filler included
      (rows shorter than the longest block are padded); ``target_tokens_scored`` only the real.
    * ``tokens_per_second`` = all rows' emitted tokens / wall time of the whole run.
    * Per-row times are the batch's phase times while the row was active (shared, not split);
      a row's ``wall_time_s`` runs from its admission to its last iteration.
    """

    method: str = ""
    lossless: bool = True
    gamma: int = 0
    batch_size: int = 0
    num_prompts: int = 0
    iterations: int = 0
    row_iterations: int = 0
    target_calls: int = 0
    prefill_calls: int = 0
    draft_calls: int = 0
    tokens_emitted: int = 0
    accepted_total: int = 0
    drafted_total: int = 0
    target_tokens_scored: int = 0
    target_positions_computed: int = 0
    draft_time_s: float = 0.0
    target_time_s: float = 0.0
    verify_time_s: float = 0.0
    prefill_time_s: float = 0.0
    wall_time_s: float = 0.0
    energy_joules: float | None = None
    energy_source: str = "unavailable"
    notes: list[str] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_emitted / self.wall_time_s if self.wall_time_s > 0 else 0.0

    @property
    def block_efficiency(self) -> float:
        return self.tokens_emitted / self.row_iterations if self.row_iterations else 0.0

    @property
    def mean_accepted(self) -> float:
        return self.accepted_total / self.row_iterations if self.row_iterations else 0.0

    @property
    def mean_batch_rows(self) -> float:
        return self.row_iterations / self.iterations if self.iterations else 0.0

    @property
    def energy_per_token_j(self) -> float | None:
        if self.energy_joules is None or not self.tokens_emitted:
            return None
        return self.energy_joules / self.tokens_emitted

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for name in ("tokens_per_second", "block_efficiency", "mean_accepted", "mean_batch_rows",
                     "energy_per_token_j"):
            d[name] = getattr(self, name)
        return d

    def summary(self) -> str:
        lines = [
            (f"batch: {self.num_prompts} prompts, batch size {self.batch_size}, method "
             f"{self.method} ({'lossless' if self.lossless else 'NOT lossless'}), γ={self.gamma}"),
            (f"tokens {self.tokens_emitted} in {self.wall_time_s:.2f}s "
             f"({self.tokens_per_second:.2f} tok/s for the whole batch)"),
            (f"iterations {self.iterations} (mean {self.mean_batch_rows:.2f} rows each), target "
             f"calls {self.target_calls} (+{self.prefill_calls} prefill), draft calls "
             f"{self.draft_calls}"),
            (f"block efficiency {self.block_efficiency:.3f} per row, mean accepted "
             f"{self.mean_accepted:.3f}"),
            (f"target tokens scored {self.target_tokens_scored} "
             f"({self.target_positions_computed} positions with padding)"),
            (f"time: draft {self.draft_time_s:.2f}s, target {self.target_time_s:.2f}s, "
             f"verify {self.verify_time_s:.3f}s, prefill {self.prefill_time_s:.2f}s"),
        ]
        energy = self.energy_per_token_j
        lines.append(f"energy {energy:.3f} J/token ({self.energy_source})" if energy is not None
                     else f"energy: {self.energy_source}")
        lines.extend(self.notes)
        return "\n".join(lines)


@dataclass
class BatchOutput:
    """One :class:`GenerationOutput` per request (input order) and the batch's statistics."""

    rows: list[GenerationOutput]
    stats: BatchStats


@dataclass
class _Row:
    """A request occupying a slot."""

    index: int
    method: Method
    budget: int
    ctx: list[int]
    stats: Stats
    start: float
    emitted: list[int] = field(default_factory=list)


def _check(prompts: Sequence[Sequence[int]], methods: Sequence[Method], budgets: list[int],
           gamma: int, drafter: BatchedDrafter | None, target: BatchedLM,
           batch_size: int) -> None:
    if not prompts:
        raise ValueError("no prompts given")
    if len(methods) != len(prompts) or len(budgets) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts need as many methods and budgets, got "
                         f"{len(methods)} and {len(budgets)}")
    if len({id(m) for m in methods}) != len(methods):
        raise ValueError("every request needs its own Method instance (methods keep state)")
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    if gamma > 0 and drafter is None:
        raise ValueError("gamma > 0 needs a drafter")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    for i, (p, n) in enumerate(zip(prompts, budgets, strict=True)):
        if not p:
            raise ValueError(f"prompt {i} is empty: at least one token is needed to condition on")
        if n < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {n} for prompt {i}")
        if target.max_length is not None and len(p) >= target.max_length:
            raise ContextTooLongError(
                f"prompt {i} has {len(p)} tokens; {target.name}'s context window is "
                f"{target.max_length} tokens, leaving no room to generate")


def batched_generate(
    target: BatchedLM,
    drafter: BatchedDrafter | None,
    prompts: Sequence[Sequence[int]],
    *,
    methods: Sequence[Method],
    gamma: int,
    sampling: Sampling,
    max_new_tokens: int | Sequence[int],
    generators: Sequence[torch.Generator] | None = None,
    random: RowRandom | None = None,
    batch_size: int | None = None,
    on_tokens: Callable[[int, list[int]], None] | None = None,
) -> BatchOutput:
    """Generate after every prompt (token ids) with at most ``batch_size`` rows at a time.

    Args:
        methods: one Method instance per prompt (rows keep their own state).
        max_new_tokens: one budget for all prompts, or one per prompt.
        generators: one generator per prompt (or give ``random``, which wraps them).
        batch_size: slots (default: all prompts at once); freed slots take waiting prompts.
        on_tokens: ``on_tokens(prompt_index, new_tokens)`` after each accepted block.
    Returns:
        :class:`BatchOutput` with one :class:`GenerationOutput` per prompt, in input order.
    """
    n = len(prompts)
    budgets = [int(max_new_tokens)] * n if isinstance(max_new_tokens, int) else list(max_new_tokens)
    slots = n if batch_size is None else batch_size
    _check(prompts, methods, budgets, gamma, drafter, target, slots)
    if random is None:
        if generators is None or len(generators) != n:
            raise ValueError("give one torch.Generator per prompt")
        random = RowRandom(generators)
    device, first = target.device, methods[0]
    batch = BatchStats(method=first.name, lossless=all(m.lossless for m in methods), gamma=gamma,
                       batch_size=slots, num_prompts=n)
    start = now(device)
    target.reset()
    waiting = deque(range(n))
    active: list[_Row] = []
    done: dict[int, GenerationOutput] = {}
    draft_calls0 = drafter.forward_calls if drafter is not None else 0
    while waiting or active:
        # 1. Admit waiting requests into free slots.
        new = [waiting.popleft() for _ in range(min(slots - len(active), len(waiting)))]
        if new:
            t0 = now(device)
            calls0 = target.forward_calls
            target.add_rows([list(prompts[i])[:-1] for i in new])
            if drafter is not None:
                drafter.admit([list(prompts[i]) for i in new])
            batch.prefill_calls += target.forward_calls - calls0
            t1 = now(device)
            batch.prefill_time_s += t1 - t0
            for i in new:
                methods[i].reset()
                stats = Stats(method=methods[i].name, lossless=methods[i].lossless, gamma=gamma)
                stats.prefill_calls = 1 if len(prompts[i]) > 1 else 0
                stats.prefill_time_s = t1 - t0
                active.append(_Row(i, methods[i], budgets[i], [int(t) for t in prompts[i]],
                                   stats, t0))
        _iteration(target, drafter, active, random, gamma, sampling, batch, device, on_tokens)
        # Free the slots of finished rows.
        keep = [b for b, r in enumerate(active) if not r.stats.stop_reason]
        for b, r in enumerate(active):
            if r.stats.stop_reason:
                if drafter is not None:
                    r.stats.draft_calls = drafter.row_calls[b]
                r.stats.wall_time_s = now(device) - r.start
                done[r.index] = GenerationOutput(tokens=r.emitted, stats=r.stats)
        if len(keep) < len(active):
            target.select_rows(keep)
            if drafter is not None:
                drafter.release(keep)
            active = [active[b] for b in keep]
    if drafter is not None:
        batch.draft_calls = drafter.forward_calls - draft_calls0
    batch.wall_time_s = now(device) - start
    rows = [done[i] for i in range(n)]
    batch.tokens_emitted = sum(r.stats.tokens_emitted for r in rows)
    return BatchOutput(rows=rows, stats=batch)


def _iteration(target: BatchedLM, drafter: BatchedDrafter | None, active: list[_Row],
               random: RowRandom, gamma: int, sampling: Sampling, batch: BatchStats,
               device: torch.device, on_tokens: Callable[[int, list[int]], None] | None) -> None:
    """One draft → score → verify → accept round for every active row."""
    rooms, gammas = [], []
    for r in active:
        room = r.budget - len(r.emitted)
        if target.max_length is not None:
            room = min(room, target.max_length - len(r.ctx))
        rooms.append(room)
        gammas.append(min(gamma, room - 1))
    # 1. Draft.
    t0 = now(device)
    drafts: list[Draft | None] = [None] * len(active)
    if drafter is not None and any(g > 0 for g in gammas):
        drafts = drafter.propose(
            [r.ctx for r in active], gammas, [r.index for r in active], random,
            num_drafts=[r.method.num_drafts for r in active],
            with_next=[r.method.needs_next_probs for r in active])
    vocab = target.vocab_size
    drafts = [d if d is not None else Draft(tokens=torch.empty((1, 0), dtype=torch.int64),
                                            probs=torch.empty((1, 0, vocab)))
              for d in drafts]
    # 2. Score every row's pending tokens + its block(s) in one target pass.
    t1 = now(device)
    lengths = target.lengths
    pending = [r.ctx[n:] for r, n in zip(active, lengths, strict=True)]
    forks = [int(d.tokens.shape[0]) for d in drafts]
    first = [sum(forks[:b]) for b in range(len(active))]
    blocks = [pending[b] + draft_row
              for b, d in enumerate(drafts) for draft_row in d.tokens.tolist()]
    if any(f > 1 for f in forks):
        target.select_rows([b for b in range(len(active)) for _ in range(forks[b])])
    logits = target.extend(blocks)  # [R', k_max, V]
    p_all = sampling.probs(logits, target.name)  # [R', k_max, V]
    t2 = now(device)
    # 3. Verify each row with its own method and generator.
    results = []
    for b, (r, d) in enumerate(zip(active, drafts, strict=True)):
        lo, hi = len(pending[b]) - 1, len(pending[b]) + d.gamma
        p = p_all[first[b] : first[b] + forks[b], lo:hi]  # [M_b, γ_b+1, V]
        results.append(random.verify(r.index, r.method, p, d))
    t3 = now(device)
    # 4. Accept, clamped at EOS and each row's budget.
    taus, branches, news = [], [], []
    for b, (r, d, res) in enumerate(zip(active, drafts, results, strict=True)):
        tau, y = int(res.num_accepted[0]), int(res.next_token[0])
        branch = int(res.extras["branch"][0]) if "branch" in res.extras else 0
        new, r.stats.stop_reason = accept_tokens(
            d.tokens[branch, :tau].tolist() + [y], target.eos_token_ids, rooms[b])
        if r.stats.stop_reason == "max_new_tokens" and len(r.emitted) + len(new) < r.budget:
            r.stats.stop_reason = "context_window"  # the room was the window's, not the budget's
        taus.append(tau)
        branches.append(branch)
        news.append(new)
    # 5. Roll back every row to its accepted prefix; feed back to the drafter.
    if any(f > 1 for f in forks):
        target.select_rows([first[b] + branches[b] for b in range(len(active))])
    target.rollback([len(r.ctx) + tau for r, tau in zip(active, taus, strict=True)])
    for r, new in zip(active, news, strict=True):
        r.ctx.extend(new)
        r.emitted.extend(new)
        if not r.stats.stop_reason and target.max_length is not None \
                and len(r.ctx) >= target.max_length:
            r.stats.stop_reason = "context_window"
    drafted = [d.gamma > 0 for d in drafts]
    if drafter is not None and any(drafted):
        drafter.feedback([r.ctx for r in active], taus, branches, drafted)
    # Bookkeeping, per row and for the batch.
    batch.iterations += 1
    batch.target_calls += 1
    batch.target_positions_computed += int(logits.shape[0] * logits.shape[1])
    for b, (r, d, res) in enumerate(zip(active, drafts, results, strict=True)):
        new, row = news[b], first[b] + branches[b]
        lo = len(pending[b]) - 1
        raw = torch.log_softmax(logits[row, lo : lo + len(new)].float(), dim=-1)  # [n, V]
        r.stats.nll_sum -= float(raw.gather(-1, torch.tensor(new, device=raw.device)[:, None]).sum())
        if res.bias_tv is not None:
            r.stats.bias_tv_sum += float(res.bias_tv[0])
        r.stats.record_iteration(d.gamma, taus[b])
        scored = forks[b] * (len(pending[b]) + d.gamma)
        r.stats.target_calls += 1
        r.stats.target_tokens_scored += scored
        r.stats.extra_tokens_scored += scored - (len(pending[b]) + d.gamma)
        r.stats.tokens_emitted += len(new)
        r.stats.draft_time_s += t1 - t0
        r.stats.target_time_s += t2 - t1
        r.stats.verify_time_s += t3 - t2
        batch.row_iterations += 1
        batch.accepted_total += taus[b]
        batch.drafted_total += d.gamma
        batch.target_tokens_scored += scored
        if on_tokens is not None:
            on_tokens(r.index, new)
    batch.draft_time_s += t1 - t0
    batch.target_time_s += t2 - t1
    batch.verify_time_s += t3 - t2
