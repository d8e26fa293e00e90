"""Loading models by name: embedded defaults, local directories, hub ids and toy specs.

One precision knob, ``precision``: ``auto``, ``float32``, ``bfloat16``, ``int8`` or ``int4``
(:func:`resolve_precision` says what ``auto`` picks here and why).
Qwen2/Llama-family checkpoints run on the native runtime (:mod:`verispec.models.native`),
whose int8 and int4 weights are cached next to the float weights; other architectures run
through transformers (:class:`~verispec.models.hf.HFCausalLM`) in float32 or bfloat16.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from verispec.models.base import CausalLM
from verispec.telemetry.machine import cpu_info

if TYPE_CHECKING:
    from verispec.models.native.kernels import Int8Kernel

__all__ = [
    "PRECISIONS",
    "IncompatibleModelsError",
    "check_compatible",
    "default_device",
    "draft_vocabulary",
    "load_model",
    "load_transformers",
    "resolve_precision",
]

PRECISIONS = ("auto", "float32", "bfloat16", "int8", "int4")
ROLES = ("target", "draft")
#: How many ids a native draft scores besides each row's context ids: ``full`` (the default)
#: or a number (its static set, :func:`~verispec.models.native.vocabulary.subset_ids`: the
#: end-of-text ids and the ids most used in Python's standard library). A smaller head makes
#: every draft step cheaper; q is zero outside the scored ids and is still the distribution
#: the draft samples from, so every lossless verifier stays lossless (the target keeps its
#: whole vocabulary). On the embedded pair (int4 0.5B draft, 2-vCPU Intel Xeon with AMX),
#: 32768 ids with the context ids keep 1,874 of the 1,882 positions (of 1,983) where the
#: whole-vocabulary draft's greedy guess is the target's token and step in 22.4 ms against
#: 24.6 ms, but side by side on 8 HumanEval prompts (block, γ 6) the whole vocabulary ran at
#: 1.071× [0.990, 1.160] the subset's speed at T = 0 and 1.027× at T = 1: not the default.
DRAFT_VOCABULARY_ENV = "VERISPEC_DRAFT_VOCABULARY"
DRAFT_VOCABULARY = "full"


def draft_vocabulary() -> int | None:
    """The ids a native draft scores (:data:`DRAFT_VOCABULARY_ENV`; None: all of them)."""
    text = os.environ.get(DRAFT_VOCABULARY_ENV, DRAFT_VOCABULARY).strip()
    if text == "full":
        return None
    try:
        size = int(text)
    except ValueError:
        size = 0
    if size < 1:
        raise ValueError(f"{DRAFT_VOCABULARY_ENV} must be 'full' or a positive number of ids, "
                         f"got {text!r}")
    return size


class IncompatibleModelsError(ValueError):
    """Target and draft do not share one vocabulary / tokenizer."""


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _cpu_flags() -> frozenset[str]:
    return cpu_info().flags


def _cpu_has_fast_bf16() -> bool:
    return bool(_cpu_flags() & {"avx512_bf16", "amx_bf16"})


def _x86_missing(device: torch.device, precision: str) -> str | None:
    """Why ``device`` is not the x86 CPU that ``precision`` runs on (None: it is)."""
    if device.type != "cpu":
        return f"{precision} runs on x86 CPUs only, not on {device}"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"{precision} needs an x86-64 CPU (this one is {platform.machine()})"
    return None


def _int8_kernel(device: torch.device) -> tuple[Int8Kernel | None, str]:
    """(the int8 kernel for ``device``, why) or (None, why int8 cannot run there)."""
    missing = _x86_missing(device, "int8")
    if missing:
        return None, missing
    from verispec.models.native.kernels import choose

    return choose()


def _int4_missing(device: torch.device) -> str | None:
    """Why weight-only int4 cannot run on ``device`` (None: it can)."""
    missing = _x86_missing(device, "int4")
    if missing:
        return missing
    from verispec.models.native.linear import int4_available

    if not int4_available():
        return "int4 needs PyTorch's CPU int4 kernel, absent from this torch build"
    return None


def resolve_precision(precision: str, device: torch.device,
                      role: str = "target") -> tuple[str, str]:
    """(precision, a sentence saying why) for ``auto|float32|bfloat16|int8|int4`` on
    ``device``, for a model in ``role`` (``target`` or ``draft``).

    ``auto``: on an x86-64 CPU where an int8 kernel of this torch is proven exact
    (:mod:`verispec.models.native.kernels`), int8 for a target; for a draft weight-only
    int4 where the int4 kernel exists and steps faster than the int8 one on this CPU
    (:func:`~verispec.models.native.linear.int4_draft_faster`, measured once and recorded),
    int8 otherwise; bfloat16 on CUDA with bf16 support or a CPU with native bf16
    instructions; float32 otherwise.
    ``int4`` for a target runs on verispec's int4 kernel only, whose rows never see each
    other (torch's int4 kernel rounds as the pass size decides, which a draft may do — q is
    recorded in the pass that drew each token — and a target may not); ``auto`` never picks
    it for a target (int4 weights move the target further from its float weights than int8).
    Raises ValueError for an unknown precision or role and where kernels are missing.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    if precision == "int4":
        missing = _int4_missing(device)
        if missing:
            raise ValueError(f"{missing}; use int8, bfloat16 or float32")
        from verispec.models.native.int4_kernel import available, status

        if role == "target":
            if not available():
                raise ValueError(
                    f"an int4 target needs verispec's int4 kernel (a target's distribution "
                    f"must not depend on how many tokens a pass scores, and torch's int4 "
                    f"kernel rounds as the pass decides); here int4 runs {status()}: use "
                    f"int8 for the target")
            return "int4", (f"int4 (requested; every pass after the prompt on {status()}, "
                            f"prompts on the int8 form)")
        return "int4", f"int4 (requested; short passes on {status()})"
    if precision == "int8":
        kernel, why = _int8_kernel(device)
        if kernel is None:
            raise ValueError(f"{why}; use --precision bfloat16 or float32")
        return "int8", f"int8 (requested; kernel {why})"
    if precision != "auto":
        return precision, f"{precision} (requested)"
    kernel, why = _int8_kernel(device)
    if kernel is None:
        return _auto_float(device)
    if role == "draft" and _int4_missing(device) is None:
        from verispec.models.native.linear import int4_draft_faster

        faster, timing = int4_draft_faster(kernel)
        if faster:
            return "int4", (f"int4 (auto: a draft steps faster in weight-only int4 here, "
                            f"{timing}; its int8 form reads prompts; kernel {why})")
        return "int8", f"int8 (auto: a draft steps faster in int8 here, {timing}; kernel {why})"
    return "int8", f"int8 (auto: kernel {why})"


