"""Autoregressive decoding, token verification and block verification."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from verispec.engine.protocols import Method, SingleDraftMethod
from verispec.methods.registry import MethodInfo
from verispec.sampling import Sampling
from verispec.verify import block_plan, token_plan

__all__ = ["AR", "BLOCK", "TOKEN", "plan_method_law"]


def plan_method_law(method: Any, target: Any, draft: Any, prompt: Sequence[int], *, gamma: int,
                    sampling: Sampling, length: int,
                    draft_stop: float | None = None) -> tuple[dict, float | None]:
    """The exact law of a plan-based single-draft method (its ``plan``), with the model
    drafter, and the expected tokens of its first iteration (None with ``draft_stop``)."""
    from verispec.engine.exact import expected_accepted, speculative_law

    g = gamma if method.name != "ar" else 0
    law = speculative_law(target, draft, prompt, plan_fn=method.plan, gamma=g, sampling=sampling,
                          length=length, draft_stop=draft_stop)
    if g == 0:
        return law, 1.0
    if draft_stop is not None:
        return law, None
    first = min(g, length - 1)
    tau = expected_accepted(target, draft, prompt, plan_fn=method.plan, gamma=first,
                            sampling=sampling)[0]
    return law, tau + 1


def _builder(name: str, plan: Any) -> Any:
    def build() -> Method:
        return SingleDraftMethod(name, plan)

    return build


AR = MethodInfo("ar", True, "plain autoregressive decoding of the target (no draft), the "
                "baseline", _builder("ar", token_plan), drafting="none", default_gamma=0,
                law=plan_method_law)
TOKEN = MethodInfo("token", True, "token verification (Algorithm 1; Leviathan et al.): "
                   "lossless", _builder("token", token_plan), law=plan_method_law)
BLOCK = MethodInfo("block", True, "block verification (Algorithm 2; Sun et al. 2025): "
                   "lossless, optimal tokens per iteration", _builder("block", block_plan),
                   law=plan_method_law)
