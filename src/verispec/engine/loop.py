"""The speculative decoding loop (Algorithm 3 of *Block Verification Accelerates Speculative
Decoding*, Sun et al., ICLR 2025), for a batch of requests; a single prompt is a batch of one.
Each iteration, for every active row:

1. **Draft** γ_b = min(γ policy, room_b − 1) tokens (M drafts for multi-draft methods);
   ``auto`` rows of a batch get theirs from :mod:`verispec.engine.batch_gamma`.
2. **Score** the pending token and the block(s) of every row in one target forward pass.
3. **Verify**: each method verifies all of its rows in one call and returns τ_b and Y_b.
4. **Accept** X_1..X_τ, Y (truncated at the first EOS and at the budget), roll every row of
   the target back to its accepted prefix and tell the drafters what was kept.

Rows join (:meth:`Engine.submit`) and leave (EOS unless the request ignores it, budget,
context window, :meth:`Engine.cancel`) between iterations: continuous batching. γ = 0 is plain
autoregressive decoding through the same code (``ar``). Every random decision of a row comes
from its own :class:`~verispec.sampling.Randomness` in the same order whatever its batch,
so its output with a seed does not depend on the other rows (exactly on the float64 toy
models; up to the rounding of batched kernels on real ones).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from itertools import count
from typing import TypeVar

import torch

from verispec.checks import check_positive
from verispec.drafters.base import Draft
from verispec.engine.batch_gamma import choose_gammas
from verispec.engine.overhead import IterationOverhead
from verispec.engine.gather import Scored, gather_verify_batch, greedy_verdict, score_blocks
from verispec.engine.memory import keep_freed_memory
from verispec.engine.request import GenerationOutput, Request, Row, accept_tokens, check_request
from verispec.engine.stats import Stats
from verispec.models.base import CausalLM
from verispec.telemetry.clock import now
from verispec.verify import VerifyResult

__all__ = ["Engine", "PhaseClock", "generate_one"]

K = TypeVar("K")


class PhaseClock:
    """Host timestamps, synchronised with the device when profiling on CUDA (or when a call
    asks: the passes of an iteration whose γ is chosen from their times)."""

    def __init__(self, device: torch.device, profile: bool) -> None:
        self.sync = profile and device.type == "cuda"
        self.enabled = profile or device.type != "cuda"  # CPU timing is free and exact
        self.device = device

    def __call__(self, sync: bool = False) -> float:
        if self.device.type == "cuda" and (self.sync or sync):
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


class Engine:
    """Decodes the requests submitted to it, ``batch_size`` rows at a time. ``overhead``
    learns the engine's own time per batched iteration for the batch γ policy (default: a
    fresh :class:`~verispec.engine.overhead.IterationOverhead` on the wall clock)."""

    def __init__(self, target: CausalLM, *, batch_size: int = 1, profile: bool = False,
                 overhead: IterationOverhead | None = None) -> None:
        keep_freed_memory()  # per-iteration tensors reuse freed heap blocks (no page faults)
        self.target = target
        self.overhead = IterationOverhead() if overhead is None else overhead
        self.batch_size = check_positive("batch_size", batch_size)
        self.clock = PhaseClock(target.device, profile)
        self.waiting: deque[Row] = deque()
        self.active: list[Row] = []
        self.passes = 0  # batched target forward passes while decoding
        self.times = {"draft": 0.0, "target": 0.0, "verify": 0.0, "prefill": 0.0}
        self._ids = count()
        target.reset()
        target.reserve(batch_size)  # admitting up to batch_size rows never grows the cache

    # -- requests ---------------------------------------------------------------------------

    def submit(self, request: Request) -> Row:
        """Queue a request; it takes a free row at the next iteration."""
        check_request(self.target, request.prompt, request.max_new_tokens)
        stats = Stats(method=request.method.name, lossless=request.method.lossless,
                      gamma=request.gamma.label)  # type: ignore[union-attr]
        prompt = self.target.check_tokens(request.prompt)  # decoding then skips the checks
        row = Row(next(self._ids), request, prompt, stats,
                  state=request.method.new_state())
        request.gamma.start(len(row.context), request.max_new_tokens,  # type: ignore[union-attr]
                            fixed_length=request.ignore_eos, streamed=request.streamed)
        self.waiting.append(row)
        return row

    def cancel(self, row: Row) -> None:
        """Stop a request at the next iteration (its tokens so far are kept)."""
        row.cancelled = True

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.active

    def run(self, requests: Sequence[Request]) -> list[GenerationOutput]:
        """Decode every request to its end; outputs in input order."""
        rows = [self.submit(r) for r in requests]
        while not self.idle:
            self.step()
        return [r.output() for r in rows]

    # -- one iteration ------------------------------------------------------------------------

    def step(self) -> list[Row]:
        """Admit waiting requests, run one iteration for every active row; returns the rows
        that finished (cancelled rows leave first, freeing their slot)."""
        finished = self._retire()
        self._admit()
        rows = self.active
        if rows:
            start, read_before = self.overhead.clock(), _reading_time(rows)
            gammas = choose_gammas(rows, [self._room(r) - 1 for r in rows], self.overhead)
            # the passes' times feed the next choices where the iteration is recorded
            timed = self.overhead.grid_for(rows, gammas) is not None
            t0 = self.clock(timed)
            drafts = self._draft(rows, gammas)  # 1. draft
            t1 = self.clock(timed)
            # the draft's first reading of a context is a one-time cost, not the iteration's
            reading = _reading_time(rows) - read_before
            scored = score_blocks(self.target, rows, drafts)  # 2. score: one target pass
            t2 = self.clock(timed)
            results = self._verify(rows, drafts, scored)  # 3. verify, per method
            t3 = self.clock()
            self._accept(rows, drafts, scored, results)  # 4. accept, roll back, feed back
            passes = (max(t1 - t0 - reading, 0.0), t2 - t1) if timed else None
            self.overhead.record(rows, gammas, self.overhead.clock() - start - reading, passes)
            self.passes += 1
            self._time(rows, {"draft": t1 - t0, "target": t2 - t1, "verify": t3 - t2})
        return finished + self._retire()

    def _draft(self, rows: list[Row], gammas: list[int]) -> list[Draft]:
        vocab = self.target.vocab_size
        drafts = [Draft(tokens=torch.empty((1, 0), dtype=torch.int64),
                        probs=None if r.matching else torch.empty((1, 0, vocab))) for r in rows]
        for drafter, idx in _groups(rows, lambda r: r.request.drafter).items():
            todo = [i for i in idx if gammas[i] > 0]
            if drafter is None or not todo:
                continue
            for i, d in zip(todo, drafter.propose([rows[i] for i in todo],
                                                  [gammas[i] for i in todo]), strict=True):
                drafts[i] = d
        return drafts

    def _verify(self, rows: list[Row], drafts: list[Draft], scored: Scored) -> list[VerifyResult]:
        """One call per method over all of its rows; results per row ([1] tensors)."""
        out: list[VerifyResult | None] = [None] * len(rows)
        for method, idx in _groups(rows, lambda r: r.method).items():
            sub = [rows[i] for i in idx]
            if all(r.matching for r in sub):
                result = greedy_verdict(scored, idx, [drafts[i] for i in idx])
            else:
                batch = gather_verify_batch(scored, idx, sub, [drafts[i] for i in idx], method)
                result = method.verify(batch)
                for r, state in zip(sub, batch.states, strict=True):
                    r.state = state
            for j, i in enumerate(idx):
                out[i] = _row_result(result, j)
        return out  # type: ignore[return-value]

    def _accept(self, rows: list[Row], drafts: list[Draft], scored: Scored,
                results: list[VerifyResult]) -> None:
        taus = [int(r.num_accepted[0]) for r in results]
        branches = [int(r.extras["branch"][0]) if "branch" in r.extras else 0 for r in results]
        news = []
        for row, d, tau, branch, result in zip(rows, drafts, taus, branches, results, strict=True):
            y = int(result.next_token[0])
            room = self._room(row)
            eos = frozenset() if row.request.ignore_eos else self.target.eos_token_ids
            new, row.stats.stop_reason = accept_tokens(d.tokens[branch, :tau].tolist() + [y],
                                                       eos, room)
            if row.stats.stop_reason == "max_new_tokens" and \
                    len(row.emitted) + len(new) < row.request.max_new_tokens:
                row.stats.stop_reason = "context_window"  # the room was the window's
            news.append(new)
        scored.keep_branches(self.target, branches)
        self.target.rollback([len(r.context) + tau for r, tau in zip(rows, taus, strict=True)])
        for row, new in zip(rows, news, strict=True):
            row.context.extend(new)
            row.emitted.extend(new)
            if not row.done and len(row.context) >= self._window(row):
                row.stats.stop_reason = "context_window"
        for drafter, idx in _groups(rows, lambda r: r.request.drafter).items():
            fed = [i for i in idx if drafts[i].gamma > 0]
            if drafter is not None and fed:
                drafter.feedback([rows[i] for i in fed], [taus[i] for i in fed],
                                 [branches[i] for i in fed])
        nll = scored.nll(branches, news)
        for b, (row, d, result) in enumerate(zip(rows, drafts, results, strict=True)):
            row.request.gamma.observe(d.gamma, taus[b])  # type: ignore[union-attr]
            row.stats.nll_sum += nll[b]
            if result.bias_tv is not None:
                row.stats.bias_tv_sum += float(result.bias_tv[0])
            size = scored.block_sizes[b]
            row.stats.record_block(d.gamma, taus[b], len(news[b]), scored.forks[b] * size,
                                   (scored.forks[b] - 1) * size)
            if row.request.on_tokens is not None:
                row.request.on_tokens(news[b])

    # -- rows joining and leaving ------------------------------------------------------------

    def _admit(self) -> None:
        new: list[Row] = []
        while self.waiting and len(self.active) + len(new) < self.batch_size:
            new.append(self.waiting.popleft())
        if not new:
            return
        t0 = time.perf_counter()
        for row in new:
            row.start = t0
        self.target.add_rows([r.context[:-1] for r in new])
        for drafter, idx in _groups(new, lambda r: r.request.drafter).items():
            if drafter is not None:
                drafter.admit([new[i] for i in idx])
        prefill = now(self.target.device) - t0  # synchronised: the prompt reading's time
        self.times["prefill"] += prefill
        for row in new:
            row.stats.prefill_calls = int(len(row.context) > 1)
            row.stats.prefill_time_s = prefill
        self.active.extend(new)

    def _retire(self) -> list[Row]:
        gone = [r for r in self.active if r.done or r.cancelled]
        if not gone:
            return []
        end = self.clock() if self.clock.sync else now(self.target.device)
        for row in gone:
            if row.cancelled and not row.done:
                row.stats.stop_reason = "cancelled"
            drafter = row.request.drafter
            row.stats.draft_calls = drafter.row_calls(row.id) if drafter is not None else 0
            row.stats.wall_time_s = end - row.start
        keep = [i for i, r in enumerate(self.active) if not (r.done or r.cancelled)]
        self.target.select_rows(keep)
        for drafter, idx in _groups(gone, lambda r: r.request.drafter).items():
            if drafter is not None:
                drafter.release([gone[i] for i in idx])
        self.active = [self.active[i] for i in keep]
        return gone

    def _window(self, row: Row) -> int:
        limits = [m for m in (self.target.max_length,
                              row.request.drafter.max_length if row.request.drafter else None)
                  if m is not None]
        return min(limits) if limits else 1 << 62

    def _room(self, row: Row) -> int:
        """Tokens the row may still emit: the budget's remainder, capped by the window."""
        return min(row.request.max_new_tokens - len(row.emitted), self._window(row) - len(row.context))

    def _time(self, rows: list[Row], phases: dict[str, float]) -> None:
        if not self.clock.enabled:
            return
        for name, seconds in phases.items():
            self.times[name] += seconds
        for row in rows:
            row.stats.draft_time_s += phases["draft"]
            row.stats.target_time_s += phases["target"]
            row.stats.verify_time_s += phases["verify"]

    def batch_stats(self, rows: Sequence[Row], wall_time_s: float) -> Stats:
        """The statistics of a finished batch of rows."""
        total = Stats.merge([r.stats for r in rows], batch_size=self.batch_size,
                            target_passes=self.passes, wall_time_s=wall_time_s)
        total.draft_time_s, total.target_time_s = self.times["draft"], self.times["target"]
        total.verify_time_s, total.prefill_time_s = self.times["verify"], self.times["prefill"]
        return total


def generate_one(target: CausalLM, request: Request, *, profile: bool = False) -> GenerationOutput:
    """Decode one request alone (a batch of one)."""
    return Engine(target, profile=profile).run([request])[0]


def _groups(rows: Sequence[Row], key: Callable[[Row], K]) -> dict[K, list[int]]:
    """Row indices grouped by ``key(row)`` (drafters, methods: compared by identity)."""
    out: dict[K, list[int]] = {}
    for i, r in enumerate(rows):
        out.setdefault(key(r), []).append(i)
    return out


def _reading_time(rows: Sequence[Row]) -> float:
    """Seconds the rows' drafters have spent reading contexts so far."""
    drafters = {id(r.request.drafter): r.request.drafter for r in rows}
    return sum(d.reading_time_s for d in drafters.values() if d is not None)


def _row_result(result: VerifyResult, j: int) -> VerifyResult:
    return VerifyResult(
        num_accepted=result.num_accepted[j : j + 1], next_token=result.next_token[j : j + 1],
        bias_tv=None if result.bias_tv is None else result.bias_tv[j : j + 1],
        extras={k: v[j : j + 1] for k, v in result.extras.items()})
