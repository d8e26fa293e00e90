"""The native Qwen2/Llama-family runtime: a compact decoder over a preallocated KV cache,
in float32, bfloat16 or (x86 CPU) int8 with per-token activation scales or weight-only
int4.

* :func:`load_native` — from a Hugging Face directory (int8 and int4 weights are cached on
  disk);
* :func:`from_hf_module` — from an in-memory transformers ``*ForCausalLM`` module.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from verispec.models.native import codes_kernel, int4_kernel
from verispec.models.native.config import NativeConfig, UnsupportedModelError, unsupported_reason
from verispec.models.native.linear import (
    default_kernel,
    int4_available,
    int8_available,
    split_pass_sizes,
)
from verispec.models.native.lm import NativeCausalLM
from verispec.models.native.model import Transformer
from verispec.models.native.retime import LibraryClock
from verispec.models.native.vocabulary import subset_ids
from verispec.models.native.weights import (
    CACHE_FILES,
    build_dense,
    build_int4,
    build_int8,
    cache_file,
    dir_tensors,
    int4_state,
    int8_layers,
    int8_state,
    linear_layers,
    load_cache,
    module_tensors,
    packed_state,
    save_cache,
)

__all__ = [
    "CACHE_FILES",
    "NATIVE_PRECISIONS",
    "NativeCausalLM",
    "NativeConfig",
    "Transformer",
    "UnsupportedModelError",
    "cache_file",
    "from_hf_module",
    "load_native",
    "native_supports",
    "subset_ids",
]

NATIVE_PRECISIONS = ("float32", "bfloat16", "int8", "int4")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def native_supports(config: Any) -> bool:
    """Whether a transformers config (object or ``config.json`` dict) runs natively."""
    return unsupported_reason(config) is None


def _check(precision: str, device: torch.device, exact_passes: bool) -> None:
    if precision not in NATIVE_PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(NATIVE_PRECISIONS)}, "
                         f"got {precision!r}")
    if precision == "int4":
        if device.type != "cpu" or not int4_available():
            raise ValueError(f"int4 needs PyTorch's CPU int4 kernel; not available on {device}")
        if exact_passes and not int4_kernel.available():
            raise ValueError(
                f"an int4 model whose passes must score as one token at a time would (a "
                f"target) needs verispec's int4 kernel, and here int4 runs {int4_kernel.status()}"
                f" (its rounding depends on the pass); load it as a draft "
                f"(exact_passes=False) or use int8")
    if precision == "int8":
        if device.type != "cpu":
            raise ValueError(f"int8 runs on the CPU only (oneDNN / fbgemm kernels), not on "
                             f"{device}; use bfloat16 or float32 there")
        default_kernel()  # ValueError with the reason where no kernel is exact here


def _eos(generation: Any, tokenizer: Any, config: Any) -> frozenset[int]:
    ids: set[int] = set()
    sources = [getattr(generation, "eos_token_id", None) if not isinstance(generation, dict)
               else generation.get("eos_token_id"), getattr(tokenizer, "eos_token_id", None)]
    if not sources[0]:
        sources.append(config.get("eos_token_id") if isinstance(config, dict)
                       else getattr(config, "eos_token_id", None))
    for s in sources:
        if isinstance(s, int):
            ids.add(s)
        elif s is not None:
            ids.update(int(i) for i in s)
    return frozenset(ids)


def from_hf_module(module: Any, tokenizer: Any = None, name: str = "native",
                   precision: str = "float32", device: torch.device | str | None = None,
                   vocabulary: int | None = None, online_rotations: bool = True,
                   exact_passes: bool = False) -> NativeCausalLM:
    """A native model with the weights of an in-memory transformers ``*ForCausalLM``
    (copied: fused, cast or quantized). ``device`` defaults to the module's;
    ``vocabulary``: score only that many ids (:func:`subset_ids`; a draft's option);
    ``online_rotations`` and ``exact_passes``: see :func:`load_native`."""
    dev = torch.device(device) if device is not None else next(module.parameters()).device
    _check(precision, dev, exact_passes)
    config = NativeConfig.from_hf(module.config)
    get = module_tensors(module)
    eos = _eos(getattr(module, "generation_config", None), tokenizer, module.config)
    ids = subset_ids(vocabulary, config.vocab_size, eos, tokenizer)
    prefill = None
    blocks = _online_blocks(online_rotations)
    with torch.no_grad():
        if precision == "int8":
            net = _split(build_int8(config, int8_state(config, get, vocabulary=ids, **blocks)))
        elif precision == "int4":
            net = build_int4(config, int4_state(config, get, ids))
            if exact_passes:
                net = _exact_int4(net)
            if int8_available():  # prompts are read faster by the int8 kernel
                prefill = _split(build_int8(config,
                                            int8_state(config, get, vocabulary=ids, **blocks)))
        else:
            net = build_dense(config, get, DTYPES[precision], dev, ids)
    return NativeCausalLM(net, tokenizer, name, eos_token_ids=eos, precision=precision,
                          prefill_net=prefill, vocabulary=None if ids is None else vocabulary,
                          online_rotations=online_rotations, exact_passes=exact_passes)


def _exact_int4(net: Transformer) -> Transformer:
    """``net`` (int4) as a target runs it: every layer on verispec's int4 kernel, whose rows
    never see each other, and attention in the dtype that gives a row the same result
    whatever the pass (:meth:`Transformer.exact`). Raises ValueError where a
    layer's shape does not fit the kernel (torch's kernel would round it as the pass
    decides)."""
    layers = linear_layers(net)
    off = sum(getattr(lin, "lanes", None) is None for lin in layers)
    if off:
        raise ValueError(
            f"{off} of {len(layers)} int4 layers do not fit verispec's int4 kernel (input "
            f"widths a multiple of {int4_kernel.GROUP}, outputs of {int4_kernel.LANES}), so "
            f"their rounding would depend on the pass: such a model runs int4 as a draft only")
    return net.exact()


def _online_blocks(online_rotations: bool) -> dict[str, Any]:
    """:func:`int8_state`'s run-time rotation options: its defaults, or none."""
    return {} if online_rotations else {"down_block": None, "o_block": None}


