"""MJSD and MJGD (Qin et al., mjsd-multi-token-joint-speculative-decoding.txt).

Neither method is lossless: both choose tokens by *joint* likelihood instead of sampling
from the target, so their outputs do not follow the target distribution. Their quality is
the perplexity of the output under the (unwarped) target, the paper's metric, which every
run reports in :class:`~verispec.engine.stats.Stats`.

* **MJSD** (``--verifier mjsd``, Algorithm 1): the draft model proposes the best beam of a
  width-``num_beams`` beam search over γ tokens (:class:`~verispec.drafters.beam.BeamDrafter`);
  the target keeps the longest prefix j with min(1, p(x_1..x_j) / q(x_1..x_j)) > ``threshold``
  and adds one token sampled from the target at position j+1
  (:func:`~verispec.verify.mjsd.mjsd_verify`).
* **MJGD** (``--verifier mjgd``, Definition 3.1): MJSD's quality reference. Each step runs a
  width-``num_beams`` beam search over K = γ tokens with the target alone and emits the best
  beam; it costs K target passes per step, so it is slow by design.

Warping rule (both methods): the paper samples p and q with top-k 20 then top-p 0.9
(Appendix D). That warp replaces the user's when ``paper_warp`` is True (the default) and the
user set neither top-k nor top-p; the user's temperature is always kept. With
``paper_warp=False``, or when the user gives their own top-k or top-p, the user's warp is used
unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from verispec.drafters.base import Draft
from verispec.drafters.beam import beam_search
from verispec.engine.loop import (
    GenerationOutput,
    accept_tokens,
    check_request,
    now,
    prefill,
    room_left,
)
from verispec.engine.methods import Method
from verispec.engine.stats import Stats
from verispec.methods import MethodInfo, register
from verispec.models.base import CausalLM
from verispec.sampling import Sampling
from verispec.verify import VerifyResult
from verispec.verify.mjsd import check_threshold, mjsd_verify

__all__ = ["PAPER_TOP_K", "PAPER_TOP_P", "MJGDMethod", "MJSDMethod", "mjgd_generate",
           "paper_sampling"]

PAPER_TOP_K = 20
PAPER_TOP_P = 0.9


def paper_sampling(sampling: Sampling, paper_warp: bool = True) -> Sampling:
    """The paper's warp (top-k 20, then top-p 0.9, user's temperature), unless
    ``paper_warp`` is False or the user chose a top-k or top-p of their own."""
    if not paper_warp or sampling.top_k is not None or sampling.top_p is not None:
        return sampling
    return Sampling(temperature=sampling.temperature, top_k=PAPER_TOP_K, top_p=PAPER_TOP_P)


def _check_beams(num_beams: int) -> int:
    if isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1:
        raise ValueError(f"num_beams must be an integer >= 1, got {num_beams!r}")
    return num_beams


def _check_flag(name: str, value: bool) -> bool:
    if type(value) is not bool:
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


class MJSDMethod(Method):
    """Multi-token joint speculative decoding, Algorithm 1 of the MJSD paper. NOT lossless.

    Attributes:
        num_beams: beam width of the draft model's beam search (>= 1).
        threshold: τ of the paper, in [0, 1]; 1 never accepts a draft token, 0 accepts every
            prefix the target gives positive probability.
        paper_warp: substitute the paper's top-20 / top-p 0.9 warp (see the module docstring).
    """

    name = "mjsd"
    lossless = False
    drafter_kind = "beam"

    def __init__(self, num_beams: int = 8, threshold: float = 0.1, paper_warp: bool = True) -> None:
        self.num_beams = _check_beams(num_beams)
        self.threshold = check_threshold(threshold)
        self.paper_warp = _check_flag("paper_warp", paper_warp)

    def adjust_sampling(self, sampling: Sampling) -> Sampling:
        return paper_sampling(sampling, self.paper_warp)

    def verify(self, target_probs: torch.Tensor, draft: Draft, generator: torch.Generator) -> VerifyResult:
        joint = draft.joint
        if joint is None:
            if draft.gamma > 0:
                raise ValueError("MJSD needs the joint draft probabilities q(x_1..x_j) of a "
                                 "beam drafter")
            joint = target_probs.new_empty((draft.tokens.shape[0], 0))  # empty block: Y only
        return mjsd_verify(target_probs, joint, draft.tokens, generator, threshold=self.threshold)


class MJGDMethod(Method):
    """Multi-token joint greedy decoding (Definition 3.1 of the MJSD paper), approximated by
    target-only beam search as in the paper. NOT lossless. Runs through :func:`mjgd_generate`,
    not through the speculative loop."""

    name = "mjgd"
    lossless = False

    def __init__(self, num_beams: int = 8, paper_warp: bool = True) -> None:
        self.num_beams = _check_beams(num_beams)
        self.paper_warp = _check_flag("paper_warp", paper_warp)

    def adjust_sampling(self, sampling: Sampling) -> Sampling:
        return paper_sampling(sampling, self.paper_warp)

    def verify(self, target_probs: torch.Tensor, draft: Draft, generator: torch.Generator) -> VerifyResult:
        raise RuntimeError("mjgd has no verification step; run it with mjgd_generate")


def mjgd_generate(
    target: CausalLM,
    prompt_ids: Sequence[int],
    *,
    sampling: Sampling,
    max_new_tokens: int,
    generator: torch.Generator,
    on_tokens: Callable[[list[int]], None] | None = None,
    gamma: int,
    method: Method,
) -> GenerationOutput:
    """MJGD: repeat {beam search of width ``method.num_beams`` over K = ``gamma`` tokens with
    the warped target; emit the best beam (clamped at EOS and the budget)}. NOT lossless.

    Deterministic (``generator`` is unused). Stats: ``target_calls`` counts target forward
    passes (K per step), ``iterations`` counts steps, ``bias_tv_sum`` = Σ (1 - p(x_i)) over
    emitted tokens (each is a deterministic choice), perplexity is under the unwarped target.
    """
    num_beams = _check_beams(getattr(method, "num_beams", 8))
    check_request(target, prompt_ids, max_new_tokens)
    if gamma < 1:
        raise ValueError(f"gamma (K, tokens per MJGD step) must be >= 1, got {gamma}")
    device = target.device
    stats = Stats(method=method.name or "mjgd", lossless=False, gamma=gamma)
    stats.notes.append(f"MJGD: target-only beam search, width {num_beams}, K={gamma} tokens/step")
    start = now(device)
    ctx = [int(t) for t in prompt_ids]
    prefill(target, ctx, stats, start)
    emitted: list[int] = []
    while not stats.stop_reason:
        room = room_left(target, ctx, len(emitted), max_new_tokens)
        k = min(gamma, room)
        t0, calls0 = now(device), target.forward_calls
        pending = torch.tensor(ctx[target.length :], dtype=torch.int64, device=device)
        first = target.extend(pending, num_logits=1)[0]  # [V]
        beam = beam_search(target, first, k, num_beams, sampling)
        new, stats.stop_reason = accept_tokens(beam.tokens.tolist(), target.eos_token_ids, room)
        target.rollback(min(len(ctx) + len(new), target.length))
        ctx.extend(new)
        emitted.extend(new)
        if not stats.stop_reason and target.max_length is not None and len(ctx) >= target.max_length:
            stats.stop_reason = "context_window"
        n = len(new)
        stats.nll_sum -= float(beam.raw_logprobs[:n].sum())
        stats.bias_tv_sum += float((1.0 - beam.probs[:n]).sum())
        stats.iterations += 1
        stats.target_calls += target.forward_calls - calls0
        stats.target_tokens_scored += int(pending.numel()) + beam.positions
        stats.tokens_emitted += n
        stats.target_time_s += now(device) - t0
        if on_tokens is not None:
            on_tokens(new)
    stats.wall_time_s = now(device) - start
    return GenerationOutput(tokens=emitted, stats=stats)


def _build_mjsd(**options: Any) -> Method:
    return MJSDMethod(**options)


def _build_mjgd(**options: Any) -> Method:
    return MJGDMethod(**options)


register(MethodInfo(
    "mjsd", False,
    "multi-token joint speculative decoding (Algorithm 1; Qin et al.): beam-search draft "
    "(--num-beams, default 8), keeps the longest prefix with min(1, p/q joint) > --threshold "
    "(default 0.1); NOT lossless, quality = perplexity under the target",
    _build_mjsd, default_gamma=4,
))
register(MethodInfo(
    "mjgd", False,
    "multi-token joint greedy decoding (Qin et al., Def. 3.1): target-only beam search "
    "(--num-beams) over γ tokens per step, MJSD's quality reference; NOT lossless, slow",
    _build_mjgd, uses_draft=False, default_gamma=4, runner=mjgd_generate,
))
