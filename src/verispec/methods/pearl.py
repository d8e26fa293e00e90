"""PEARL (Liu et al., pearl-parallel-speculative-decoding.txt) as a registered method.

``verispec generate --method pearl [--verifier token|block] [--gamma auto|N]
[--no-pre-verify] [--no-post-verify] [--draft-threads N] [--target-threads N]
[--timeline out.png]`` and ``verispec.generate(..., method="pearl", verifier="token")``.
Lossless with either verifier. It does not iterate Algorithm 3: its runner starts a
:class:`~verispec.engine.pearl.coordinator.PearlEngine` (two worker processes) for the
request and stops it afterwards; the worker start-up is reported, not counted in the wall
time. Call the engine directly to serve many prompts with the same workers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from verispec.drafters.base import Draft
from verispec.engine.loop import GenerationOutput
from verispec.engine.methods import Method
from verispec.engine.pearl.schedule import PLANS
from verispec.methods import MethodInfo, register
from verispec.models.base import CausalLM
from verispec.sampling import Sampling
from verispec.verify import VerifyResult

__all__ = ["PearlMethod", "pearl_generate"]


def _check_flag(name: str, value: bool) -> bool:
    if type(value) is not bool:
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def _check_threads(name: str, value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


class PearlMethod(Method):
    """PEARL's options; lossless.

    Attributes:
        window_verifier: ``"token"`` or ``"block"``, applied to every verified block.
        pre_verify, post_verify: the two strategies (False: the Table 3 ablations).
        draft_threads, target_threads: torch threads per worker (None: a third of the cores
            for the draft, the rest for the target).
    """

    name = "pearl"
    lossless = True

    def __init__(self, window_verifier: str = "block", pre_verify: bool = True,
                 post_verify: bool = True, draft_threads: int | None = None,
                 target_threads: int | None = None) -> None:
        if window_verifier not in PLANS:
            raise ValueError(f"pearl verifies its windows with {' or '.join(PLANS)}, "
                             f"not {window_verifier!r}")
        self.window_verifier = window_verifier
        self.pre_verify = _check_flag("pre_verify", pre_verify)
        self.post_verify = _check_flag("post_verify", post_verify)
        self.draft_threads = _check_threads("draft_threads", draft_threads)
        self.target_threads = _check_threads("target_threads", target_threads)

    def verify(self, target_probs: torch.Tensor, draft: Draft, generator: torch.Generator) -> VerifyResult:
        raise RuntimeError("pearl runs its own schedule; use pearl_generate")


def pearl_generate(
    target: CausalLM,
    prompt_ids: Sequence[int],
    *,
    sampling: Sampling,
    max_new_tokens: int,
    generator: torch.Generator,
    on_tokens: Callable[[list[int]], None] | None = None,
    gamma: int | str | None,
    method: Method,
    draft: CausalLM | None = None,
) -> GenerationOutput:
    """Run one PEARL request with a fresh pair of workers (``gamma``: N, "auto" or None=auto)."""
    from verispec.engine.pearl.coordinator import PearlEngine

    if not isinstance(method, PearlMethod):
        raise TypeError(f"pearl_generate needs a PearlMethod, got {type(method).__name__}")
    if draft is None:
        raise ValueError("pearl needs a draft model (use the model drafter, not the n-gram one)")
    with PearlEngine(target, draft, draft_threads=method.draft_threads,
                     target_threads=method.target_threads) as engine:
        return engine.generate(
            prompt_ids, gamma="auto" if gamma is None else gamma, verifier=method.window_verifier,
            pre_verify=method.pre_verify, post_verify=method.post_verify, sampling=sampling,
            max_new_tokens=max_new_tokens, generator=generator, on_tokens=on_tokens,
        )


def _build(**options: Any) -> Method:
    return PearlMethod(**options)


register(MethodInfo(
    "pearl", True,
    "PEARL (Liu et al.): draft and target run at the same time in two worker processes, "
    "pre-verify + post-verify, window γ = round(c) with --gamma auto (default); "
    "--verifier token|block checks each window; lossless",
    _build, default_gamma=0, runner=pearl_generate, auto_gamma=True,
))
