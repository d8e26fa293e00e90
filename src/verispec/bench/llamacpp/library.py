"""llama-cpp-python for the llama.cpp peers: whether it is installed (and how to install
it), GGUF models loaded once per process, and ``llamacpp-ar``, llama.cpp's plain decoding
(see :mod:`verispec.bench.llamacpp` for the peers' conventions)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from verispec.bench.peers import PeerResult

__all__ = [
    "DEFAULT_EOS",
    "INSTALL_COMMAND",
    "INSTALL_COMMAND_PLAIN",
    "LLAMA_CPP_PYTHON_VERSION",
    "PEERS",
    "LlamaCppUnavailableError",
    "clear_cache",
    "default_threads",
    "forward_ms",
    "llamacpp_available",
    "load_gguf",
    "run_ar",
]

PEERS = ("llamacpp-ar", "llamacpp-spec")

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
"""The version pinned by verispec's ``peers`` extra (also the source of the example build)."""

DEFAULT_EOS = (151645, 151643)
"""EOS ids of the embedded target (``<|im_end|>``, ``<|endoftext|>``); pass the target's
``eos_token_ids``."""

PIP_CMAKE_FLAGS = (
    "-DGGML_NATIVE=ON",
    "-DLLAVA_BUILD=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_OPENSSL=OFF",
)

INSTALL_COMMAND = (
    f'CMAKE_ARGS="{" ".join(PIP_CMAKE_FLAGS)}" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) '
    "pip install --no-cache-dir -e '.[peers]'"
)
"""Install command from a verispec checkout (the ``peers`` extra pins llama-cpp-python)."""

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


# --------------------------------------------------------------------------- loaded models

_MODELS: dict[tuple[str, int, bool], Any] = {}
_VOCABS: dict[str, Any] = {}


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


def clear_cache() -> None:
    """Free every model loaded by this module."""
    for cache in (_MODELS, _VOCABS):
        for llm in cache.values():
            with contextlib.suppress(Exception):
                llm.close()
        cache.clear()


# --------------------------------------------------------------------------- llamacpp-ar


@contextlib.contextmanager
def _sampler(llama_cpp: Any, temperature: float, seed: int) -> Iterator[Any]:
    """llama.cpp sampler chain: greedy at T = 0, else temp(T) then dist(seed), nothing else."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    try:
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
            flash_attn: bool) -> PeerResult:
    llama_cpp = _llama_cpp()
    llm = load_gguf(gguf, threads=threads, n_ctx=len(prompt) + max_new_tokens,
                    flash_attn=flash_attn)
    eos_set = {int(t) for t in eos}
    tokens: list[int] = []
    calls = positions = 0
    with _sampler(llama_cpp, temperature, seed) as chain:
        llm.reset()
        start = time.perf_counter()
        llm.eval(prompt)
        calls += 1
        positions += len(prompt)
        while True:
            token = int(llama_cpp.llama_sampler_sample(chain, llm.ctx, -1))
            tokens.append(token)
            if token in eos_set or len(tokens) >= max_new_tokens:
                break
            llm.eval([token])
            calls += 1
            positions += 1
        seconds = time.perf_counter() - start
    return PeerResult(tokens=tokens, seconds=seconds, target_calls=calls,
                      target_positions=positions - (len(prompt) - 1),
                      notes=[f"llama.cpp plain decoding of {Path(gguf).name} ("
                             f"{threads or default_threads()} threads, flash attention "
                             f"{'on' if flash_attn else 'off'})"])


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
