"""The Python entry points: :func:`generate` (one prompt) and :func:`generate_batch` (many).

Both run the one engine (:class:`verispec.engine.loop.Engine`): a single prompt is a batch
of one. Methods that run by a schedule of their own (MJGD, PEARL) go through their runner.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from verispec.drafters.base import Drafter
from verispec.engine.gamma import GammaPolicy
from verispec.engine.loop import Engine
from verispec.engine.protocols import ScheduledMethod
from verispec.engine.request import GenerationOutput, Request
from verispec.engine.stats import Stats
from verispec.models.base import CausalLM
from verispec.models.fetch import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.loading import check_compatible, load_model
from verispec.plan import (
    RequestConfig,
    RequestPlan,
    gamma_policy,
    held_overhead,
    make_drafter,
    pair_costs,
    pair_history,
    pair_overhead,
    plan_request,
)
from verispec.sampling import Randomness
from verispec.telemetry.energy import EnergyMeter

__all__ = [
    "BatchGenerationResult",
    "GenerationResult",
    "Pair",
    "RequestConfig",
    "encode_prompt",
    "generate",
    "generate_batch",
    "load_pair",
    "make_drafter",
    "pair_costs",
]


@dataclass
class GenerationResult:
    """Tokens and text of one generation, with its statistics."""

    tokens: list[int]
    text: str
    stats: Stats


@dataclass
class BatchGenerationResult:
    """One :class:`GenerationResult` per prompt (input order) and the batch's statistics."""

    results: list[GenerationResult]
    stats: Stats


@dataclass
class Pair:
    """A loaded target (p) and draft (q); the draft is None where no method needs it."""

    target: CausalLM
    draft: CausalLM | None


def encode_prompt(model: CausalLM, prompt: str | Sequence[int]) -> list[int]:
    """Token ids of ``prompt`` (strings go through the target's tokenizer)."""
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("the prompt is empty")
        if model.tokenizer is None:
            raise ValueError(f"{model.name} has no tokenizer: give the prompt as token ids")
        ids = list(model.tokenizer.encode(prompt))
    else:
        ids = [int(t) for t in prompt]
    if not ids:
        raise ValueError("the prompt is empty: it encodes to no tokens")
    return ids


def decode(model: CausalLM, ids: list[int]) -> str:
    tok = model.tokenizer
    return tok.decode(ids) if tok is not None else " ".join(map(str, ids))


def load_pair(target: str | CausalLM, draft: str | CausalLM | None, *, needs_draft: bool = True,
              precision: str = "auto", target_precision: str | None = None,
              draft_precision: str | None = None,
              progress: Callable[[str], None] | None = None) -> Pair:
    """Load (or pass through) the target and, if ``needs_draft``, the draft, in
    ``precision`` unless ``target_precision`` / ``draft_precision`` override it."""
    if isinstance(target, str):
        target = load_model(target, precision=target_precision or precision, progress=progress)
    if not needs_draft:
        return Pair(target, None)
    if draft is None:
        raise ValueError("this method drafts with a draft model; give one")
    if isinstance(draft, str):
        draft = load_model(draft, precision=draft_precision or precision, progress=progress,
                           role="draft")
    check_compatible(target, draft)
    return Pair(target, draft)


@dataclass
class _Run:
    """A planned request with its models and drafter: everything a run needs besides the
    prompts."""

    plan: RequestPlan
    pair: Pair
    drafter: Drafter | None
    #: The draft the caller gave as a loaded model, kept for fixed-γ runs that do not draft
    #: with it: their iterations are recorded for the pair's γ auto (:func:`held_overhead`).
    given_draft: CausalLM | None = None

    def policy(self, rows: int = 1) -> GammaPolicy:
        return gamma_policy(self.plan, self.pair.target, self.pair.draft, self.drafter, rows)

    def engine(self, rows: int = 1) -> Engine:
        """A fresh engine of ``rows`` rows over the target's weights; for γ auto with the
        iteration times the pair's earlier engines measured (:func:`pair_overhead`), and
        for a fixed γ with that record where γ auto made one, so that its iterations
        measure the shapes γ auto prices (:func:`held_overhead`)."""
        draft = self.pair.draft
        auto = self.plan.gamma == "auto" and self.drafter is not None and draft is not None
        if auto:
            overhead = pair_overhead(self.pair.target, draft, rows)
        else:
            overhead = held_overhead(self.pair.target, draft or self.given_draft, rows)
        return Engine(self.pair.target.spawn(), batch_size=rows, overhead=overhead)


def _prepare(target: str | CausalLM, draft: str | CausalLM | None, config: RequestConfig,
             progress: Callable[[str], None] | None, batched: bool = False) -> _Run:
    plan = plan_request(config, auto_default=batched)
    pair = load_pair(target, draft, needs_draft=plan.needs_draft, precision=config.precision,
                     target_precision=config.target_precision,
                     draft_precision=config.draft_precision, progress=progress)
    maker = None
    if plan.drafter is not None:  # on a fresh cache: the caller's rows stay
        draft_model = pair.draft.spawn() if pair.draft is not None else None
        maker = make_drafter(pair.target, draft_model, plan.engine_method, kind=config.drafter,
                             draft_stop=plan.draft_stop)
    return _Run(plan, pair, maker, draft if isinstance(draft, CausalLM) else None)


