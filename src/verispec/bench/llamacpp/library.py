"""llama-cpp-python for the llama.cpp peers: whether it is installed (and how to install
it), GGUF models loaded once per process, and ``llamacpp-ar``, llama.cpp's plain decoding
(see :mod:`verispec.bench.llamacpp` for the peers' conventions)."""

from __future__ import annotations

import atexit
import contextlib
import importlib.metadata
import math
import os
import random
import re
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from verispec.bench.options import INSTALL_COMMAND, PIP_CMAKE_FLAGS  # import-light
from verispec.bench.peers import PeerResult

__all__ = [
    "DEFAULT_EOS",
    "INSTALL_COMMAND",
    "INSTALL_COMMAND_PLAIN",
    "LLAMA_CPP_PYTHON_VERSION",
    "PEERS",
    "PIP_CMAKE_FLAGS",
    "LlamaCppUnavailableError",
    "clear_cache",
    "default_threads",
    "eog_ids",
    "forward_ms",
    "llamacpp_available",
    "load_gguf",
    "next_token_law",
    "provenance",
    "run_ar",
]

PEERS = ("llamacpp-ar", "llamacpp-spec")

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
"""The version pinned by verispec's ``peers`` extra (also the source of the example build)."""

DEFAULT_EOS = (151645, 151643)
"""EOS ids of the embedded target (``<|im_end|>``, ``<|endoftext|>``); pass the target's
``eos_token_ids``."""

CMAKE_FLAGS_UNKNOWN = "unknown (pip build; flags not recorded by llama-cpp-python)"

#: ggml's build options worth reporting, as its installed ``ggml-config.cmake`` records them.
GGML_OPTIONS = ("GGML_NATIVE", "GGML_OPENMP", "GGML_LLAMAFILE", "GGML_CPU_REPACK", "GGML_BLAS",
                "GGML_CUDA", "GGML_BUILD_COMMIT")

INSTALL_COMMAND_PLAIN = (
    f'CMAKE_ARGS="{" ".join(PIP_CMAKE_FLAGS)}" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) '
    f"pip install --no-cache-dir 'llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}'"
)

_MIN_CTX = 4096

Progress = Callable[[str], None]


class LlamaCppUnavailableError(ImportError):
    """llama-cpp-python is missing or unusable; the message says how to install it."""


# --------------------------------------------------------------------------- availability


def _install_hint() -> str:
    return (f"install it (compiles llama.cpp, a few minutes) from a verispec checkout with\n"
            f"  {INSTALL_COMMAND}\n"
            f"or, outside a checkout,\n"
            f"  {INSTALL_COMMAND_PLAIN}")