def _auto_float(device: torch.device) -> tuple[str, str]:
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return "bfloat16", "bfloat16 (auto: CUDA device with bf16 support)"
    if device.type == "cpu" and _cpu_has_fast_bf16():
        return "bfloat16", "bfloat16 (auto: this CPU has native bf16 instructions)"
    return "float32", "float32 (auto: no int8 or fast bf16 on this device)"


def _toy(spec: str) -> CausalLM:
    """``toy:ab-target``, ``toy:ab-draft``, ``toy:markov:V:SEED``, ``toy:random:V:SEED``."""
    from verispec.models.toy import ContextIndependentLM, MarkovLM, RandomContextLM

    parts = spec.split(":")[1:]
    kind = parts[0] if parts else ""
    if kind == "ab-target":
        return ContextIndependentLM([1 / 3, 2 / 3])
    if kind == "ab-draft":
        return ContextIndependentLM([2 / 3, 1 / 3])
    if kind in ("markov", "random") and len(parts) == 3:
        vocab, seed = int(parts[1]), int(parts[2])
        if kind == "markov":
            return MarkovLM.random(vocab, seed)
        return RandomContextLM(vocab, seed)
    raise ValueError(
        f"unknown toy model {spec!r}; use toy:ab-target, toy:ab-draft, toy:markov:V:SEED "
        "or toy:random:V:SEED"
    )


