"""PEARL (Liu et al.): parallel speculative decoding with adaptive draft length.

* :mod:`.schedule` — Algorithm 2 as a state machine (pre-verify / post-verify phases, the
  ablations, the verification with token or block verification, the random draws);
* :mod:`.sides` — what each model does in a phase (used by the workers and the reference);
* :mod:`.driver` — the request loop shared by the reference and the engine;
* :mod:`.reference` — the sequential reference schedule and the exact law of its output;
* :mod:`.workers` / :mod:`.coordinator` — the concurrent engine (two worker processes);
* :mod:`.timeline` / :mod:`.stats` — busy/idle timeline, wait fractions, statistics;
* :mod:`.testing` — a slow/failing model wrapper for tests and demos.
"""

from verispec.engine.pearl.coordinator import PearlEngine, PearlWorkerError, split_threads
from verispec.engine.pearl.reference import pearl_law, reference_generate
from verispec.engine.pearl.schedule import PearlConfig
from verispec.engine.pearl.stats import PearlStats
from verispec.engine.pearl.timeline import draw_timeline

__all__ = [
    "PearlConfig",
    "PearlEngine",
    "PearlStats",
    "PearlWorkerError",
    "draw_timeline",
    "pearl_law",
    "reference_generate",
    "split_threads",
]