def llamacpp_available() -> str | None:
    """None if llama-cpp-python imports and its library loads, else why not and what to run."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError as exc:
        return f"the llama.cpp peers need llama-cpp-python, which is not installed ({exc}); " \
               + _install_hint()
    except Exception as exc:  # noqa: BLE001 - the shared library failed to load (OSError, ...)
        return f"llama-cpp-python is installed but does not load ({type(exc).__name__}: " \
               f"{exc}); reinstall it: " + _install_hint()
    return None


def _llama_cpp() -> Any:
    reason = llamacpp_available()
    if reason is not None:
        raise LlamaCppUnavailableError(reason)
    import llama_cpp

    return llama_cpp


def _installed_version() -> str | None:
    try:
        return importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        return None


def default_threads() -> int:
    """CPUs this process may run on (llama.cpp's default counts physical cores instead)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _cmake_values(path: Path, names: Sequence[str]) -> dict[str, str]:
    """``set(NAME "value")`` lines of an installed CMake package config file."""
    found = dict(re.findall(r'^set\((\w+)\s+"?([^")]*)"?\)', path.read_text("utf-8", "replace"),
                            re.MULTILINE))
    return {n: found[n] for n in names if n in found}


def _installed_build_record() -> dict[str, str]:
    """The ggml options and llama.cpp commit that llama-cpp-python's installed CMake package
    files (``ggml-config.cmake``, ``llama-config.cmake``) record; empty where absent."""
    try:
        files = importlib.metadata.files("llama-cpp-python") or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    out: dict[str, str] = {}
    for f in files:
        name = Path(str(f)).name
        wanted = GGML_OPTIONS if name == "ggml-config.cmake" else \
            ("LLAMA_BUILD_COMMIT",) if name == "llama-config.cmake" else ()
        path = Path(str(f.locate()))
        if wanted and path.is_file():
            out.update(_cmake_values(path, wanted))
    return out


def provenance() -> dict[str, Any]:
    """What ``llamacpp-ar`` runs: the llama-cpp-python version, llama.cpp's ``system_info``
    string, the CMake flags of the build (a pip build does not record them: said so, not
    guessed) and the ggml options and commit its installed CMake package files record."""
    llama_cpp = _llama_cpp()
    info = llama_cpp.llama_print_system_info()
    text = info.decode("utf-8", "replace") if isinstance(info, bytes) else str(info)
    return {"llama_cpp_python": _installed_version(), "system_info": text.strip(" |"),
            "cmake_flags": CMAKE_FLAGS_UNKNOWN, "installed_build": _installed_build_record()}


# --------------------------------------------------------------------------- loaded models

_MODELS: dict[tuple[str, int, bool], Any] = {}
_VOCABS: dict[str, Any] = {}
_EOG: dict[str, tuple[int, ...]] = {}


def _ctx_size(needed: int) -> int:
    return max(_MIN_CTX, -(-needed // 1024) * 1024)


def load_gguf(path: str | os.PathLike[str], *, threads: int | None = None, n_ctx: int = _MIN_CTX,
              flash_attn: bool = True) -> Any:
    """A ``llama_cpp.Llama`` for ``path``, cached per (resolved path, threads, flash_attn).

    A cached model whose context is smaller than ``n_ctx`` is replaced by a larger one. The
    batch holds the whole context, so a prompt is one prefill call.
    """
    llama_cpp = _llama_cpp()
    resolved = str(Path(path).expanduser().resolve())
    if not Path(resolved).is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    threads = threads or default_threads()
    key = (resolved, threads, flash_attn)
    llm = _MODELS.get(key)
    if llm is not None and llm.n_ctx() >= n_ctx:
        return llm
    if llm is not None:
        llm.close()
        del _MODELS[key]
    size = _ctx_size(n_ctx)
    llm = llama_cpp.Llama(model_path=resolved, n_ctx=size, n_batch=size, n_ubatch=512,
                          n_threads=threads, n_threads_batch=threads, n_gpu_layers=0,
                          flash_attn=flash_attn, logits_all=False, verbose=False)
    _MODELS[key] = llm
    return llm


def next_token_law(path: str | os.PathLike[str], ids: Sequence[int], temperature: float, *,
                   threads: int | None = None) -> Any:
    """llama.cpp's law of the token after ``ids`` at ``temperature`` > 0 (the softmax of its
    logits over the tempered vocabulary, what its temp + dist chain draws from): [V] float64
    torch tensor."""
    import numpy as np
    import torch

    if temperature <= 0:
        raise ValueError(f"next_token_law needs temperature > 0, got {temperature}")
    llama_cpp = _llama_cpp()
    tokens = [int(t) for t in ids]
    llm = load_gguf(path, threads=threads, n_ctx=len(tokens) + 8)
    llm.reset()
    llm.eval(tokens)
    vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(llm.model)))
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(vocab,))
    return (torch.from_numpy(logits.astype(np.float64)) / temperature).softmax(-1)


def _vocab(path: str | os.PathLike[str]) -> Any:
    """A vocabulary-only ``Llama`` (tokenizer of the GGUF; loads in well under a second)."""
    llama_cpp = _llama_cpp()
    resolved = str(Path(path).expanduser().resolve())
    vocab = _VOCABS.get(resolved)
    if vocab is None:
        if not Path(resolved).is_file():
            raise FileNotFoundError(f"GGUF file not found: {path}")
        vocab = llama_cpp.Llama(model_path=resolved, vocab_only=True, verbose=False)
        _VOCABS[resolved] = vocab
    return vocab


def eog_ids(path: str | os.PathLike[str]) -> tuple[int, ...]:
    """Every end-of-generation id of the GGUF's vocabulary (``llama_vocab_is_eog``): the ids
    at which llama.cpp stops, and to which its ``--ignore-eos`` gives a −inf logit bias."""
    resolved = str(Path(path).expanduser().resolve())
    ids = _EOG.get(resolved)
    if ids is None:
        llama_cpp = _llama_cpp()
        pointer = llama_cpp.llama_model_get_vocab(_vocab(resolved).model)
        n = int(llama_cpp.llama_vocab_n_tokens(pointer))
        ids = tuple(i for i in range(n) if llama_cpp.llama_vocab_is_eog(pointer, i))
        _EOG[resolved] = ids
    return ids


