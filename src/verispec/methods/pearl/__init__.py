"""PEARL (Liu et al.): parallel speculative decoding with adaptive draft length.

* :mod:`.method` — the method's options and its runner (``--method pearl``);
* :mod:`.schedule` — Algorithm 2 as a state machine (pre-verify / post-verify phases, the
  ablations, the verification with token or block verification, the random draws);
* :mod:`.sides` — what each model does in a phase (used by the workers and the reference);
* :mod:`.driver` — the request loop shared by the reference and the engine;
* :mod:`.reference` — the sequential reference schedule and the exact law of its output;
* :mod:`.workers` / :mod:`.coordinator` — the concurrent engine (two worker processes);
* :mod:`.stats` — statistics; the busy/idle timeline is :mod:`verispec.telemetry.timeline`.

Importing this package starts nothing and imports no multiprocessing: the workers come with
:class:`~verispec.methods.pearl.coordinator.PearlEngine`.
"""

from verispec.methods.pearl.method import PEARL, PearlMethod, pearl_generate

__all__ = ["PEARL", "PearlMethod", "pearl_generate"]
