"""MJSD and MJGD (*Multi-Token Joint Speculative Decoding for Accelerating Large Language Model
Inference*, Qin et al.).

Neither method is lossless: both choose tokens by *joint* likelihood instead of sampling
from the target, so their outputs do not follow the target distribution. Their quality is
the perplexity of the output under the (unwarped) target, the paper's metric, which every
run reports in :class:`~verispec.engine.stats.Stats`.

* **MJSD** (``--method mjsd``, Algorithm 1): the draft model proposes the best beam of a
  width-``num_beams`` beam search over γ tokens (:class:`~verispec.drafters.beam.BeamDrafter`);
  the target keeps the longest prefix j with min(1, p(x_1..x_j) / q(x_1..x_j)) > ``threshold``
  and adds one token sampled from the target at position j+1
  (:func:`~verispec.verify.mjsd.mjsd_verify`).
* **MJGD** (``--method mjgd``, Definition 3.1): MJSD's quality reference. Each step runs a
  width-``num_beams`` beam search over K = γ tokens with the target alone and emits the best
  beam; it costs K target passes per step, so it is slow by design.

Warping rule (both methods): the paper samples p and q with top-k 20 then top-p 0.9
(Appendix D). That warp replaces the user's when ``paper_warp`` is True (the default) and the
user set neither top-k nor top-p; the user's temperature is always kept. With
``paper_warp=False``, or when the user gives their own top-k or top-p, the user's warp is used
unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from verispec.checks import check_flag, check_positive
from verispec.drafters.beam import BeamDrafter, beam_search
from verispec.engine.protocols import Method, ScheduledMethod, VerifyBatch
from verispec.engine.request import GenerationOutput, accept_tokens, check_request
from verispec.engine.stats import Stats
from verispec.methods.registry import MethodInfo
from verispec.models.base import CausalLM
from verispec.sampling import Randomness, Sampling, choose_rows
from verispec.verify import VerifyResult
from verispec.verify.mjsd import check_threshold, mjsd_accepted

__all__ = ["MJGD", "MJSD", "PAPER_TOP_K", "PAPER_TOP_P", "MJGDMethod", "MJSDMethod",
           "mjgd_generate", "paper_sampling"]

PAPER_TOP_K = 20
PAPER_TOP_P = 0.9


def paper_sampling(sampling: Sampling, paper_warp: bool = True) -> Sampling:
    """The paper's warp (top-k 20, then top-p 0.9, user's temperature), unless
    ``paper_warp`` is False or the user chose a top-k or top-p of their own."""
    if not paper_warp or sampling.top_k is not None or sampling.top_p is not None:
        return sampling
    return Sampling(temperature=sampling.temperature, top_k=PAPER_TOP_K, top_p=PAPER_TOP_P)


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

    def __init__(self, num_beams: int = 8, threshold: float = 0.1, paper_warp: bool = True) -> None:
        self.num_beams = check_positive("num_beams", num_beams)
        self.threshold = check_threshold(threshold)
        self.paper_warp = check_flag("paper_warp", paper_warp)

    def adjust_sampling(self, sampling: Sampling) -> Sampling:
        return paper_sampling(sampling, self.paper_warp)

    def verify(self, batch: VerifyBatch) -> VerifyResult:
        """τ = the longest prefix whose joint ratio passes; Y ~ p at position τ+1; the step's
        exact bias Σ_{i≤τ} (1 − p(x_i)) (each accepted token is a deterministic choice)."""
        p, tokens = batch.target_probs[:, 0], batch.draft_tokens[:, 0]  # [B, γ+1, V], [B, γ]
        b, gamma = tokens.shape
        joint = batch.joint[:, 0] if batch.joint is not None else \
            torch.ones((b, gamma), dtype=torch.float64, device=p.device)  # [B, γ]
        if gamma > 0 and batch.joint is None:
            raise ValueError("MJSD needs the joint draft probabilities q(x_1..x_j) of a beam drafter")
        tau = mjsd_accepted(p, joint, tokens, self.threshold,
                            lengths=batch.lengths if batch.ragged else None)  # [B]
        rows = torch.arange(b, device=p.device)
        y_dist = p[rows, tau.to(p.device)]  # [B, V]
        y = torch.cat(choose_rows(batch.randoms, list(y_dist.split(1))))  # [B]
        p_x = p[:, :gamma].gather(-1, tokens[..., None]).squeeze(-1).to(torch.float64)  # [B, γ]
        kept = torch.arange(gamma, device=p.device)[None] < tau.to(p.device)[:, None]
        bias = torch.where(kept, 1.0 - p_x, 0.0).sum(dim=1)  # [B]
        return VerifyResult(num_accepted=tau, next_token=y, bias_tv=bias)


class MJGDMethod(ScheduledMethod):
    """Multi-token joint greedy decoding (Definition 3.1 of the MJSD paper), approximated by
    target-only beam search as in the paper. NOT lossless. It runs by its own schedule
    (:func:`mjgd_generate`), not the engine's draft → verify loop."""

    name = "mjgd"
    lossless = False

    def __init__(self, num_beams: int = 8, paper_warp: bool = True) -> None:
        self.num_beams = check_positive("num_beams", num_beams)
        self.paper_warp = check_flag("paper_warp", paper_warp)

    def adjust_sampling(self, sampling: Sampling) -> Sampling:
        return paper_sampling(sampling, self.paper_warp)