def clear_cache() -> None:
    """Free every model loaded by this module."""
    for cache in (_MODELS, _VOCABS):
        for llm in cache.values():
            with contextlib.suppress(Exception):
                llm.close()
        cache.clear()
    _EOG.clear()


# Models still cached at exit are freed while llama_cpp is intact (left to the interpreter's
# teardown, Llama.__del__ finds the library's functions already gone and prints a traceback).
atexit.register(clear_cache)


# --------------------------------------------------------------------------- llamacpp-ar


@contextlib.contextmanager
def _sampler(llama_cpp: Any, temperature: float, seed: int, masked: Sequence[int] = (),
             n_vocab: int = 0) -> Iterator[Any]:
    """llama.cpp sampler chain: greedy at T = 0, else temp(T) then dist(seed), nothing else;
    preceded by a −inf logit bias on the ``masked`` ids if any (the place and value llama.cpp's
    own sampler gives the biases of ``--ignore-eos``)."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    try:
        if masked:
            biases = (llama_cpp.llama_logit_bias * len(masked))(
                *(llama_cpp.llama_logit_bias(int(t), -math.inf) for t in masked))
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_logit_bias(
                int(n_vocab), len(masked), biases))
        if temperature <= 0:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
        else:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(
                float(temperature)))
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(
                int(seed) & 0xFFFFFFFF))
        yield chain
    finally:
        llama_cpp.llama_sampler_free(chain)


def run_ar(prompt: list[int], *, gguf: str | os.PathLike[str], temperature: float,
           max_new_tokens: int, seed: int, threads: int | None, eos: Sequence[int],
           flash_attn: bool, ignore_eos: bool = False) -> PeerResult:
    """``llamacpp-ar`` on one prompt. ``prefill_seconds`` covers ``eval(prompt)`` and the
    first token's sampling; ``ignore_eos`` masks every end-of-generation id (as
    ``llama-speculative-simple --ignore-eos`` does) and decodes the whole budget."""
    llama_cpp = _llama_cpp()
    threads = threads or default_threads()
    llm = load_gguf(gguf, threads=threads, n_ctx=len(prompt) + max_new_tokens,
                    flash_attn=flash_attn)
    masked = eog_ids(gguf) if ignore_eos else ()
    stop = frozenset() if ignore_eos else frozenset(int(t) for t in eos)
    tokens: list[int] = []
    calls = positions = 0
    first: float | None = None
    with _sampler(llama_cpp, temperature, seed, masked, llm.n_vocab() if masked else 0) \
            as chain:
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt)
        calls += 1
        positions += len(prompt)
        while True:
            token = int(llama_cpp.llama_sampler_sample(chain, llm.ctx, -1))
            tokens.append(token)
            if first is None:
                first = time.perf_counter()
            if token in stop or len(tokens) >= max_new_tokens:
                break
            llm.eval([token])
            calls += 1
            positions += 1
        seconds = time.perf_counter() - start
    notes = [(f"llama.cpp plain decoding of {Path(gguf).name} ({threads} threads, flash "
              f"attention {'on' if flash_attn else 'off'})")]
    if ignore_eos:
        notes.append(f"ignore_eos: the {len(masked)} end-of-generation ids have a -inf logit "
                     "bias (never sampled)")
    return PeerResult(tokens=tokens, seconds=seconds, target_calls=calls,
                      target_positions=positions - (len(prompt) - 1), notes=notes,
                      prefill_seconds=None if first is None else first - start, first_tokens=1,
                      masked_tokens=tuple(masked), threads=threads)


def forward_ms(gguf: str | os.PathLike[str], *, context: int = 200, batch: int = 1,
               repeats: int = 20, threads: int | None = None, flash_attn: bool = True,
               seed: int = 0) -> list[float]:
    """Milliseconds of each of ``repeats`` target calls scoring ``batch`` new positions after a
    ``context``-token prefix (the prefix is evaluated once; each call is rolled back). The
    ids are random non-special tokens; one untimed call warms up first."""
    llm = load_gguf(gguf, threads=threads, n_ctx=context + batch, flash_attn=flash_attn)
    rng = random.Random(seed)
    n_plain = min(llm.n_vocab(), 151643)
    prefix = [rng.randrange(n_plain) for _ in range(context)]
    new = [rng.randrange(n_plain) for _ in range(batch)]
    llm.reset()
    llm.eval(prefix)
    times = []
    for i in range(repeats + 1):
        llm.n_tokens = context  # the next eval drops the KV entries past the prefix
        start = time.perf_counter()
        llm.eval(new)
        if i:
            times.append((time.perf_counter() - start) * 1e3)
    return times
