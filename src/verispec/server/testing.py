"""Test doubles shipped with the server: a toy model pair any process can build by name.

``verispec serve --model-factory verispec.server.testing:toy_pair`` (and the Ray Serve
deployment, whose replicas build their own models and cannot import a test directory)
serves exact float64 toy tables with a chat template, an end-of-text token and a 64-token
context window, so every response can be compared token for token with another server or
with offline :func:`verispec.generate`.

Processes share a *control directory* (``control_dir``): a file ``delay`` in it holds the
seconds every target forward pass sleeps, and while a file ``gate`` exists every forward
pass waits (at most :data:`GATE_TIMEOUT_S`), so a test can slow down or hold the replicas
of a running cluster without reaching into their processes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from verispec.models.toy import RandomContextLM, ToyTokenizer

__all__ = ["EOS", "GATE_TIMEOUT_S", "MODEL", "VOCAB", "WINDOW", "ChatToyTokenizer",
           "ControlledLM", "set_delay", "set_gate", "toy_pair"]

VOCAB, EOS, WINDOW = 12, 11, 64
MODEL = "toy-target"
#: The longest a closed gate holds a forward pass (seconds).
GATE_TIMEOUT_S = 60.0


class ChatToyTokenizer(ToyTokenizer):
    """Letters, plus a chat template: a role letter before each message, D to answer."""

    chat_template = "toy"

    def apply_chat_template(self, messages: Sequence[dict[str, str]], tokenize: bool = False,
                            add_generation_prompt: bool = False) -> str:
        roles = {"system": "A", "developer": "A", "user": "B", "assistant": "C"}
        text = "".join(roles[m["role"]] + m["content"] for m in messages)
        return text + ("D" if add_generation_prompt else "")


class ControlledLM(RandomContextLM):
    """A toy table whose forward passes sleep ``delay`` seconds (or the control directory's
    ``delay`` file) and wait while the control directory holds a ``gate`` file."""

    def __init__(self, *args: Any, delay: float = 0.0, control_dir: str | None = None,
                 **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.delay = delay
        self.control_dir = Path(control_dir) if control_dir else None

    def _current_delay(self) -> float:
        if self.control_dir is None:
            return self.delay
        try:
            return float((self.control_dir / "delay").read_text().strip() or 0.0)
        except (FileNotFoundError, ValueError):
            return self.delay

    def _wait_for_gate(self) -> None:
        if self.control_dir is None:
            return
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while (self.control_dir / "gate").exists() and time.monotonic() < deadline:
            time.sleep(0.01)

    def _extend(self, tokens: list[list[int]], num_logits: int) -> torch.Tensor:
        self._wait_for_gate()
        delay = self._current_delay()
        if delay > 0:
            time.sleep(delay)
        return super()._extend(tokens, num_logits)  # [R, n, V] log-probabilities


def toy_pair(delay: float = 0.0, control_dir: str | None = None,
             eos: bool = True) -> tuple[ControlledLM, ControlledLM]:
    """Target and draft: one random table at two sharpnesses (so drafts get accepted), an
    end-of-text token :data:`EOS` (``eos=False``: none, every request runs to its budget),
    a 64-token window and a chat template; the target is served as :data:`MODEL`. Fresh
    pairs have identical tables. The draft sleeps a quarter of the target's delay."""
    if delay < 0:
        raise ValueError(f"delay must be >= 0, got {delay}")
    target = ControlledLM(VOCAB, 1, sharpness=2.0, eos_token_id=EOS if eos else None,
                          max_length=WINDOW, delay=delay, control_dir=control_dir)
    target.name, target.tokenizer = MODEL, ChatToyTokenizer(VOCAB)
    draft = ControlledLM(VOCAB, 1, sharpness=1.5, max_length=WINDOW, delay=delay / 4)
    return target, draft


def set_delay(control_dir: str | Path, seconds: float) -> None:
    """Make every target forward pass of the pairs using ``control_dir`` sleep ``seconds``."""
    Path(control_dir, "delay").write_text(f"{seconds}\n")


def set_gate(control_dir: str | Path, closed: bool) -> None:
    """Close (hold every target forward pass) or open the gate of ``control_dir``."""
    gate = Path(control_dir, "gate")
    if closed:
        gate.touch()
    else:
        gate.unlink(missing_ok=True)
