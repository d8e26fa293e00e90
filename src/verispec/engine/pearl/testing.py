"""Test doubles for PEARL's worker processes (picklable, importable in a spawned worker).

:class:`DelayedLM` wraps any :class:`~verispec.models.base.CausalLM` (a toy table model in
the tests) and sleeps a fixed time before every forward pass, so a toy pair can have a known
speed ratio c and the two workers really overlap in time (sleeping uses no CPU). It can also
raise after a given number of forward passes, to test how a failing worker is shut down.
"""

from __future__ import annotations

import time

from torch import Tensor

from verispec.models.base import CausalLM

__all__ = ["DelayedLM", "InjectedFailure"]


class InjectedFailure(RuntimeError):
    """Raised by :class:`DelayedLM` after ``fail_after`` forward passes."""


class DelayedLM(CausalLM):
    """``inner`` with ``delay_s`` seconds of latency per forward pass.

    Args:
        inner: the model that computes the logits.
        delay_s: sleep before every forward pass.
        fail_after: raise :class:`InjectedFailure` on forward pass number fail_after + 1
            (None: never).
    """

    def __init__(self, inner: CausalLM, delay_s: float = 0.0, fail_after: int | None = None) -> None:
        super().__init__()
        self.inner = inner
        self.delay_s = delay_s
        self.fail_after = fail_after
        self.vocab_size = inner.vocab_size
        self.eos_token_ids = inner.eos_token_ids
        self.max_length = inner.max_length
        self.device = inner.device
        self.name = f"delayed-{inner.name}"
        self.tokenizer = getattr(inner, "tokenizer", None)

    @property
    def length(self) -> int:
        return self.inner.length

    @property
    def rows(self) -> int:
        return self.inner.rows

    def _extend(self, tokens: Tensor, num_logits: int) -> Tensor:
        if self.fail_after is not None and self.forward_calls > self.fail_after:
            raise InjectedFailure(f"{self.name}: injected failure on forward pass {self.forward_calls}")
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        return self.inner._extend(tokens, num_logits)

    def rollback(self, length: int) -> None:
        self.inner.rollback(length)

    def fork(self, num_branches: int) -> None:
        self.inner.fork(num_branches)

    def join(self, branch: int, length: int) -> None:
        self.inner.join(branch, length)

    def reset(self) -> None:
        self.inner.reset()
