"""Run statistics, with their conventions stated once.

Conventions:

* An **iteration** is one draft → score → verify → accept round (Algorithm 3, lines 2–5).
  Autoregressive decoding is the special case γ = 0: one target call, one token.
* ``target_calls`` counts target forward passes during decoding; the prompt's prefill is
  counted separately in ``prefill_calls`` and excluded from ``block_efficiency``.
* ``draft_calls`` counts draft-model forward passes (prefill included; a prompt-lookup
  drafter makes none).
* ``block_efficiency`` = ``tokens_emitted / target_calls``: emitted tokens per serial target
  call (the paper's block efficiency). EOS and the ``max_new_tokens`` budget can truncate the
  last block; only emitted tokens count.
* ``mean_accepted`` = mean τ per iteration (accepted *draft* tokens, before truncation).
* ``acceptance_by_position[i]`` = P(τ ≥ i+1 | the draft had ≥ i+1 tokens).
* ``tau_histogram[t]`` = number of iterations with τ = t.
* ``target_tokens_scored`` counts every token position the target processed while decoding
  (M·(γ+1) per multi-draft iteration), the fair price of multi-draft methods.
* ``extra_tokens_scored`` is the part of ``target_tokens_scored`` spent on drafts beyond the
  first ((M−1)·(γ+1) per multi-draft iteration; 0 for single-draft methods).
* Times are wall-clock seconds measured on the host. On CUDA the phase times (draft,
  target, verify) need a device synchronisation each, taken only when the engine is asked to
  profile; otherwise they are reported as 0 and only the wall time (synchronised once at
  the end) is measured.
* A batch's statistics (:meth:`Stats.merge`) use the same fields: counts and times are
  sums over its requests, ``requests`` says how many, ``target_passes`` counts the batched
  target forward passes (each request's ``target_calls`` counts the passes it took part
  in, so ``mean_batch_rows`` = Σ target_calls / target_passes), and ``wall_time_s`` is the
  whole run's, so ``tokens_per_second`` is the batch's throughput.
* ``bias_tv_sum`` is the exact sum, over verified positions, of TV(step output law, p);
  0 for lossless methods.
* ``perplexity`` is exp(mean NLL) of the emitted tokens under the *unwarped* target.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Stats"]


@dataclass
class Stats:
    """The statistics of one request, or of a batch of them (see the module docstring)."""

    method: str = ""
    lossless: bool = True
    gamma: int | str = 0
    requests: int = 1
    batch_size: int = 1
    iterations: int = 0
    target_passes: int = 0
    target_calls: int = 0
    prefill_calls: int = 0
    draft_calls: int = 0
    tokens_emitted: int = 0
    accepted_total: int = 0
    drafted_total: int = 0
    target_tokens_scored: int = 0
    extra_tokens_scored: int = 0
    tau_histogram: list[int] = field(default_factory=list)
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    bias_tv_sum: float = 0.0
    nll_sum: float = 0.0
    stop_reason: str = ""
    draft_time_s: float = 0.0
    target_time_s: float = 0.0
    verify_time_s: float = 0.0
    prefill_time_s: float = 0.0
    wall_time_s: float = 0.0
    energy_joules: float | None = None
    energy_source: str = "unavailable"
    notes: list[str] = field(default_factory=list)

    def record_iteration(self, drafted: int, accepted: int) -> None:
        self.iterations += 1
        self.drafted_total += drafted
        self.accepted_total += accepted
        _bump(self.tau_histogram, accepted)
        for i in range(drafted):
            _bump(self.drafted_by_position, i)
            if i < accepted:
                _bump(self.accepted_by_position, i)

    def record_block(self, drafted: int, accepted: int, emitted: int, scored: int,
                     extra_scored: int) -> None:
        """One iteration of this request: γ drafted, τ accepted, tokens emitted and scored."""
        self.record_iteration(drafted, accepted)
        self.target_calls += 1
        self.target_tokens_scored += scored
        self.extra_tokens_scored += extra_scored
        self.tokens_emitted += emitted

    @classmethod
    def merge(cls, parts: list[Stats], *, batch_size: int, target_passes: int,
              wall_time_s: float) -> Stats:
        """The statistics of a batch: its requests' counts and times summed."""
        total = cls(method=parts[0].method if parts else "", requests=len(parts),
                    lossless=all(p.lossless for p in parts), batch_size=batch_size,
                    gamma=parts[0].gamma if parts else 0, target_passes=target_passes,
                    wall_time_s=wall_time_s)
        for p in parts:
            for name in ("iterations", "target_calls", "prefill_calls", "draft_calls",
                         "tokens_emitted", "accepted_total", "drafted_total",
                         "target_tokens_scored", "extra_tokens_scored", "bias_tv_sum", "nll_sum"):
                setattr(total, name, getattr(total, name) + getattr(p, name))
            for name in ("tau_histogram", "drafted_by_position", "accepted_by_position"):
                for i, count in enumerate(getattr(p, name)):
                    _bump(getattr(total, name), i, count)
        return total

    @property
    def mean_batch_rows(self) -> float:
        """Requests per batched target pass (1 for a request decoded alone)."""
        return self.target_calls / self.target_passes if self.target_passes else 1.0

    @property
    def block_efficiency(self) -> float:
        return self.tokens_emitted / self.target_calls if self.target_calls else 0.0

    @property
    def mean_accepted(self) -> float:
        return self.accepted_total / self.iterations if self.iterations else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / d for a, d in zip(self.accepted_by_position + [0] * len(self.drafted_by_position),
                                      self.drafted_by_position)]

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll_sum / self.tokens_emitted) if self.tokens_emitted else math.nan

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_emitted / self.wall_time_s if self.wall_time_s > 0 else 0.0

    @property
    def energy_per_token_j(self) -> float | None:
        if self.energy_joules is None or not self.tokens_emitted:
            return None
        return self.energy_joules / self.tokens_emitted

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for name in ("block_efficiency", "mean_accepted", "acceptance_by_position", "perplexity",
                     "tokens_per_second", "energy_per_token_j", "mean_batch_rows"):
            value = getattr(self, name)
            d[name] = None if isinstance(value, float) and math.isnan(value) else value
        return d

    def summary(self) -> str:
        batch = (f"; {self.requests} requests, batch size {self.batch_size}, "
                 f"{self.mean_batch_rows:.2f} rows per target pass" if self.requests > 1 else "")
        lines = [
            (f"method {self.method} ({'lossless' if self.lossless else 'NOT lossless'}), "
             f"γ={self.gamma}{batch}"),
            (f"tokens {self.tokens_emitted} in {self.wall_time_s:.2f}s "
             f"({self.tokens_per_second:.2f} tok/s); stop: {self.stop_reason}"),
            (f"iterations {self.iterations}, target calls {self.target_calls} "
             f"(+{self.prefill_calls} prefill), draft calls {self.draft_calls}"),
            (f"target tokens scored {self.target_tokens_scored} "
             f"({self.extra_tokens_scored} for extra drafts)"),
            f"block efficiency {self.block_efficiency:.3f}, mean accepted {self.mean_accepted:.3f}",
            "acceptance by position " + " ".join(f"{a:.2f}" for a in self.acceptance_by_position),
            f"τ histogram {self.tau_histogram}",
            (f"time: draft {self.draft_time_s:.2f}s, target {self.target_time_s:.2f}s, "
             f"verify {self.verify_time_s:.3f}s, prefill {self.prefill_time_s:.2f}s"),
            f"perplexity under target {self.perplexity:.3f}",
        ]
        if not self.lossless:
            lines.append(f"distribution bias: Σ TV = {self.bias_tv_sum:.4f}")
        energy = self.energy_per_token_j
        lines.append(
            f"energy {energy:.3f} J/token ({self.energy_source})" if energy is not None
            else f"energy: {self.energy_source}"
        )
        lines.extend(self.notes)
        return "\n".join(lines)


def _bump(counts: list[int], index: int, by: int = 1) -> None:
    while len(counts) <= index:
        counts.append(0)
    counts[index] += by
