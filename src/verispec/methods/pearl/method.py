"""PEARL (*Parallel Speculative Decoding with Adaptive Draft Length*, Liu et al.) as a method.

``verispec generate --method 'pearl[verifier=token]' [--gamma auto|N] [--timeline out.png]``,
options ``verifier`` (token | block, the rule each window is verified with), ``pre_verify``,
``post_verify`` (False: the Table 3 ablations), ``draft_threads``, ``target_threads``; in
Python ``verispec.generate(..., method="pearl", verifier="token")``. Lossless with either
verifier. It does not iterate Algorithm 3: its runner starts a
:class:`~verispec.methods.pearl.coordinator.PearlEngine` (two worker processes) for the
request and stops it afterwards; the worker start-up is reported, not counted in the wall
time. Use the engine directly to serve many prompts with the same workers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from verispec.checks import check_flag, check_positive
from verispec.engine.protocols import ScheduledMethod
from verispec.engine.request import GenerationOutput
from verispec.methods.pearl.schedule import PLANS
from verispec.methods.registry import MethodInfo
from verispec.models.base import CausalLM
from verispec.sampling import Randomness, Sampling

__all__ = ["PEARL", "PearlMethod", "pearl_generate"]


class PearlMethod(ScheduledMethod):
    """PEARL's options; lossless.

    Attributes:
        verifier: ``"token"`` or ``"block"``, applied to every verified window.
        pre_verify, post_verify: the two strategies (False: the Table 3 ablations).
        draft_threads, target_threads: torch threads per worker (None: a third of the cores
            for the draft, the rest for the target).
    """

    name = "pearl"
    lossless = True

    def __init__(self, verifier: str = "block", pre_verify: bool = True,
                 post_verify: bool = True, draft_threads: int | None = None,
                 target_threads: int | None = None) -> None:
        if verifier not in PLANS:
            raise ValueError(f"pearl verifies its windows with {' or '.join(PLANS)}, "
                             f"not {verifier!r}")
        self.verifier = verifier
        self.pre_verify = check_flag("pre_verify", pre_verify)
        self.post_verify = check_flag("post_verify", post_verify)
        self.draft_threads = None if draft_threads is None else check_positive(
            "draft_threads", draft_threads)
        self.target_threads = None if target_threads is None else check_positive(
            "target_threads", target_threads)


def pearl_generate(target: CausalLM, draft: CausalLM | None, prompt: Sequence[int], *,
                   method: ScheduledMethod, sampling: Sampling, gamma: int | str | None,
                   max_new_tokens: int, random: Randomness,
                   on_tokens: Callable[[list[int]], None] | None = None) -> GenerationOutput:
    """Run one PEARL request with a fresh pair of workers (``gamma``: N, "auto" or None=auto)."""
    from verispec.methods.pearl.coordinator import PearlEngine

    if not isinstance(method, PearlMethod):
        raise TypeError(f"pearl_generate needs a PearlMethod, got {type(method).__name__}")
    if draft is None:
        raise ValueError("pearl needs a draft model (use the model drafter, not the n-gram one)")
    with PearlEngine(target, draft, draft_threads=method.draft_threads,
                     target_threads=method.target_threads) as engine:
        return engine.generate(
            prompt, gamma="auto" if gamma is None else gamma, verifier=method.verifier,
            pre_verify=method.pre_verify, post_verify=method.post_verify, sampling=sampling,
            max_new_tokens=max_new_tokens, generator=random.generator, on_tokens=on_tokens,
        )


def _law(method: PearlMethod, target: Any, draft: Any, prompt: Sequence[int], *, gamma: int,
         sampling: Sampling, length: int,
         draft_stop: float | None = None) -> tuple[dict, float | None]:
    """The exact law of PEARL's schedule (PEARL has phases, not iterations: no expectation)."""
    from verispec.methods.pearl.reference import pearl_law

    if draft_stop is not None:
        raise ValueError("draft_stop is not defined for pearl")
    if gamma < 1:
        raise ValueError("pearl's window γ must be >= 1")
    law = pearl_law(target, draft, prompt, gamma=gamma, sampling=sampling, length=length,
                    verifier=method.verifier, pre_verify=method.pre_verify,
                    post_verify=method.post_verify)
    return law, None


PEARL = MethodInfo(
    "pearl", True,
    "PEARL (Liu et al.): draft and target run at the same time in two worker processes, "
    "pre-verify + post-verify, window γ = round(c) with gamma auto (default); options "
    "verifier token|block, pre_verify, post_verify, draft_threads, target_threads; lossless",
    PearlMethod, default_gamma=0, runner=pearl_generate, auto_gamma=True, law=_law,
    batchable=False,
)
