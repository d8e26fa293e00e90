"""The Python entry point: :func:`generate`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from verispec.bench.energy import EnergyMeter
from verispec.drafters.base import Drafter
from verispec.drafters.model import ModelDrafter
from verispec.drafters.ngram import NgramDrafter
from verispec.engine.loop import speculative_generate
from verispec.engine.methods import Method
from verispec.engine.stats import Stats
from verispec.methods import METHODS, build_method
from verispec.models.base import CausalLM
from verispec.models.fetch import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.loading import check_compatible, load_model, resolve_dtype
from verispec.sampling import Sampling

__all__ = ["GenerationResult", "encode_prompt", "generate", "make_drafter"]


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
                 method: Method) -> Drafter | None:
    """Build the drafter the method needs (None for ``ar``)."""
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
    return ModelDrafter(draft, sampling)


def generate(
    target: str | CausalLM = DEFAULT_TARGET,
    draft: str | CausalLM | None = DEFAULT_DRAFT,
    prompt: str | list[int] = "",
    *,
    verifier: str = "block",
    gamma: int | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    max_new_tokens: int = 64,
    drafter: str = "model",
    dtype: str = "auto",
    on_tokens: Callable[[list[int]], None] | None = None,
    progress: Callable[[str], None] | None = None,
    **method_options: Any,
) -> GenerationResult:
    """Generate text with speculative decoding (or ``verifier="ar"`` for the baseline).

    Args:
        target, draft: model names/paths/hub ids/toy specs, or loaded :class:`CausalLM`.
        verifier: a name from :data:`verispec.methods.METHODS`.
        gamma: draft length γ (default: the method's default).
        method_options: options of the chosen method (e.g. ``epsilon``, ``num_drafts``).
    """
    if verifier not in METHODS:
        raise ValueError(f"unknown verifier {verifier!r}; choose one of {', '.join(METHODS)}")
    info = METHODS[verifier]
    gamma = info.default_gamma if gamma is None else gamma
    if info.uses_draft and gamma < 1:
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
    drafter_obj = None if info.runner else make_drafter(drafter, draft_model, target, sampling, method)
    with EnergyMeter(device) as meter:
        if info.runner is not None:
            out = info.runner(target, ids, sampling=sampling, max_new_tokens=max_new_tokens,
                              generator=generator, on_tokens=on_tokens, gamma=gamma, method=method)
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
