"""The Python entry points: :func:`generate` (one prompt) and :func:`generate_batch` (many).

Both run the one engine (:class:`verispec.engine.loop.Engine`): a single prompt is a batch
of one. Methods that run by a schedule of their own (MJGD, PEARL) go through their runner.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from verispec.checks import check_positive
from verispec.drafters.base import Drafter
from verispec.engine.costs import BATCH_ROWS, measure_costs
from verispec.engine.gamma import (
    AutoGamma,
    FixedGamma,
    GammaPolicy,
    PairHistory,
    PassCosts,
)
from verispec.engine.loop import Engine
from verispec.engine.protocols import Method
from verispec.engine.request import GenerationOutput, Request
from verispec.engine.stats import Stats
from verispec.methods import MethodInfo, build_method, resolve
from verispec.models.base import CausalLM
from verispec.models.fetch import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.loading import check_compatible, load_model
from verispec.sampling import Randomness, Sampling
from verispec.telemetry.energy import EnergyMeter

__all__ = [
    "BatchGenerationResult",
    "GenerationResult",
    "Pair",
    "encode_prompt",
    "generate",
    "generate_batch",
    "load_pair",
    "make_drafter",
    "pair_costs",
]

DRAFT_STOP_METHODS = ("token", "block")  # the draft-stop rule is proven lossless for these
DRAFTERS = ("model", "ngram")


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
              precision: str = "auto", draft_precision: str | None = None,
              progress: Callable[[str], None] | None = None) -> Pair:
    """Load (or pass through) the target and, if ``needs_draft``, the draft."""
    if isinstance(target, str):
        target = load_model(target, precision=precision, progress=progress)
    if not needs_draft:
        return Pair(target, None)
    if draft is None:
        raise ValueError("this method drafts with a draft model; give one")
    if isinstance(draft, str):
        draft = load_model(draft, precision=draft_precision or precision, progress=progress,
                           role="draft")
    check_compatible(target, draft)
    return Pair(target, draft)


def make_drafter(target: CausalLM, draft: CausalLM | None, method: Method, *,
                 kind: str = "model", draft_stop: float | None = None) -> Drafter | None:
    """The drafter the method needs (None for methods that never draft).

    ``draft_stop``: the model drafter stops a row's draft early where its own confidence
    falls below this (see :class:`~verispec.drafters.model.ModelDrafter`); token and block
    verification only, for which it is proven lossless.
    """
    if kind not in DRAFTERS:
        raise ValueError(f"drafter must be one of {', '.join(DRAFTERS)}, got {kind!r}")
    if draft_stop is not None and (kind != "model" or method.name not in DRAFT_STOP_METHODS):
        raise ValueError(f"draft_stop works with the model drafter and the methods "
                         f"{', '.join(DRAFT_STOP_METHODS)} (lossless with them); "
                         f"not with {method.name} / the {kind} drafter")
    if method.drafter_kind == "beam":
        from verispec.drafters.beam import BeamDrafter

        if draft is None:
            raise ValueError(f"{method.name} drafts by beam search with a draft model; give one")
        return BeamDrafter(draft, num_beams=getattr(method, "num_beams", 8))
    if kind == "ngram":
        if method.needs_next_probs or method.num_drafts > 1:
            raise ValueError(f"{method.name} cannot use the n-gram drafter: it needs q as a fixed "
                             "function of the context (or several i.i.d. drafts); use the model "
                             "drafter")
        from verispec.drafters.ngram import NgramDrafter

        return NgramDrafter(target.vocab_size)
    if draft is None:
        raise ValueError("the model drafter needs a draft model")
    from verispec.drafters.model import ModelDrafter

    return ModelDrafter(draft, stop_below=draft_stop)


@dataclass
class _Plan:
    """Everything a run needs besides the prompts."""

    info: MethodInfo
    method: Method
    sampling: Sampling
    gamma: int | str
    pair: Pair
    drafter: Drafter | None


def _plan(target: str | CausalLM, draft: str | CausalLM | None, method: str,
          options: dict[str, Any], *, gamma: int | str | None, sampling: Sampling, drafter: str,
          draft_stop: float | None, precision: str, draft_precision: str | None,
          progress: Callable[[str], None] | None) -> _Plan:
    if "verifier" in options and not method.startswith("pearl"):
        raise ValueError(f"verifier={options['verifier']!r}: the verification method is chosen "
                         "with method=...; only pearl takes a verifier (for its windows)")
    info, opts = resolve(method, **options)
    built = build_method(info.name, **opts)
    gamma = _check_gamma(info, gamma)
    needs_draft = info.uses_draft and (drafter == "model" or built.drafter_kind == "beam")
    pair = load_pair(target, draft, needs_draft=needs_draft, precision=precision,
                     draft_precision=draft_precision, progress=progress)
    maker = None
    if info.runner is None and info.uses_draft:  # on a fresh cache: the caller's rows stay
        draft_model = pair.draft.spawn() if pair.draft is not None else None
        maker = make_drafter(pair.target, draft_model, built, kind=drafter, draft_stop=draft_stop)
    elif draft_stop is not None:
        raise ValueError(f"draft_stop works with {', '.join(DRAFT_STOP_METHODS)}, not {info.name}")
    return _Plan(info, built, built.adjust_sampling(sampling), gamma, pair, maker)


def _check_gamma(info: MethodInfo, gamma: int | str | None) -> int | str:
    if gamma is None:
        return "auto" if info.auto_gamma else info.default_gamma
    if isinstance(gamma, str):
        takes_auto = info.uses_draft or info.auto_gamma
        if gamma != "auto" or not takes_auto:
            raise ValueError(f"gamma must be an integer{' or auto' if takes_auto else ''} "
                             f"for {info.name}, got {gamma!r}")
        return gamma
    try:
        check_positive("gamma", gamma, minimum=1 if info.uses_draft else 0)
    except ValueError as exc:
        raise ValueError(f"{exc} ({info.name})") from None
    return gamma if info.uses_draft or info.runner is not None else 0


_COSTS: weakref.WeakKeyDictionary[
    CausalLM, weakref.WeakKeyDictionary[CausalLM, dict[tuple[int, ...], PassCosts]]] = \
    weakref.WeakKeyDictionary()


_HISTORY: weakref.WeakKeyDictionary[CausalLM, weakref.WeakKeyDictionary[CausalLM, PairHistory]] \
    = weakref.WeakKeyDictionary()


def pair_costs(target: CausalLM, draft: CausalLM, rows: int = 1) -> PassCosts:
    """The pair's measured pass costs (V(k), c), with the batched grid up to ``rows`` rows
    (:data:`~verispec.engine.costs.BATCH_ROWS` below it, and ``rows`` itself), timed once
    per machine, pair and grid (kept on disk) and held per process."""
    grid = tuple(sorted({1, rows, *(r for r in BATCH_ROWS if r < rows)}))
    per_draft = _COSTS.setdefault(target, weakref.WeakKeyDictionary())
    held = per_draft.setdefault(draft, {})
    if grid not in held:
        held[grid] = measure_costs(target, draft, rows=grid)
    return held[grid]


def pair_history(target: CausalLM, draft: CausalLM) -> PairHistory:
    """The pair's acceptance pooled over the requests of this process (γ auto's prior)."""
    return _HISTORY.setdefault(target, weakref.WeakKeyDictionary()).setdefault(
        draft, PairHistory())


def _policy(plan: _Plan, rows: int = 1) -> GammaPolicy:
    """A fresh γ policy for one request (``auto`` keeps per-request acceptance; ``rows``: the
    most rows its engine decodes together, the extent of the timed batch grid)."""
    if plan.drafter is None:
        return FixedGamma(0)
    if plan.gamma == "auto":
        if plan.pair.draft is None:
            raise ValueError("gamma='auto' times the draft model; the n-gram drafter has none")
        return AutoGamma(pair_costs(plan.pair.target, plan.pair.draft, rows),
                         min_gamma=1 if plan.method.needs_next_probs else 0,
                         history=pair_history(plan.pair.target, plan.pair.draft))
    assert isinstance(plan.gamma, int)
    return FixedGamma(plan.gamma)


def _notes(plan: _Plan) -> list[str]:
    notes = [f"sampling: {plan.sampling.describe()}"]
    if plan.gamma == "auto" and plan.pair.draft is not None and plan.info.runner is None:
        notes.append("gamma auto: " + pair_costs(plan.pair.target, plan.pair.draft).describe())
    models = [("target", plan.pair.target), ("draft", plan.pair.draft)]
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
        on_tokens: called with each accepted block of new tokens.
        ignore_eos: decode exactly ``max_new_tokens`` (unless the context window ends first):
            an EOS token is emitted like any other and decoding goes on, every token drawn
            from the method's law at its context (for a lossless method, the target's law
            with no EOS ids). For fixed-length benchmarks.
    """
    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p)
    plan = _plan(target, draft, method, method_options, gamma=gamma, sampling=sampling,
                 drafter=drafter, draft_stop=draft_stop, precision=precision,
                 draft_precision=draft_precision, progress=progress)
    tgt = plan.pair.target
    ids = encode_prompt(tgt, prompt)
    random = Randomness(torch.Generator(device=tgt.device).manual_seed(seed))
    with EnergyMeter(tgt.device) as meter:
        if plan.info.runner is not None:
            out: GenerationOutput = plan.info.runner(
                _without_eos(tgt) if ignore_eos else tgt, plan.pair.draft, ids,
                method=plan.method, sampling=plan.sampling,
                gamma=plan.gamma, max_new_tokens=max_new_tokens, random=random,
                on_tokens=on_tokens)
        else:
            request = Request(ids, plan.method, plan.sampling, max_new_tokens, random,
                              _policy(plan), plan.drafter, on_tokens, ignore_eos=ignore_eos)
            engine = Engine(tgt.spawn())  # a fresh cache over the same weights
            out = engine.run([request])[0]
            out.stats.target_passes = engine.passes
    out.stats.energy_joules, out.stats.energy_source = meter.joules, meter.source
    out.stats.notes.extend(_notes(plan))
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
    (default: ``seed`` for every prompt), so its output is the one :func:`generate` gives it
    with that seed, whatever else shares the batch (exactly on toy models; up to the float
    rounding of batched kernels on real ones). A finished row's slot takes the next prompt.

    Args:
        prompts: texts or token-id lists.
        max_new_tokens: one budget, or one per prompt.
        batch_size: rows decoded at once (default: all prompts).
        on_tokens: ``on_tokens(prompt_index, new_tokens)`` after each accepted block.
        ignore_eos: every prompt decodes its whole budget (see :func:`generate`).
    Returns:
        :class:`BatchGenerationResult`; ``stats.tokens_per_second`` is the whole batch's.
    """
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
    sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p)
    plan = _plan(target, draft, method, method_options, gamma=gamma, sampling=sampling,
                 drafter=drafter, draft_stop=None, precision=precision,
                 draft_precision=draft_precision, progress=progress)
    if not plan.info.batchable:
        raise ValueError(f"{plan.info.name} runs by a schedule of its own and cannot share a "
                         "batch; use generate() for each prompt")
    tgt = plan.pair.target
    engine = Engine(tgt.spawn(), batch_size=len(prompts) if batch_size is None else batch_size)
    requests = []
    for i, (p, s, n) in enumerate(zip(prompts, seeds, budgets, strict=True)):
        callback = None if on_tokens is None else _indexed(on_tokens, i)
        requests.append(Request(encode_prompt(tgt, p), plan.method, plan.sampling, n,
                                Randomness(torch.Generator(device=tgt.device).manual_seed(s)),
                                _policy(plan, engine.batch_size), plan.drafter, callback,
                                ignore_eos=ignore_eos))
    start = time.perf_counter()
    with EnergyMeter(tgt.device) as meter:
        rows = [engine.submit(r) for r in requests]
        while not engine.idle:
            engine.step()
    stats = engine.batch_stats(rows, time.perf_counter() - start)
    stats.energy_joules, stats.energy_source = meter.joules, meter.source
    notes = _notes(plan)
    stats.notes.extend(notes)
    results = []
    for row in rows:
        row.stats.energy_source = "measured for the whole batch only (see the batch statistics)"
        row.stats.notes.extend(notes)
        results.append(GenerationResult(tokens=list(row.emitted), text=decode(tgt, row.emitted),
                                        stats=row.stats))
    return BatchGenerationResult(results=results, stats=stats)


def _without_eos(model: CausalLM) -> CausalLM:
    """A twin of ``model`` (same weights, a cache of its own) that has no EOS ids: the
    target that methods running by their own schedule decode with under ``ignore_eos``."""
    twin = model.spawn()
    twin.eos_token_ids = frozenset()
    return twin


def _indexed(callback: Callable[[int, list[int]], None], index: int) -> Callable[[list[int]], None]:
    return lambda new: callback(index, new)