def _notes(run: _Run) -> list[str]:
    plan, pair = run.plan, run.pair
    notes = [f"sampling: {plan.sampling.describe()}"]
    if plan.gamma == "auto" and pair.draft is not None and plan.info.runner is None:
        notes.append("gamma auto: " + pair_costs(pair.target, pair.draft).describe())
        known = getattr(pair_history(pair.target, pair.draft, plan.engine_method.name,
                                     plan.sampling), "recorded", 0.0)
        if known:
            notes.append(f"gamma auto: the pair's acceptance started from {known:.0f} "
                         "positions recorded by earlier processes")
    models = [("target", pair.target), ("draft", pair.draft)]
    notes += [f"{role} precision: {m.precision}" for role, m in models if m is not None]
    return notes


def generate(
    target: str | CausalLM = DEFAULT_TARGET,
    draft: str | CausalLM | None = DEFAULT_DRAFT,
    prompt: str | Sequence[int] = "",
    *,
    method: str = "block",
    gamma: int | str | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    max_new_tokens: int = 64,
    drafter: str = "model",
    draft_stop: float | None = None,
    precision: str = "auto",
    draft_precision: str | None = None,
    on_tokens: Callable[[list[int]], None] | None = None,
    progress: Callable[[str], None] | None = None,
    ignore_eos: bool = False,
    **method_options: Any,
) -> GenerationResult:
    """Generate text with speculative decoding (``method="ar"`` for the baseline).

    Args:
        target, draft: model names, paths, hub ids or toy specs, or loaded models.
        method: a name from :data:`verispec.methods.METHODS`, optionally with options in
            brackets (``"lossy[epsilon=0.05]"``); options may also be keyword arguments.
        gamma: draft length γ (default: the method's); ``"auto"`` where the method takes it.
        draft_stop: stop a model draft early where the draft's own top probability (at
            temperature 1) is below this; still lossless with token and block verification.
        precision: numeric format of both models (``auto``, ``float32``, ``bfloat16``,
            ``int8``); ``draft_precision`` overrides it for the draft.
        on_tokens: called with each accepted block of new tokens. With it the request is
            streamed: ``gamma="auto"`` decodes the first token without the draft's reading of
            the prompt, so the time to it is plain decoding's; without it the draft may read
            and draft from the first iteration where that pays.
        ignore_eos: decode exactly ``max_new_tokens`` (unless the context window ends first):
            an EOS token is emitted like any other and decoding goes on, every token drawn
            from the method's law at its context (for a lossless method, the target's law
            with no EOS ids). For fixed-length benchmarks.
    """
    config = RequestConfig(method, method_options, gamma, drafter, draft_stop, temperature,
                           top_k, top_p, precision, draft_precision=draft_precision)
    run = _prepare(target, draft, config, progress)
    plan, tgt = run.plan, run.pair.target
    ids = encode_prompt(tgt, prompt)
    random = Randomness(torch.Generator(device=tgt.device).manual_seed(seed))
    with EnergyMeter(tgt.device) as meter:
        if plan.info.runner is not None:
            assert isinstance(plan.method, ScheduledMethod)
            out: GenerationOutput = plan.info.runner(
                _without_eos(tgt) if ignore_eos else tgt, run.pair.draft, ids,
                method=plan.method, sampling=plan.sampling,
                gamma=plan.gamma, max_new_tokens=max_new_tokens, random=random,
                on_tokens=on_tokens)
        else:
            request = Request(ids, plan.engine_method, plan.sampling, max_new_tokens, random,
                              run.policy(), run.drafter, on_tokens, ignore_eos=ignore_eos,
                              streamed=on_tokens is not None)
            engine = run.engine()  # a fresh cache over the same weights
            out = engine.run([request])[0]
            out.stats.target_passes = engine.passes
    out.stats.energy_joules, out.stats.energy_source = meter.joules, meter.source
    out.stats.notes.extend(_notes(run))
    return GenerationResult(tokens=out.tokens, text=decode(tgt, out.tokens), stats=out.stats)


