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
* Times are wall-clock seconds measured on the host; on CUDA each phase is synchronised.
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
    method: str = ""
    lossless: bool = True
    gamma: int = 0
    iterations: int = 0
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
                     "tokens_per_second", "energy_per_token_j"):
            value = getattr(self, name)
            d[name] = None if isinstance(value, float) and math.isnan(value) else value
        return d

    def summary(self) -> str:
        lines = [
            f"method {self.method} ({'lossless' if self.lossless else 'NOT lossless'}), γ={self.gamma}",
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


def _bump(counts: list[int], index: int) -> None:
    while len(counts) <= index:
        counts.append(0)
    counts[index] += 1
