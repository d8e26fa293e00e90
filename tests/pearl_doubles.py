"""Test doubles for PEARL's worker processes (picklable, importable in a spawned worker).

:class:`DelayedLM` wraps any :class:`~verispec.models.base.CausalLM` (a toy table model in
the tests) and sleeps a fixed time before every forward pass, so a toy pair can have a known
speed ratio c and the two workers really overlap in time (sleeping uses no CPU). It can also
raise after a given number of forward passes, to test how a failing worker is shut down.

The workers are started with the ``spawn`` method, which hands this process's ``sys.path``
to the children: under pytest the tests directory is on it, so ``import pearl_doubles``
works in a worker as it does here.
"""

from __future__ import annotations

import os
import time

from torch import Tensor

from verispec.models.base import CausalLM

__all__ = ["DelayedLM", "InjectedFailure"]


class InjectedFailure(RuntimeError):
    """Raised by :class:`DelayedLM` after ``fail_after`` forward passes."""


class DelayedLM(CausalLM):
    """``inner`` with ``delay_s`` seconds of latency per forward pass (prefills included).

    Args:
        inner: the model that computes the logits (its rows are this model's rows).
        delay_s: sleep before every forward pass.
        fail_after: raise :class:`InjectedFailure` on forward pass number fail_after + 1
            (None: never).
        started: a file created at the first forward pass (a test waits for it instead of
            for a fixed time that a busy machine can exceed).
    """

    def __init__(self, inner: CausalLM, delay_s: float = 0.0,
                 fail_after: int | None = None, started: str | None = None) -> None:
        super().__init__()
        self.started = started
        self.inner = inner
        self.delay_s = delay_s
        self.fail_after = fail_after
        self.vocab_size = inner.vocab_size
        self.eos_token_ids = inner.eos_token_ids
        self.max_length = inner.max_length
        self.device = inner.device
        self.name = f"delayed-{inner.name}"
        self.tokenizer = getattr(inner, "tokenizer", None)
        self.precision = inner.precision

    def _forward(self) -> None:
        """What happens before every forward pass (``forward_calls`` already counts it)."""
        if self.started is not None and not os.path.exists(self.started):
            open(self.started, "w").close()
        if self.fail_after is not None and self.forward_calls > self.fail_after:
            raise InjectedFailure(
                f"{self.name}: injected failure on forward pass {self.forward_calls}")
        if self.delay_s > 0:
            time.sleep(self.delay_s)

    @property
    def lengths(self) -> list[int]:
        return self.inner.lengths

    def reset(self) -> None:
        self.inner.reset()

    def spawn(self) -> DelayedLM:
        return DelayedLM(self.inner.spawn(), self.delay_s, self.fail_after)

    def _add_rows(self, prefixes: list[list[int]]) -> None:
        if any(prefixes):  # a prefill is a forward pass
            self.forward_calls += 1
            self._forward()
        self.inner._add_rows(prefixes)

    def _extend(self, tokens: list[list[int]], num_logits: int) -> Tensor:
        self._forward()
        return self.inner._extend(tokens, num_logits)

    def _rollback(self, lengths: list[int]) -> None:
        self.inner._rollback(lengths)

    def _select_rows(self, indices: list[int]) -> None:
        self.inner._select_rows(indices)
