"""Cost of one forward pass as a function of the tokens it scores."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch

from verispec.models.base import CausalLM

__all__ = ["pass_costs", "prefill_cost"]


def pass_costs(model: CausalLM, context: int = 200, ks: Sequence[int] = tuple(range(1, 10)),
               reps: int = 5, *, warmup: int = 1, seed: int = 0) -> dict[int, float]:
    """Median seconds of one ``extend`` of k tokens (one row) after ``context`` tokens.

    Runs on ``model.spawn()`` (the caller's rows are untouched) with random token ids; each
    pass is rolled back before the next. The ks are interleaved within each repetition, so
    slow phases of a busy machine spread over all of them. V(k) = cost(k) / cost(1).
    """
    twin = model.spawn()
    g = torch.Generator().manual_seed(seed)
    vocab = model.vocab_size
    prefix = torch.randint(vocab, (context,), generator=g).tolist()
    twin.add_rows([prefix])
    times: dict[int, list[float]] = {k: [] for k in ks}
    for rep in range(warmup + reps):
        for k in ks:
            new = torch.randint(vocab, (k,), generator=g).tolist()
            start = time.perf_counter()
            logits = twin.extend([new])
            if logits.device.type == "cuda":
                torch.cuda.synchronize(logits.device)
            elapsed = time.perf_counter() - start
            twin.rollback(context)
            if rep >= warmup:
                times[k].append(elapsed)
    return {k: statistics.median(v) for k, v in times.items()}


def prefill_cost(model: CausalLM, context: int = 200, reps: int = 3, *, seed: int = 0) -> float:
    """Median seconds of reading a prompt of ``context`` random tokens into a fresh row (on
    ``model.spawn()``), after one untimed reading."""
    g = torch.Generator().manual_seed(seed)
    times = []
    for rep in range(1 + reps):
        twin = model.spawn()
        prefix = torch.randint(model.vocab_size, (context,), generator=g).tolist()
        start = time.perf_counter()
        twin.add_rows([prefix])
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        if rep:
            times.append(time.perf_counter() - start)
    return statistics.median(times)