def load_model(
    spec: str,
    *,
    precision: str = "auto",
    device: torch.device | None = None,
    progress: Callable[[str], None] | None = None,
    role: str = "target",
) -> CausalLM:
    """Load a model from an embedded name, a local directory, a hub id or a toy spec.

    ``precision``: one of :data:`PRECISIONS` (see :func:`resolve_precision`); ``role``:
    ``target`` or ``draft`` (an int4 target needs verispec's int4 kernel; a native draft scores
    :func:`draft_vocabulary` ids). Toy models compute in
    exact float64 and take ``auto`` (or ``float64``) only. int8 and int4 run on the CPU
    (``device`` is then ignored unless it names another device, which is an error).
    """
    if spec.startswith("toy:"):
        if precision not in ("auto", "float64"):
            raise ValueError(f"toy model {spec!r} computes in exact float64; precision must be "
                             f"auto, not {precision!r}")
        return _toy(spec)
    if precision not in PRECISIONS:  # refuse before fetching anything
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision in ("int8", "int4") and device is None:
        device = torch.device("cpu")
    device = device or default_device()
    name, reason = resolve_precision(precision, device, role)

    from verispec.models.fetch import resolve

    location = resolve(spec, progress=progress)
    path = Path(location)
    hub = not path.is_dir()  # a hub id
    if hub:
        from huggingface_hub import hf_hub_download

        config = json.loads(Path(hf_hub_download(location, "config.json")).read_text())
    else:
        config = json.loads((path / "config.json").read_text())
    label = os.path.basename(location.rstrip("/")) or spec

    from verispec.models.native import load_native, native_supports

    if native_supports(config):
        if hub:  # the files the native runtime reads
            from huggingface_hub import snapshot_download

            if progress:
                progress(f"downloading {spec} from the Hugging Face hub")
            path = Path(snapshot_download(location, allow_patterns=[
                "*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "tokenizer*"]))
        if progress:
            progress(f"loading {spec} from {path}: {reason}, native runtime")
        draft = role == "draft"  # a draft needs no run-time rotations (load_native)
        return load_native(path, name, device=device, name=label, progress=progress,
                           vocabulary=draft_vocabulary() if draft else None,
                           online_rotations=not draft, exact_passes=not draft)
    if name in ("int8", "int4"):
        if precision == name:
            raise ValueError(
                f"{name} needs a Qwen2/Llama-family model (the native runtime); {spec} is "
                f"{config.get('model_type')!r}: use bfloat16 or float32")
        name, reason = _auto_float(device)
    return _load_transformers(spec, location, label, name, reason, device, progress)


def _load_transformers(spec: str, path: str, label: str, precision: str, reason: str,
                       device: torch.device, progress: Callable[[str], None] | None) -> CausalLM:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from verispec.models.hf import HFCausalLM

    hf_logging.disable_progress_bar()
    if progress:
        progress(f"loading {spec} from {path}: {reason}, transformers")
    dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    if precision == "int8":
        from verispec.models.native.hf_int8 import int8_transformers

        model = int8_transformers(model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return HFCausalLM(model, tokenizer, name=label, precision=precision)


def load_transformers(spec: str, *, precision: str, device: torch.device | None = None,
                      progress: Callable[[str], None] | None = None) -> CausalLM:
    """A model run by transformers itself (for the transformers peers), in ``precision``
    (``float32``, ``bfloat16`` or, for Qwen2/Llama-family models on an x86 CPU, ``int8``:
    the native int8 runtime's quantized model inside the transformers module)."""
    device = device or (torch.device("cpu") if precision == "int8" else default_device())
    name, reason = resolve_precision(precision, device)
    from verispec.models.fetch import resolve

    location = resolve(spec, progress=progress)
    label = os.path.basename(location.rstrip("/")) or spec
    return _load_transformers(spec, location, label, name, reason, device, progress)


_VOCAB_KEYS: dict[int, tuple[object, int]] = {}  # id(tokenizer) -> (tokenizer, vocab hash)


def _vocab_key(tokenizer: object) -> int | None:
    """A hash of the tokenizer's vocabulary (None without ``get_vocab``), computed once per
    tokenizer: reading a 150k-entry vocabulary takes a tenth of a second."""
    get = getattr(tokenizer, "get_vocab", None)
    if get is None:
        return None
    known = _VOCAB_KEYS.get(id(tokenizer))
    if known is None or known[0] is not tokenizer:
        known = (tokenizer, hash(frozenset(get().items())))
        _VOCAB_KEYS[id(tokenizer)] = known
    return known[1]


def check_compatible(target: CausalLM, draft: CausalLM) -> None:
    """Raise :class:`IncompatibleModelsError` unless both share vocabulary and tokenizer."""
    if target.vocab_size != draft.vocab_size:
        raise IncompatibleModelsError(
            f"vocabulary sizes differ: target {target.name} has {target.vocab_size}, "
            f"draft {draft.name} has {draft.vocab_size}"
        )
    t_tok, d_tok = getattr(target, "tokenizer", None), getattr(draft, "tokenizer", None)
    if t_tok is not d_tok and _vocab_key(t_tok) != _vocab_key(d_tok):
        raise IncompatibleModelsError(
            f"tokenizers differ between target {target.name} and draft {draft.name}: the same "
            "token id would mean different text"
        )
