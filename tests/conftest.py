"""Shared fixtures: tiny in-process Hugging Face models and small helpers (no downloads).

The tiny model is a randomly initialised ``Qwen2ForCausalLM`` (vocab 64, hidden 32, 2 layers,
float32, seeded) wrapped in :class:`verispec.models.hf.HFCausalLM` with a minimal tokenizer
stand-in. ``initializer_range`` is raised to 0.3 so that next-token distributions are far
from uniform and greedy argmax gaps (~1e-2) dwarf float32 noise (~1e-6).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
import torch

from verispec.models.hf import HFCausalLM

__all__ = ["TinyTokenizer", "make_tiny_model", "wait_for", "wrap_tiny"]

TINY_VOCAB = 64


def wait_for(condition: Callable[[], bool], timeout: float = 30.0, what: str = "",
             poll: float = 0.02) -> None:
    """Poll ``condition`` every ``poll`` seconds; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(poll)


class TinyTokenizer:
    """Token i <-> the string ``f"{prefix}{i}"``; enough for ``check_compatible`` and decoding."""

    eos_token_id: int | None = None

    def __init__(self, vocab_size: int = TINY_VOCAB, prefix: str = "t") -> None:
        self.vocab_size = vocab_size
        self.prefix = prefix

    def get_vocab(self) -> dict[str, int]:
        return {f"{self.prefix}{i}": i for i in range(self.vocab_size)}

    def encode(self, text: str) -> list[int]:
        return [int(piece[len(self.prefix):]) for piece in text.split()]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(f"{self.prefix}{int(i)}" for i in ids)


def make_tiny_model(seed: int, vocab_size: int = TINY_VOCAB, max_positions: int = 256,
                    hidden_size: int = 32) -> Any:
    """A seeded, randomly initialised float32 ``Qwen2ForCausalLM`` (eval mode); its MLP is
    twice ``hidden_size`` wide (64 fits verispec's int4 kernel, whose groups are 64 wide)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        initializer_range=0.3,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.float().eval()


def perturbed_copy(model: Any, seed: int, scale: float) -> Any:
    """A model with the same architecture whose weights are ``w + scale * std(w) * noise``."""
    import copy

    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in other.parameters():
            noise = torch.randn(param.shape, generator=g, dtype=param.dtype)
            param.add_(scale * float(param.std()) * noise if param.numel() > 1 else 0 * noise)
    return other


def wrap_tiny(model: Any, name: str = "tiny", tokenizer: Any | None = None) -> HFCausalLM:
    """A fresh :class:`HFCausalLM` (empty cache) around an already built module."""
    return HFCausalLM(model, tokenizer or TinyTokenizer(int(model.config.vocab_size)), name=name)


@pytest.fixture(scope="session")
def tiny_modules() -> dict[str, Any]:
    """Built once per session: a target, a different random model, and a close variant."""
    target = make_tiny_model(seed=0)
    return {
        "target": target,
        "other": make_tiny_model(seed=1),
        "close": perturbed_copy(target, seed=2, scale=0.15),
    }


@pytest.fixture
def tiny(tiny_modules: dict[str, Any]) -> Callable[[str], HFCausalLM]:
    """``tiny("target" | "other" | "close")`` -> a fresh wrapper with an empty cache."""

    def get(kind: str) -> HFCausalLM:
        return wrap_tiny(tiny_modules[kind], name=f"tiny-{kind}")

    return get


@pytest.fixture
def tiny_foreign_tokenizer(tiny_modules: dict[str, Any]) -> HFCausalLM:
    """The "other" model with a tokenizer whose vocabulary differs (same vocab size)."""
    return wrap_tiny(tiny_modules["other"], "tiny-foreign", TinyTokenizer(prefix="u"))


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Tiny tensors: torch's intra-op threads only add contention (10x slower on 2 cores)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