def load_native(path: str | os.PathLike[str], precision: str = "float32", *,
                device: torch.device | str | None = None, tokenizer: Any = None,
                name: str | None = None, cache: bool = True, load_tokenizer: bool = True,
                progress: Callable[[str], None] | None = None,
                vocabulary: int | None = None, online_rotations: bool = True,
                exact_passes: bool = False) -> NativeCausalLM:
    """A native model from a Hugging Face directory.

    ``vocabulary``: score only that many ids (:func:`subset_ids`) and each row's context
    ids (:mod:`~verispec.models.native.vocabulary`): a draft's lm_head over a subset, its q
    zero elsewhere.

    ``online_rotations`` (int8): rotate the inputs of ``o_proj`` and ``down_proj`` at run
    time (:func:`~verispec.models.native.weights.int8_state`), which brings the int8 model
    closer to float32 for one small matmul per layer. Drafts are loaded without them: a
    draft's q only has to be the distribution its tokens are drawn from, and the 0.5B draft
    accepts as often without them (the loaders of :mod:`verispec.models.loading`).

    ``exact_passes`` (a target's need, which :func:`~verispec.models.loading.load_model`
    sets for targets): every pass scores its tokens bit for bit as passes of one token
    would. int8 and float models do so anyway. int4 models read prompts on their int8
    form where it runs; with ``exact_passes`` every later pass runs on verispec's int4
    kernel, whose rows never see each other (:mod:`~verispec.models.native.int4_kernel`;
    where it cannot run, such a model is refused), and without it passes of many tokens
    move to the int8 form, which is faster there.

    int8 and int4: the quantized weights are read from verispec's cache
    (:func:`cache_file`: per model directory, kernel and machine) when it holds them for
    these float weights; otherwise they are made from the float weights and
    (``cache=True``) saved there for the next load. A cache that cannot be written just
    skips the saving.
    """
    path = Path(path)
    dev = torch.device(device) if device is not None else torch.device("cpu")
    _check(precision, dev, exact_passes)
    config_dict = json.loads((path / "config.json").read_text())
    config = NativeConfig.from_hf(config_dict)
    say = progress or (lambda _msg: None)
    if tokenizer is None and load_tokenizer:  # (a PEARL worker needs none)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    gen_file = path / "generation_config.json"
    generation = json.loads(gen_file.read_text()) if gen_file.exists() else {}
    eos = _eos(generation, tokenizer, config_dict)
    ids = subset_ids(vocabulary, config.vocab_size, eos, tokenizer, progress)
    t0 = time.perf_counter()
    prefill = None
    with torch.no_grad():
        if precision in DTYPES:
            net = build_dense(config, dir_tensors(path), DTYPES[precision], dev, ids)
        else:
            net = _quantized_net(path, config, precision, cache, say, progress, ids,
                                 online_rotations)
            if precision == "int4" and exact_passes:
                net = _exact_int4(net)
        if precision == "int4" and int8_available():  # prompts are read faster in int8
            prefill = _quantized_net(path, config, "int8", cache, say, progress, ids,
                                     online_rotations)
    model = NativeCausalLM(net, tokenizer, name or path.name, eos_token_ids=eos,
                           precision=precision, source=str(path), prefill_net=prefill,
                           vocabulary=None if ids is None else vocabulary,
                           online_rotations=online_rotations, exact_passes=exact_passes)
    scored = "" if ids is None else f", scoring {ids.numel()} of {config.vocab_size} ids" + (
        " and each row's context ids" if model.context is not None else "")
    say(f"loaded {path.name} ({precision}{scored}) in {time.perf_counter() - t0:.1f} s")
    return model


