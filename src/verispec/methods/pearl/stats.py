"""PEARL's statistics: :class:`~verispec.engine.stats.Stats` plus what the paper measures.

Conventions (in addition to those of :mod:`verispec.engine.stats`):

* an *iteration* is one verification (a pre-verify of X_1, a post-verify block, or a
  verify-only block); ``record_iteration(k, τ)`` is called once per verification, so
  ``mean_accepted`` is the mean τ per verification;
* a **drafting phase** (Theorem 2, Table 4) is a maximal run of verifications that ends when
  the schedule returns to pre-verify mode (a rejection, or — without post-verify — the end of
  a window) or when generation stops; ``mean_accepted_per_phase`` = accepted draft tokens /
  drafting phases. For i.i.d. acceptance with rate α and token verification it is
  α/(1-α) (the paper's eq. 6 states 1/(1-α) + 1; its geometric sum is off by one);
* ``draft_forwards`` / ``target_forwards`` count forward passes while decoding (prefill and
  ``--gamma auto`` probes excluded); ``target_calls`` = ``target_forwards``, ``draft_calls``
  = ``draft_forwards`` + the draft's prefill;
* ``timeline`` holds (lane, start, end, label) with times in seconds since decoding started;
  ``wait_fraction[lane]`` = 1 - busy / ``decode_time_s`` (see :mod:`.timeline`);
  ``decode_time_s`` is the wall time after the prefill.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verispec.engine.stats import Stats

__all__ = ["PearlStats"]


@dataclass
class PearlStats(Stats):
    verifier: str = "block"
    pre_verify: bool = True
    post_verify: bool = True
    gamma_mode: str = "fixed"
    speed_ratio: float | None = None
    probe_draft_s: float | None = None
    probe_target_s: float | None = None
    concurrent: bool = True
    draft_threads: int | None = None
    target_threads: int | None = None
    startup_s: float = 0.0
    decode_time_s: float = 0.0
    phase_counts: dict[str, int] = field(default_factory=dict)
    drafting_phases: int = 0
    accepted_in_phases: int = 0
    draft_forwards: int = 0
    target_forwards: int = 0
    timeline: list[tuple[str, float, float, str]] = field(default_factory=list)
    wait_fraction: dict[str, float] = field(default_factory=dict)

    @property
    def mean_accepted_per_phase(self) -> float:
        return self.accepted_in_phases / self.drafting_phases if self.drafting_phases else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["mean_accepted_per_phase"] = self.mean_accepted_per_phase
        return d

    def summary(self) -> str:
        ablation = [name for name, on in (("pre-verify", self.pre_verify),
                                          ("post-verify", self.post_verify)) if not on]
        window = f"γ={self.gamma}"
        if self.speed_ratio is not None:
            window += (f" (auto: c = {self.speed_ratio:.2f} = target {self.probe_target_s * 1e3:.1f} ms"
                       f" / draft {self.probe_draft_s * 1e3:.1f} ms per forward)")
        lines = [
            f"PEARL: {self.verifier} verification, {window}"
            + (f", without {' and '.join(ablation)}" if ablation else "")
            + ("" if self.concurrent else ", sequential reference schedule"),
            (f"drafting phases {self.drafting_phases}, mean accepted per drafting phase "
             f"{self.mean_accepted_per_phase:.2f}; phases "
             + ", ".join(f"{k} {v}" for k, v in sorted(self.phase_counts.items()))),
            f"forwards while decoding: draft {self.draft_forwards}, target {self.target_forwards}",
            ("waiting (fraction of decoding time): "
             + ", ".join(f"{lane} {frac:.0%}" for lane, frac in self.wait_fraction.items())),
        ]
        if self.draft_threads is not None:
            lines.append(f"threads: draft {self.draft_threads}, target {self.target_threads}; "
                         f"worker start-up {self.startup_s:.2f}s (not in the wall time)")
        return super().summary() + "\n" + "\n".join(lines)
