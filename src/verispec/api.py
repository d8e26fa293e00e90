"""The Python entry points: :func:`generate` (one prompt) and :func:`generate_batch` (many)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from verispec.bench.energy import EnergyMeter
from verispec.drafters.base import Drafter
from verispec.drafters.model import ModelDrafter
from verispec.drafters.ngram import NgramDrafter
from verispec.engine.batch import BatchedModelDrafter, BatchStats, PerRowDrafter, batched_generate
from verispec.engine.loop import speculative_generate
from verispec.engine.methods import Method
from verispec.engine.stats import Stats
from verispec.methods import METHODS, build_method
from verispec.models.base import CausalLM
from verispec.models.batched import as_batched
from verispec.models.fetch import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.loading import check_compatible, load_model, resolve_dtype
from verispec.sampling import Sampling

__all__ = [
    "BatchGenerationResult",
    "GenerationResult",
    "encode_prompt",
    "generate",
    "generate_batch",
    "make_drafter",
]


DRAFT_STOP_METHODS = ("token", "block")  # the draft-stop rule is proven lossless for these


@dataclass
class GenerationResult:
    """Tokens and text of one generation, with its statistics."""

    tokens: list[int]
    text: str
    stats: Stats


def encode_prompt(model: CausalLM, prompt: str | list[int]) -> list[int]:
    """Token ids of ``prompt`` (strings go through the target's tokenizer)."""
    if isinstance(prompt, list):
        ids = [int(t) for t in prompt]
    else:
        if not prompt:
            raise ValueError("the prompt is empty")
        ids = list(model.tokenizer.encode(prompt))  # type: ignore[attr-defined]
    if not ids:
        raise ValueError("the prompt is empty: it encodes to no tokens")
    return ids


def decode(model: CausalLM, ids: list[int]) -> str:
    tok = getattr(model, "tokenizer", None)
    return tok.decode(ids) if tok is not None else " ".join(map(str, ids))


def make_drafter(kind: str, draft: CausalLM | None, target: CausalLM, sampling: Sampling,
                 method: Method, draft_stop: float | None = None) -> Drafter | None:
    """Build the drafter the method needs (None for ``ar``).

    ``draft_stop``: the model drafter stops early where its own confidence falls below this
    (see :class:`~verispec.drafters.model.ModelDrafter`); token and block verification only.
    """
    if draft_stop is not None and (kind != "model" or method.name not in DRAFT_STOP_METHODS):
        raise ValueError(f"draft_stop works with the model drafter and the methods "
                         f"{', '.join(DRAFT_STOP_METHODS)} (lossless with them); "
                         f"not with {method.name} / the {kind} drafter")
    if not METHODS[method.name].uses_draft:
        return None
    if method.drafter_kind == "beam":
        from verispec.drafters.beam import BeamDrafter

        if draft is None:
            raise ValueError(f"{method.name} drafts by beam search with a draft model; give one")
        check_compatible(target, draft)
        return BeamDrafter(draft, sampling, num_beams=getattr(method, "num_beams", 8))
    if kind == "ngram":
        if method.needs_next_probs or method.num_drafts > 1:
            raise ValueError(f"{method.name} cannot use the n-gram drafter: it needs q as a fixed "
                             "function of the context (or several i.i.d. drafts); use the model "
                             "drafter")
        return NgramDrafter(target.vocab_size)
    if kind != "model":
        raise ValueError(f"drafter must be 'model' or 'ngram', got {kind!r}")
    if draft is None:
        raise ValueError("the model drafter needs a draft model")
    check_compatible(target, draft)
    return ModelDrafter(draft, sampling, stop_below=draft_stop)


def generate(
    target: str | CausalLM = DEFAULT_TARGET,
    draft: str | CausalLM | None = DEFAULT_DRAFT,
    prompt: str | list[int] = "",
    *,
    verifier: str | None = None,
    gamma: int | str | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    max_new_tokens: int = 64,
    drafter: str = "model",
    dtype: str = "auto",
    on_tokens: Callable[[list[int]], None] | None = None,
    progress: Callable[[str], None] | None = None,
    method: str | None = None,
    draft_stop: float | None = None,
    **method_options: Any,
) -> GenerationResult:
    """Generate text with speculative decoding (or ``verifier="ar"`` for the baseline).

    Args:
        target, draft: model names/paths/hub ids/toy specs, or loaded :class:`CausalLM`.
        verifier: a name from :data:`verispec.methods.METHODS` (default ``"block"``); when
            ``method`` is given, the verifier that method applies (``method="pearl",
            verifier="token"``).
        gamma: draft length γ (default: the method's default); ``"auto"`` for methods that
            measure it (pearl, whose default it is).
        method: a method name whose verification rule is chosen by ``verifier``.
        draft_stop: stop a model draft early where the draft's own top probability (at
            temperature 1) is below this; still lossless with token and block verification.
        method_options: options of the chosen method (e.g. ``epsilon``, ``num_drafts``).
    """
    if method is not None:  # method="pearl", verifier="token": the verifier is its option
        if verifier is not None:
            method_options["window_verifier"] = verifier
        verifier = method
    verifier = "block" if verifier is None else verifier
    if verifier not in METHODS:
        raise ValueError(f"unknown verifier {verifier!r}; choose one of {', '.join(METHODS)}")
    info = METHODS[verifier]
    if draft_stop is not None and verifier not in DRAFT_STOP_METHODS:
        raise ValueError(f"draft_stop works with {', '.join(DRAFT_STOP_METHODS)}, not {verifier}")
    if gamma is None:
        gamma = "auto" if info.auto_gamma else info.default_gamma
    if isinstance(gamma, str):
        if gamma != "auto" or not info.auto_gamma:
            raise ValueError(f"gamma must be an integer{' or auto' if info.auto_gamma else ''} "
                             f"for {verifier}, got {gamma!r}")
    elif info.uses_draft and gamma < 1:
        raise ValueError(f"gamma must be >= 1 for {verifier}, got {gamma}")
    method = build_method(verifier, **method_options)
    sampling = method.adjust_sampling(Sampling(temperature=temperature, top_k=top_k, top_p=top_p))
    if isinstance(target, str):
        target = load_model(target, dtype=dtype, progress=progress)
    needs_model = info.uses_draft and (drafter == "model" or method.drafter_kind == "beam")
    if needs_model and draft is None:
        raise ValueError(f"{verifier} with the model drafter needs a draft model")
    draft_model = None
    if needs_model and draft is not None:
        draft_model = load_model(draft, dtype=dtype, progress=progress) if isinstance(draft, str) else draft
    device = target.device
    ids = encode_prompt(target, prompt)
    generator = torch.Generator(device=device).manual_seed(seed)
    drafter_obj = None if info.runner else make_drafter(drafter, draft_model, target, sampling, method,
                                                         draft_stop)
    with EnergyMeter(device) as meter:
        if info.runner is not None:
            extra = {"draft": draft_model} if info.uses_draft else {}
            out = info.runner(target, ids, sampling=sampling, max_new_tokens=max_new_tokens,
                              generator=generator, on_tokens=on_tokens, gamma=gamma,
                              method=method, **extra)
        else:
            out = speculative_generate(
                target, drafter_obj, ids, method=method, gamma=gamma if info.uses_draft else 0,
                sampling=sampling, max_new_tokens=max_new_tokens, generator=generator,
                on_tokens=on_tokens,
            )
    out.stats.energy_joules, out.stats.energy_source = meter.joules, meter.source
    out.stats.notes.append(f"sampling: {sampling.describe()}")
    if hasattr(target, "model"):  # a real (Hugging Face) model: say which precision ran
        out.stats.notes.append(f"dtype: {resolve_dtype(dtype, device)[1]}")
    return GenerationResult(tokens=out.tokens, text=decode(target, out.tokens), stats=out.stats)


@dataclass
class BatchGenerationResult:
    """One :class:`GenerationResult` per prompt (input order) and the batch's statistics."""

    results: list[GenerationResult]
    stats: BatchStats


def generate_batch(
    target: str | CausalLM = DEFAULT_TARGET,
    draft: str | CausalLM | None = DEFAULT_DRAFT,
    prompts: Sequence[str | list[int]] = (),
    *,
    verifier: str = "block",
    gamma: int | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    seeds: Sequence[int] | None = None,
    max_new_tokens: int | Sequence[int] = 64,
    batch_size: int | None = None,
    drafter: str = "model",
    dtype: str = "auto",
    on_tokens: Callable[[int, list[int]], None] | None = None,
    progress: Callable[[str], None] | None = None,
    **method_options: Any,
) -> BatchGenerationResult:
    """Batched :func:`generate`: many prompts, ``batch_size`` rows decoded together.

    Each prompt gets its own method instance and its own ``torch.Generator`` seeded with
    ``seeds[i]`` (default: ``seed`` for every prompt), so prompt i's output is the one
    :func:`generate` gives it with that seed, whatever else shares the batch (exactly on toy
    models; up to float noise of batched kernels on real ones). Supports the methods that
    iterate Algorithm 3 with sampled drafts (``ar``, ``token``, ``block``, ``greedy-block``,
    ``lossy``, ``multidraft``); not MJSD's beam drafter nor MJGD.

    Args:
        prompts: texts or token-id lists.
        max_new_tokens: one budget, or one per prompt.
        batch_size: rows decoded at once (default: all prompts); a finished row's slot
            takes the next waiting prompt.
        on_tokens: ``on_tokens(prompt_index, new_tokens)`` after each accepted block.
    Returns:
        :class:`BatchGenerationResult`; ``stats.tokens_per_second`` is the whole batch's.
    """
    if isinstance(prompts, str):
        raise TypeError("prompts must be a list of prompts; use generate() for a single prompt")
    if verifier not in METHODS:
        raise ValueError(f"unknown verifier {verifier!r}; choose one of {', '.join(METHODS)}")
    info = METHODS[verifier]
    if not prompts:
        raise ValueError("no prompts given")
    if seeds is not None and len(seeds) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
    gamma = info.default_gamma if gamma is None else gamma
    if info.uses_draft and gamma < 1:
        raise ValueError(f"gamma must be >= 1 for {verifier}, got {gamma}")
    methods = [build_method(verifier, **method_options) for _ in prompts]
    if info.runner is not None or methods[0].drafter_kind != "sample":
        raise ValueError(f"{verifier} is not supported in batched mode; use one of ar, token, "
                         "block, greedy-block, lossy, multidraft")
    sampling = methods[0].adjust_sampling(Sampling(temperature=temperature, top_k=top_k, top_p=top_p))
    if isinstance(target, str):
        target = load_model(target, dtype=dtype, progress=progress)
    needs_model = info.uses_draft and drafter == "model"
    if needs_model and draft is None:
        raise ValueError(f"{verifier} with the model drafter needs a draft model")
    draft_model = None
    if needs_model and draft is not None:
        draft_model = load_model(draft, dtype=dtype, progress=progress) if isinstance(draft, str) else draft
    ids = [encode_prompt(target, p) for p in prompts]
    device = target.device
    generators = [torch.Generator(device=device).manual_seed(seed if seeds is None else int(s))
                  for s in (seeds if seeds is not None else [seed] * len(prompts))]
    single = make_drafter(drafter, draft_model, target, sampling, methods[0])  # validates the pair
    batched_drafter: Any = None
    if isinstance(single, ModelDrafter):
        batched_drafter = BatchedModelDrafter(as_batched(single.model), sampling)
    elif single is not None:
        batched_drafter = PerRowDrafter(
            lambda: make_drafter(drafter, draft_model, target, sampling, methods[0]))  # type: ignore
    with EnergyMeter(device) as meter:
        out = batched_generate(
            as_batched(target), batched_drafter, ids, methods=methods,
            gamma=gamma if info.uses_draft else 0, sampling=sampling,
            max_new_tokens=max_new_tokens, generators=generators, batch_size=batch_size,
            on_tokens=on_tokens,
        )
    out.stats.energy_joules, out.stats.energy_source = meter.joules, meter.source
    notes = [f"sampling: {sampling.describe()}"]
    if hasattr(target, "model"):  # a real (Hugging Face) model: say which precision ran
        notes.append(f"dtype: {resolve_dtype(dtype, device)[1]}")
    out.stats.notes.extend(notes)
    results = []
    for row in out.rows:
        row.stats.energy_source = "measured for the whole batch only (see the batch statistics)"
        row.stats.notes.extend(notes)
        results.append(GenerationResult(tokens=row.tokens, text=decode(target, row.tokens),
                                        stats=row.stats))
    return BatchGenerationResult(results=results, stats=out.stats)