def _quantized_net(path: Path, config: NativeConfig, precision: str, cache: bool,
                   say: Callable[[str], None], progress: Callable[[str], None] | None,
                   ids: Tensor | None = None, online_rotations: bool = True) -> Transformer:
    """The int8 or int4 model of ``path`` (an lm_head over ``ids`` only, when given), from
    its cache file when valid (else made and cached)."""
    kernel = default_kernel() if precision == "int8" else None
    state = (load_cache(path, precision, kernel, ids, online_rotations=online_rotations)
             if cache else None)
    file = cache_file(path, precision, kernel, ids, online_rotations=online_rotations)
    if state is not None:
        try:
            if kernel is None:
                return build_int4(config, state)
            net = build_int8(config, state, kernel)
            return _split(net, file if cache else None, say)
        except (RuntimeError, ValueError) as e:  # packed weights this torch cannot rebuild
            say(f"ignoring the cached {precision} weights: {e}")
    what = f"{precision} ({kernel})" if kernel else precision
    say(f"quantizing {path.name} to {what} (once; cached in {file.parent})")
    if kernel is not None:
        state = int8_state(config, dir_tensors(path), progress, vocabulary=ids,
                           **_online_blocks(online_rotations))
        net = build_int8(config, state, kernel)
        state = packed_state(net)
    else:
        state = int4_state(config, dir_tensors(path), ids)
        net = build_int4(config, state)
    if cache:
        try:
            saved = save_cache(path, precision, state, kernel, ids,
                               online_rotations=online_rotations)
            say(f"saved {saved.name} ({saved.stat().st_size / 2**30:.2f} GiB)")
        except OSError as e:
            say(f"could not cache the {precision} weights: {e}")
    return net if kernel is None else _split(net, file if cache else None, say)


def _split(net: Transformer, file: Path | None = None,
           say: Callable[[str], None] = lambda _msg: None) -> Transformer:
    """``net`` with its int8 passes split between a mixed kernel's libraries
    (:func:`split_pass_sizes`), timed once per cache ``file`` (None: timed, not kept), and
    re-timed from its own passes while it runs where both libraries stay in use
    (:class:`~verispec.models.native.retime.LibraryClock`)."""
    record = None if file is None else f"{file.parent.name}/{file.stem.rsplit('-', 1)[0]}-passes"
    layers = int8_layers(net)
    fused = sum(1 for layer in layers if layer._fused)
    say(f"int8 activation codes: {codes_kernel.status()} ({fused} of {len(layers)} layers)")
    say(split_pass_sizes(layers, record))
    if LibraryClock.applies(layers):
        net.libraries = LibraryClock(layers)
    return net