def mjgd_generate(target: CausalLM, draft: CausalLM | None, prompt: Sequence[int], *,
                  method: ScheduledMethod, sampling: Sampling, gamma: int | str | None,
                  max_new_tokens: int, random: Randomness,
                  on_tokens: Callable[[list[int]], None] | None = None) -> GenerationOutput:
    """MJGD: repeat {beam search of width ``method.num_beams`` over K = ``gamma`` tokens with
    the warped target; emit the best beam (clamped at EOS and the budget)}. NOT lossless.

    Deterministic (``random`` is unused). Stats: ``target_calls`` counts target forward
    passes (K per step), ``iterations`` counts steps, ``bias_tv_sum`` = Σ (1 - p(x_i)) over
    emitted tokens (each is a deterministic choice), perplexity is under the unwarped target.
    """
    if not isinstance(method, MJGDMethod):
        raise TypeError(f"mjgd_generate needs an MJGDMethod, got {type(method).__name__}")
    check_request(target, prompt, max_new_tokens)
    k_max = check_positive("gamma (K, tokens per MJGD step)", gamma)
    stats = Stats(method=method.name, lossless=False, gamma=k_max)
    stats.notes.append(f"MJGD: target-only beam search, width {method.num_beams}, "
                       f"K={k_max} tokens/step")
    start = time.perf_counter()
    ctx = [int(t) for t in prompt]
    target.reset()
    target.add_rows([ctx[:-1]])
    stats.prefill_calls = int(len(ctx) > 1)
    emitted: list[int] = []
    while not stats.stop_reason:
        room = max_new_tokens - len(emitted)
        if target.max_length is not None:
            room = min(room, target.max_length - len(ctx))
        calls0 = target.forward_calls
        first = target.extend([ctx[target.length :]], num_logits=1)[0, 0]  # [V]
        beam = beam_search(target, first, min(k_max, room), method.num_beams, sampling)
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
        stats.target_tokens_scored += 1 + beam.positions
        stats.tokens_emitted += n
        if on_tokens is not None:
            on_tokens(new)
    stats.wall_time_s = time.perf_counter() - start
    target.reset()
    return GenerationOutput(tokens=emitted, stats=stats)


def _mjsd_law(method: MJSDMethod, target: Any, draft: Any, prompt: Sequence[int], *,
              gamma: int, sampling: Sampling, length: int,
              draft_stop: float | None = None) -> tuple[dict, float | None]:
    """One MJSD iteration's law: the real beam drafter (deterministic) proposes the block,
    :func:`~verispec.verify.mjsd.mjsd_accepted` fixes τ, and Y ~ p at position τ+1."""
    from verispec.engine.exact import Outcome, clamp, first_step_tokens, walk, warped

    if draft_stop is not None:
        raise ValueError("draft_stop is not defined for mjsd")
    p = warped(target, sampling)
    drafter = BeamDrafter(draft, method.num_beams)

    def step(ctx: tuple[int, ...], room: int, state: Any) -> Iterable[Outcome]:
        g = min(gamma, room - 1)
        tokens: list[int] = []
        tau = 0
        if g > 0:
            row = _LawRow(list(ctx), sampling)
            drafter.admit([row])
            d = drafter.propose([row], [g])[0]
            drafter.release([row])
            tokens = d.tokens[0].tolist()
            p_rows = torch.stack([p(ctx + tuple(tokens[:i])) for i in range(g + 1)])[None]
            tau = int(mjsd_accepted(p_rows, d.joint, d.tokens, method.threshold)[0])
        y_law = p(ctx + tuple(tokens[:tau]))  # [V]
        out: dict[tuple[tuple[int, ...], bool], float] = {}
        for y in (y_law > 0).nonzero().flatten().tolist():
            key = clamp(tokens[:tau] + [y], target.eos_token_ids, room)
            out[key] = out.get(key, 0.0) + float(y_law[y])
        return [(new, stop, w, None) for (new, stop), w in out.items()]

    return walk(prompt, length, step), first_step_tokens(step, prompt, length)


class _LawRow:
    """A stand-in request for running the beam drafter inside the exact law."""

    id = 0
    num_drafts = 1
    with_next = False
    matching = False

    def __init__(self, context: list[int], sampling: Sampling) -> None:
        self.context, self.sampling = context, sampling
        self.random = Randomness(torch.Generator())


def _mjgd_law(method: MJGDMethod, target: Any, draft: Any, prompt: Sequence[int], *,
              gamma: int, sampling: Sampling, length: int,
              draft_stop: float | None = None) -> tuple[dict, float | None]:
    """MJGD is deterministic: one sequence with probability 1."""
    out = mjgd_generate(target.spawn(), None, list(prompt), method=method, sampling=sampling,
                        gamma=gamma, max_new_tokens=length, random=Randomness(torch.Generator()))
    return {tuple(out.tokens): 1.0}, float(min(gamma, length))


MJSD = MethodInfo(
    "mjsd", False,
    "multi-token joint speculative decoding (Algorithm 1; Qin et al.): beam-search draft "
    "(num_beams, default 8), keeps the longest prefix with min(1, p/q joint) > threshold "
    "(default 0.1); NOT lossless, quality = perplexity under the target",
    MJSDMethod, drafting="beam", default_gamma=4, law=_mjsd_law,
)
MJGD = MethodInfo(
    "mjgd", False,
    "multi-token joint greedy decoding (Qin et al., Def. 3.1): target-only beam search "
    "(num_beams) over γ tokens per step, MJSD's quality reference; NOT lossless, slow",
    MJGDMethod, drafting="none", default_gamma=4, runner=mjgd_generate, law=_mjgd_law,
    batchable=False,
)