def generate_batch(
    target: str | CausalLM = DEFAULT_TARGET,
    draft: str | CausalLM | None = DEFAULT_DRAFT,
    prompts: Sequence[str | Sequence[int]] = (),
    *,
    method: str = "block",
    gamma: int | str | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    seeds: Sequence[int] | None = None,
    max_new_tokens: int | Sequence[int] = 64,
    batch_size: int | None = None,
    drafter: str = "model",
    precision: str = "auto",
    draft_precision: str | None = None,
    on_tokens: Callable[[int, list[int]], None] | None = None,
    progress: Callable[[str], None] | None = None,
    ignore_eos: bool = False,
    **method_options: Any,
) -> BatchGenerationResult:
    """Batched :func:`generate`: many prompts, ``batch_size`` rows decoded together.

    Prompt i draws its randomness only from its own generator seeded with ``seeds[i]``
    (default: ``seed`` for every prompt). Two promises, by γ:

    * **a fixed γ** (an int): its output is the one :func:`generate` gives it with that seed
      and γ, whatever else shares the batch (exactly on toy models; up to the float rounding
      of batched kernels on real ones);
    * **γ auto** (the default where the draft model drafts): each iteration's draft lengths
      are chosen for the whole batch from the past only (each row's acceptance so far, the
      pair's pooled acceptance, the measured cost of a batched pass, the engine's time per
      iteration learned so far), so every prompt's output law is exactly the method's (the
      target's for a lossless method), but at T > 0 its seeded text can depend on the rest
      of the batch and on timing: another γ uses other random draws.

    A finished row's slot takes the next prompt.

    Args:
        gamma: draft length γ; None: ``"auto"`` where the draft model drafts, else the
            method's default.
        prompts: texts or token-id lists.
        max_new_tokens: one budget, or one per prompt.
        batch_size: rows decoded at once (default: all prompts).
        on_tokens: ``on_tokens(prompt_index, new_tokens)`` after each accepted block (the
            requests are then streamed, as in :func:`generate`).
        ignore_eos: every prompt decodes its whole budget (see :func:`generate`).
    Returns:
        :class:`BatchGenerationResult`; ``stats.tokens_per_second`` is the whole batch's.
    """
    seeds, budgets = _per_prompt(prompts, seed, seeds, max_new_tokens)
    config = RequestConfig(method, method_options, gamma, drafter, None, temperature, top_k,
                           top_p, precision, draft_precision=draft_precision)
    run = _prepare(target, draft, config, progress, batched=True)
    plan = run.plan
    if not plan.info.batchable:
        raise ValueError(f"{plan.info.name} runs by a schedule of its own and cannot share a "
                         "batch; use generate() for each prompt")
    tgt = run.pair.target
    engine = run.engine(len(prompts) if batch_size is None else batch_size)
    requests = _batch_requests(run, engine.batch_size, prompts, seeds, budgets, on_tokens,
                               ignore_eos)
    start = time.perf_counter()
    with EnergyMeter(tgt.device) as meter:
        rows = [engine.submit(r) for r in requests]
        while not engine.idle:
            engine.step()
    stats = engine.batch_stats(rows, time.perf_counter() - start)
    stats.energy_joules, stats.energy_source = meter.joules, meter.source
    notes = _notes(run)
    stats.notes.extend(notes)
    for row in rows:
        row.stats.energy_source = "measured for the whole batch only (see the batch statistics)"
        row.stats.notes.extend(notes)
    return BatchGenerationResult(
        results=[GenerationResult(tokens=list(r.emitted), text=decode(tgt, r.emitted),
                                  stats=r.stats) for r in rows], stats=stats)


def _batch_requests(run: _Run, batch_size: int, prompts: Sequence[str | Sequence[int]],
                    seeds: Sequence[int], budgets: Sequence[int],
                    on_tokens: Callable[[int, list[int]], None] | None,
                    ignore_eos: bool) -> list[Request]:
    """One engine request per prompt, each with its own generator seeded with its seed."""
    tgt, plan = run.pair.target, run.plan
    requests = []
    for i, (p, s, n) in enumerate(zip(prompts, seeds, budgets, strict=True)):
        callback = None if on_tokens is None else _indexed(on_tokens, i)
        requests.append(Request(encode_prompt(tgt, p), plan.engine_method, plan.sampling, n,
                                Randomness(torch.Generator(device=tgt.device).manual_seed(s)),
                                run.policy(batch_size), run.drafter, callback,
                                ignore_eos=ignore_eos, streamed=on_tokens is not None))
    return requests


def _per_prompt(prompts: Sequence[str | Sequence[int]], seed: int, seeds: Sequence[int] | None,
                max_new_tokens: int | Sequence[int]) -> tuple[list[int], list[int]]:
    """The seed and the token budget of every prompt of a batch (checked)."""
    if isinstance(prompts, str):
        raise TypeError("prompts must be a list of prompts; use generate() for a single prompt")
    if not prompts:
        raise ValueError("no prompts given")
    seeds = [seed] * len(prompts) if seeds is None else [int(s) for s in seeds]
    budgets = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) \
        else list(max_new_tokens)
    if len(seeds) != len(prompts) or len(budgets) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts need as many seeds and budgets, got "
                         f"{len(seeds)} and {len(budgets)}")
    return seeds, budgets


def _without_eos(model: CausalLM) -> CausalLM:
    """A twin of ``model`` (same weights, a cache of its own) that has no EOS ids: the
    target that methods running by their own schedule decode with under ``ignore_eos``."""
    twin = model.spawn()
    twin.eos_token_ids = frozenset()
    return twin


def _indexed(callback: Callable[[int, list[int]], None], index: int) -> Callable[[list[int]], None]:
    return lambda new: callback(index, new)
