"""Loading models by name: embedded defaults, local directories, hub ids and toy specs."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from verispec.models.base import CausalLM
from verispec.models.toy import ContextIndependentLM, MarkovLM, RandomContextLM, TableLM

__all__ = [
    "QUANTIZE_CHOICES",
    "IncompatibleModelsError",
    "check_compatible",
    "default_device",
    "load_model",
    "quantize_int8",
    "resolve_dtype",
]

QUANTIZE_CHOICES = ("none", "int8")


class IncompatibleModelsError(ValueError):
    """Target and draft do not share one vocabulary / tokenizer."""


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _cpu_has_fast_bf16() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return any(flag in flags for flag in ("avx512_bf16", "amx_bf16"))


def resolve_dtype(dtype: str, device: torch.device) -> tuple[torch.dtype, str]:
    """Map ``auto|float32|bfloat16`` to a torch dtype and a sentence saying why."""
    if dtype == "float32":
        return torch.float32, "float32 (requested)"
    if dtype == "bfloat16":
        return torch.bfloat16, "bfloat16 (requested)"
    if dtype != "auto":
        raise ValueError(f"dtype must be auto, float32 or bfloat16, got {dtype!r}")
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16, "bfloat16 (auto: CUDA device with bf16 support)"
    if device.type == "cpu" and _cpu_has_fast_bf16():
        return torch.bfloat16, "bfloat16 (auto: this CPU has native bf16 instructions)"
    return torch.float32, "float32 (auto: no fast bf16 on this device)"


def _toy(spec: str) -> TableLM:
    """``toy:ab-target``, ``toy:ab-draft``, ``toy:markov:V:SEED``, ``toy:random:V:SEED``."""
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
    dtype: str = "auto",
    device: torch.device | None = None,
    progress: Callable[[str], None] | None = None,
    quantize: str = "none",
) -> CausalLM:
    """Load a model from an embedded name, a local directory, a hub id or a toy spec.

    ``quantize="int8"`` applies :func:`quantize_int8` (meant for the draft: q is whatever the
    quantized draft outputs, so every lossless verifier stays lossless).
    """
    if quantize not in QUANTIZE_CHOICES:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZE_CHOICES)}, got {quantize!r}")
    if spec.startswith("toy:"):
        if quantize != "none":
            raise ValueError(f"toy model {spec!r} is exact float64 and cannot be quantized")
        return _toy(spec)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from verispec.models.fetch import resolve
    from verispec.models.hf import HFCausalLM

    hf_logging.disable_progress_bar()
    device = device or default_device()
    torch_dtype, _ = resolve_dtype(dtype, device)
    if quantize == "int8":  # refuse before the load, which takes seconds to a minute
        _check_int8(spec, device, torch_dtype)
    path = resolve(spec, progress=progress)
    if progress:
        progress(f"loading {spec} ({torch_dtype}) from {path}")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    loaded = HFCausalLM(model, tokenizer, name=os.path.basename(str(path).rstrip("/")) or spec)
    if quantize == "int8":
        if progress:
            progress(f"quantizing {spec}: dynamic int8 linear layers (CPU)")
        return quantize_int8(loaded, inplace=True)  # the float copy is ours: no second copy
    return loaded


def quantize_int8(model: CausalLM, *, inplace: bool = False) -> CausalLM:
    """A float32 CPU transformers model whose ``nn.Linear`` layers run dynamic int8 matmuls
    (int8 weights, activations quantized per call), named ``<name>+int8``. It is a copy
    unless ``inplace``, which converts ``model``'s own module and saves the memory of a copy.

    Used on the draft. The draft's q is then the quantized model's own distribution, which
    the engine records exactly as sampled, so lossless verification stays lossless; only
    acceptance can change. Raises TypeError for non-transformers models, and ValueError for
    weights that are not float32 and for models off the CPU (PyTorch's dynamic int8 kernels
    are CPU-only).
    """
    import copy
    import warnings

    from torch.ao.quantization import quantize_dynamic

    from verispec.models.hf import HFCausalLM

    if not isinstance(model, HFCausalLM):
        raise TypeError(f"int8 quantization needs a transformers model, got {type(model).__name__}")
    module = model.model
    param = next(module.parameters())
    _check_int8(model.name, param.device, param.dtype)
    with warnings.catch_warnings():
        # The pinned torch still ships these kernels but announces their move to torchao.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        source = module if inplace else copy.deepcopy(module)
        quantized = quantize_dynamic(source, {torch.nn.Linear}, dtype=torch.qint8,
                                     inplace=inplace)
    return HFCausalLM(quantized, model.tokenizer, name=f"{model.name}+int8")


def _check_int8(name: str, device: torch.device, dtype: torch.dtype) -> None:
    if device.type != "cpu":
        raise ValueError(f"int8 dynamic quantization runs on the CPU only; {name} is on {device}")
    if dtype != torch.float32:
        raise ValueError(f"int8 dynamic quantization needs float32 weights; {name} is "
                         f"{dtype} (use --dtype float32)")


def check_compatible(target: CausalLM, draft: CausalLM) -> None:
    """Raise :class:`IncompatibleModelsError` unless both share vocabulary and tokenizer."""
    if target.vocab_size != draft.vocab_size:
        raise IncompatibleModelsError(
            f"vocabulary sizes differ: target {target.name} has {target.vocab_size}, "
            f"draft {draft.name} has {draft.vocab_size}"
        )
    t_tok, d_tok = getattr(target, "tokenizer", None), getattr(draft, "tokenizer", None)
    get_t, get_d = getattr(t_tok, "get_vocab", None), getattr(d_tok, "get_vocab", None)
    if get_t is not None and get_d is not None and get_t() != get_d():
        raise IncompatibleModelsError(
            f"tokenizers differ between target {target.name} and draft {draft.name}: the same "
            "token id would mean different text"
        )
